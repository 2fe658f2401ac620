"""Rebuilding an open ledger's WAL from its WAL objects (source/ledger/object_wal.py).

A ledger written with the WAL on object storage (`LedgerInfo.wal_objects`) is what its
commits in etcd say, whatever its previous owner's local copy holds (that copy was never
fsynced, and may hold frames that were never committed, or be on a machine that is gone).
A new owner, or the same broker reloading the topic, calls `restore` before it recovers the
ledger: it reads the ledger's `WalCommit`s in entry order, fetches each one's byte range of
its object, and writes a local WAL (source/ledger/wal.py) of exactly those frames to a
temporary file that it fsyncs and renames over the ledger's local WAL path. The usual
recovery then reads that file (each frame's CRC checked, the numbering checked, the
producers' sequence ids replayed for idempotent producing) and seals it.

Commits must follow on from each other (entry ids contiguous from 0); the first one that
does not, or a range that cannot be read, ends what is restored, loudly: nothing after it
can be part of the ledger.

`drop_stale` deletes the commits of a topic's ledgers that are no longer open (a crash
between a seal and the deletion of its commits), so they stop naming their objects, when the
topic loads; `drop_stale_everywhere` does the same for every topic with commits, loaded or
not (a deleted topic's, a commit that landed while its topic was being deleted), in each
broker's maintenance pass.
"""
from __future__ import annotations

import asyncio
import logging
import os
import urllib.parse
from collections.abc import Callable
from concurrent.futures import Executor

import pyarrow.fs as pafs

from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import object_store
from shadowtopic.ledger import wal as walmod
from shadowtopic.ledger.object_wal import ObjectWal
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import MetadataStore, MetadataUnavailable
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

log = logging.getLogger(__name__)

#: opens an object's URI: (filesystem, path in it)
ObjectOpener = Callable[[str], tuple[pafs.FileSystem, str]]


def opener(s3: object_store.S3Options) -> ObjectOpener:
    """Opens `s3://bucket/key` with the broker's S3 options (any other URI by pyarrow), one
    filesystem per bucket."""
    cache: dict[str, pafs.FileSystem] = {}

    def open_uri(uri: str) -> tuple[pafs.FileSystem, str]:
        u = urllib.parse.urlsplit(uri)
        if u.scheme in ("", "file"):
            return cache.setdefault("file", pafs.LocalFileSystem()), u.path
        if u.scheme != "s3":
            fs, path = pafs.FileSystem.from_uri(uri)
            return fs, str(path)
        root = f"s3://{u.netloc}"
        if root not in cache:
            cache[root] = object_store.open_root(root, s3)[0]
        return cache[root], u.netloc + u.path
    return open_uri


async def commits_of(store: MetadataStore, topic: TopicName, ledger_id: int
                     ) -> list[mpb.WalCommit]:
    """A ledger's commits, in entry order."""
    try:
        snap = await store.get_prefix(keys.wal_commits_of_ledger(topic, ledger_id))
    except MetadataUnavailable as exc:
        raise errors.MetadataUnavailable(f"{topic}: reading ledger {ledger_id}'s WAL "
                                         f"commits: {exc}") from None
    out = [mpb.WalCommit.FromString(kv.value) for kv in snap.items]
    out.sort(key=lambda c: c.first_entry_id)
    return out


async def restore(store: MetadataStore, open_object: ObjectOpener, executor: Executor,
                  topic: TopicName, ledger_id: int, path: str) -> int:
    """Write the local WAL at `path` from the ledger's commits (module docstring); returns
    the number of entries restored."""
    commits = await commits_of(store, topic, ledger_id)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor, _write, open_object, topic, ledger_id,
                                      commits, path)


def _write(open_object: ObjectOpener, topic: TopicName, ledger_id: int,
           commits: list[mpb.WalCommit], path: str) -> int:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".restore"
    expected = 0
    with open(tmp, "wb") as out:
        out.write(walmod.encode_header(ledger_id))
        for c in commits:
            if c.first_entry_id != expected:
                log.error("%s: ledger %d: WAL commit at entry %d does not follow entry %d; "
                          "the ledger ends there", topic, ledger_id, c.first_entry_id,
                          expected - 1)
                break
            fs, obj = open_object(c.object)
            try:
                with fs.open_input_file(obj) as f:
                    data = f.read_at(c.length, c.offset)
            except OSError as exc:
                raise errors.ServiceUnavailable(
                    f"{topic}: ledger {ledger_id}: cannot read WAL object {c.object}: "
                    f"{' '.join(str(exc).split())}") from None
            if len(data) != c.length:
                raise errors.DataLoss(f"{topic}: ledger {ledger_id}: WAL object {c.object} "
                                      f"is shorter than its commit says")
            out.write(data)
            expected += c.count
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    walmod.fsync_dir(os.path.dirname(path))
    return expected


async def _ledgers_with_commits(store: MetadataStore, prefix: str
                                ) -> dict[str, set[int]]:
    """Under `prefix` (of `keys.WAL_COMMITS_PREFIX`): topic path -> the ledgers with commits,
    read one key per ledger (skipping past each ledger's commits, however many); keys that
    are not commit keys are stepped over."""
    found: dict[str, set[int]] = {}
    base = keys.WAL_COMMITS_PREFIX
    after = ""
    for _ in range(10_000_000):  # bounded: one read per ledger (or stray key)
        batch = await store.get_keys(prefix, after=after, limit=1)
        if not batch:
            break
        parts = batch[0][len(base):].split("/")
        if len(parts) != 6 or not parts[4].isdigit():  # persistent/t/ns/topic/ledger/first
            after = batch[0]
            continue
        path = "/".join(parts[:4])
        found.setdefault(path, set()).add(int(parts[4]))
        after = f"{base}{path}/{parts[4]}/~"
    return found


async def drop_stale(store: MetadataStore, topic: TopicName, open_ids: set[int]) -> int:
    """Delete the commits of the topic's ledgers not in `open_ids`; returns how many
    ledgers'."""
    found = await _ledgers_with_commits(store, keys.wal_commits_prefix(topic))
    stale = sorted(found.get(topic.path, set()) - open_ids)
    for lid in stale:
        await store.delete(keys.wal_commits_of_ledger(topic, lid), prefix=True)
    return len(stale)


async def drop_stale_everywhere(store: MetadataStore) -> int:
    """Delete the commits of every ledger that its topic's ledger list no longer holds
    open (sealed, trimmed, or the topic deleted: no list); returns how many ledgers'. The
    commits are read before the lists: a ledger is in its list as OPEN before its first
    commit, and never open again once it left, so nothing still needed is deleted."""
    dropped = 0
    for path, ledgers in (await _ledgers_with_commits(store, keys.WAL_COMMITS_PREFIX)).items():
        _kind, tenant, namespace, local = path.split("/")
        topic = TopicName(tenant, namespace, local)
        kv = await store.get(keys.ledgers(topic))
        lst = mpb.LedgerList.FromString(kv.value) if kv is not None else mpb.LedgerList()
        open_ids = {i.ledger_id for i in lst.ledgers if i.state == mpb.LedgerState.OPEN}
        for lid in sorted(ledgers - open_ids):
            await store.delete(keys.wal_commits_of_ledger(topic, lid), prefix=True)
            dropped += 1
    return dropped


class TopicWalObjects:
    """What a topic's sealer (source/ledger/sealing.py) does with WAL objects: rebuild an
    open ledger's local WAL before recovering it, release a ledger once it is sealed or gone
    (its commits, and the objects of this broker that nothing else needs), and drop the
    commits of ledgers no longer open. `wal` is this broker's `ObjectWal`, or None when its
    WAL is local (it still restores and releases ledgers another broker wrote so)."""

    def __init__(self, store: MetadataStore, topic: TopicName, open_object: ObjectOpener,
                 executor: Executor, wal: ObjectWal | None):
        self._store = store
        self._topic = topic
        self._open = open_object
        self._executor = executor
        self._wal = wal

    async def restore(self, ledger_id: int, path: str) -> int:
        n = await restore(self._store, self._open, self._executor, self._topic, ledger_id,
                          path)
        log.info("%s: ledger %d: %d entries restored from WAL objects", self._topic,
                 ledger_id, n)
        return n

    async def release(self, ledger_id: int) -> None:
        """Never raises: commits left behind are dropped by the topic's next load."""
        try:
            if self._wal is not None:
                await self._wal.release(self._topic, ledger_id)
            else:
                await self._store.delete(keys.wal_commits_of_ledger(self._topic, ledger_id),
                                         prefix=True)
        except MetadataUnavailable as exc:
            log.warning("%s: ledger %d: WAL commits stay until the topic's next load: %s",
                        self._topic, ledger_id, exc)

    async def drop_stale(self, open_ids: set[int]) -> None:
        try:
            n = await drop_stale(self._store, self._topic, open_ids)
        except MetadataUnavailable as exc:
            log.warning("%s: stale WAL commits stay: %s", self._topic, exc)
            return
        if n:
            log.info("%s: dropped the WAL commits of %d sealed ledgers", self._topic, n)
