"""Publishing a compaction, and collecting what no pointer names.

`publish` is the job's one metadata write that readers see: a transaction that compares the
topic's `CompactionPointer` (keys.compaction) with the mod revision the job planned from
(absent: 0) and the request with the one the job ran for, and then puts the new pointer,
puts the job record (DONE) and deletes the request. A reader therefore sees the old
compacted view or the new one, never a mix (K16); a job whose pointer moved meanwhile
fails and leaves the pointer alone.

The compacted ledger a pointer replaced is deleted only afterwards, after `grace` seconds
(readers that opened it finish their reads), by `collect` (with the worker's Iceberg tables
on, after every snapshot that refers to its files expired: compaction/tables.py): under
`<root>/compacted/<topic-dir>/` it deletes every job directory that is neither named by the
current pointer nor being written, once it is older than the grace period. Output of a
job killed half-way (a worker or Spark crash) is collected the same way (or replaced when
the job reruns under its id).
"""
from __future__ import annotations

import logging
import time

import pyarrow.fs as pafs

from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import Compare, Delete, MetadataStore, Put, keys
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

log = logging.getLogger(__name__)


def pointer_for(manifest: mpb.CompactedManifest, manifest_path: str) -> mpb.CompactionPointer:
    return mpb.CompactionPointer(manifest_path=manifest_path, horizon=manifest.horizon,
                                 job_id=manifest.job_id, published_ms=int(time.time() * 1000),
                                 manifest=manifest)


async def publish(store: MetadataStore, topic: TopicName, pointer: mpb.CompactionPointer,
                  prev_revision: int, req_key: str, request: bytes, job: mpb.CompactionJob
                  ) -> None:
    """Make `pointer` the topic's compacted view (one transaction; see the module doc):
    only if the pointer is still at `prev_revision` and the request at `req_key` is still
    `request`."""
    res = await store.txn(
        [Compare(keys.compaction(topic), "mod_revision", "==", prev_revision),
         Compare(req_key, "value", "==", request)],
        [Put(keys.compaction(topic), pointer.SerializeToString()),
         Put(keys.compaction_job(topic, job.job_id), job.SerializeToString()),
         Delete(req_key)])
    if not res.succeeded:
        raise errors.CompactionInProgress(
            f"{topic}: the compaction pointer or request changed while job {job.job_id} ran")


async def finish(store: MetadataStore, topic: TopicName, req_key: str, request: bytes,
                 job: mpb.CompactionJob) -> None:
    """End a job that publishes nothing (failed, or nothing to compact): its record, and the
    request deleted (only if it is still the one the job ran for)."""
    await store.txn([Compare(req_key, "value", "==", request)],
                    [Put(keys.compaction_job(topic, job.job_id), job.SerializeToString()),
                     Delete(req_key)])


def collectable(storage: Storage, topic: TopicName, keep: set[str], grace: float
                ) -> list[str]:
    """The topic's compacted-ledger directories not in `keep` (storage-relative paths)
    that are older than `grace` seconds: what `collect` deletes."""
    root = Storage.topic_compacted_dir(topic)
    out = []
    now = time.time()
    for rel in storage.list_subdirs(root):
        if rel in keep:
            continue
        info = storage.fs.get_file_info(storage.full(rel))
        if info.type != pafs.FileType.Directory:
            continue
        if info.mtime is not None and now - info.mtime.timestamp() < grace:
            continue
        out.append(rel)
    return out


def collect(storage: Storage, topic: TopicName, keep: set[str], grace: float,
            rels: list[str] | None = None) -> list[str]:
    """Delete the topic's compacted-ledger directories not in `keep` (storage-relative
    paths) that are older than `grace` seconds (`rels`: those, as `collectable` found
    them); returns what was deleted."""
    deleted = []
    for rel in collectable(storage, topic, keep, grace) if rels is None else rels:
        if rel in keep:
            continue
        storage.delete_dir(rel)
        deleted.append(rel)
        log.info("%s: collected compacted ledger %s", topic, rel)
    return deleted
