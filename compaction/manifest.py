"""The manifest of one compaction's output: begun from its plan (what it reads, up to which
id), finished from the files it wrote (counts, sizes), then written last and durably, so a
compacted ledger without its manifest is never read. The layout is
compaction/ledger.py's; the Spark job and the reference implementation both use this.
"""
from __future__ import annotations

import time

from shadowtopic.compaction.ledger import write_manifest
from shadowtopic.compaction.plan import Plan
from shadowtopic.ledger.storage import Storage
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb


def new_manifest(plan: Plan) -> mpb.CompactedManifest:
    m = mpb.CompactedManifest(job_id=plan.job_id, topic=str(plan.topic),
                              input_ledgers=[info.ledger_id for info in plan.ledgers],
                              input_bytes=plan.input_bytes,
                              previous_job_id=plan.previous.job_id if plan.previous else "",
                              retain_null_key=plan.retain_null_key,
                              tombstone_cutoff_ms=plan.tombstone_cutoff_ms or 0,
                              created_ms=int(time.time() * 1000))
    if plan.horizon is not None:
        m.horizon.CopyFrom(plan.horizon.to_pb())
    return m


def finish_manifest(m: mpb.CompactedManifest, storage: Storage, out_dir_rel: str,
                    input_entries: int, keys: int, tombstones: int = 0) -> None:
    """Counts from the written files, then the manifest written (last, durably). `keys`:
    the live keys (a key whose kept message is a tombstone is not one); `tombstones`: the
    tombstones kept (compaction/plan.py), counted in `entries`."""
    m.input_entries = input_entries
    m.keys = keys
    m.tombstones = tombstones
    m.entries = sum(f.rows for f in m.files)
    m.output_bytes = sum(f.size_bytes for f in m.files)
    write_manifest(storage, out_dir_rel, m)
