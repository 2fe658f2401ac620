"""Migrations of the etcd key schema (docs/ARCHITECTURE.md, "Metadata in etcd").

`await migrate(store)` runs every migration that has not run to its end yet; a process that
reads or writes the keys a migration moves (the broker, the compaction worker) calls it
once at start-up, before it touches them. Each migration marks its end under
`keys.migration(name)`, so once it has run a call reads one key per migration and nothing
else. Running it twice, or in several processes at once, is safe: every move is a
transaction comparing the mod revisions it read, so a record moved (or rewritten) by
someone else meanwhile is read again, never overwritten with an older value.

**compaction-job-keys.** The compaction job records moved from
`/shadowtopic/topics/<topic-path>/compaction/jobs/<id>` to `keys.compaction_job`
(`.../jobs/compaction/<id>`). Under the old name the compaction pointer
(`.../compaction`) was a prefix of them, so every progress write of a running job (every
0.5 s) woke every broker following that pointer. For each record still under the old name,
one transaction (with up to `BATCH` records of one topic) compares the old key's mod
revision and the new key's, deletes the old key and, unless the new key holds a newer
write (a process already on the new schema rewrote the record), puts the old value under
the new key. The marker is written by the pass that finds no old record left. A process
still on the old schema that writes an old key after that (a rolling upgrade) leaves a
record the new schema does not see: upgrade the compaction workers and brokers together.
"""
from __future__ import annotations

import logging
import re
import time

from shadowtopic.core.names import TopicName
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import Compare, Delete, KeyValue, MetadataStore, Put

log = logging.getLogger(__name__)

COMPACTION_JOB_KEYS = "compaction-job-keys"
#: job records moved by one transaction: 2 compares and at most 2 operations each, so a
#: transaction stays within 100 operations (etcd's default limit is 128)
BATCH = 50
PAGE = 1000  # keys per page when scanning the topics for old records
PASSES = 3  # scans before giving up for this start (old-schema processes still writing)
ATTEMPTS = 10  # transactions per topic that may lose a race before moving on

_OLD_JOB = re.compile(
    "^" + re.escape(keys.topics_prefix())
    + r"persistent/([^/]+)/([^/]+)/([^/]+)/compaction/jobs/(.+)$",
    re.DOTALL)


def old_compaction_job(topic: TopicName, job_id: str) -> str:
    """Where the record of a compaction job was before this migration."""
    return _old_jobs_prefix(topic) + job_id


def _old_jobs_prefix(topic: TopicName) -> str:
    return keys.compaction(topic) + "/jobs/"


async def migrate(store: MetadataStore) -> int:
    """Run the migrations that have not run to their end; return how many records this call
    moved (0 once they have run). Raises `MetadataUnavailable` when the store is."""
    return await _compaction_job_keys(store)


async def _compaction_job_keys(store: MetadataStore) -> int:
    marker = keys.migration(COMPACTION_JOB_KEYS)
    if await store.get(marker) is not None:
        return 0
    moved = 0
    for _ in range(PASSES):
        topics = await _topics_with_old_jobs(store)
        if not topics:
            await store.create(marker, f"moved {moved} records at {time.time():.0f}".encode())
            if moved:
                log.info("migration %s: moved %d compaction job records", COMPACTION_JOB_KEYS,
                         moved)
            return moved
        for topic in topics:
            moved += await _move_jobs(store, topic)
    log.warning("migration %s: compaction job records under the old keys keep appearing "
                "(a process on the old schema?); moved %d, trying again at the next start",
                COMPACTION_JOB_KEYS, moved)
    return moved


async def _topics_with_old_jobs(store: MetadataStore) -> list[TopicName]:
    """Every topic with a record under the old name (a keys-only scan, page by page)."""
    found: dict[TopicName, None] = {}
    after = ""
    while True:
        page = await store.get_keys(keys.topics_prefix(), after, PAGE)
        for key in page:
            m = _OLD_JOB.match(key)
            if m:
                found[TopicName(m[1], m[2], m[3])] = None
        if len(page) < PAGE:
            return list(found)
        after = page[-1]


async def _move_jobs(store: MetadataStore, topic: TopicName) -> int:
    """Move `topic`'s old records, `BATCH` per transaction; read again after a lost race."""
    moved = 0
    old_prefix = _old_jobs_prefix(topic)
    for _ in range(ATTEMPTS):
        old = (await store.get_prefix(old_prefix)).items
        if not old:
            return moved
        new = {kv.key: kv for kv in (await store.get_prefix(
            keys.compaction_jobs_prefix(topic))).items}
        lost = False
        for i in range(0, len(old), BATCH):
            batch = old[i:i + BATCH]
            compares: list[Compare] = []
            ops: list[Put | Delete] = []
            puts = 0
            for kv in batch:
                target = keys.compaction_job(topic, kv.key[len(old_prefix):])
                current: KeyValue | None = new.get(target)
                compares += [Compare(kv.key, "mod_revision", "==", kv.mod_revision),
                             Compare(target, "mod_revision", "==",
                                     current.mod_revision if current else 0)]
                ops.append(Delete(kv.key))
                if current is None or current.mod_revision < kv.mod_revision:
                    ops.append(Put(target, kv.value))  # the newest write of the record wins
                    puts += 1
            if (await store.txn(compares, ops)).succeeded:
                moved += puts
            else:
                lost = True  # someone moved or rewrote one of them: read again
        if not lost:
            return moved
    log.warning("migration %s: %s: records kept changing; trying again in the next pass",
                COMPACTION_JOB_KEYS, topic)
    return moved
