"""The reference implementation of compaction semantics (PIP-14), in plain Python: the oracle
the Spark job and the compacted read path are tested against.

Over all input rows in id order, the latest row of each key wins; a key whose latest row is
a tombstone (empty payload) is deleted: the tombstone is written when it was published at or
after the job's tombstone cutoff (compaction/plan.py: the request time minus the topic's
`delete_retention_seconds`; a cutoff of None keeps none), else nothing of the key is; keyless
rows pass through in place when `retain_null_key`, else they are dropped. Survivors keep
their ids, their order and their bytes as sent (`raw`: rebuilt from the columns of either
format, source/columns.py); the output is written in format 2.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from shadowtopic import columns
from shadowtopic.compaction.ledger import describe_file
from shadowtopic.compaction.manifest import finish_manifest, new_manifest
from shadowtopic.compaction.plan import Plan, keeps_tombstone
from shadowtopic.core import errors
from shadowtopic.ledger.storage import Storage
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb


class Row(NamedTuple):
    ledger_id: int
    entry_id: int
    key: bytes | None
    is_tombstone: bool
    publish_time: int
    raw: bytes


def compact(rows: Iterable[Row], retain_null_key: bool,
            tombstone_cutoff_ms: int | None = None) -> list[Row]:
    ordered = sorted(rows, key=lambda r: (r.ledger_id, r.entry_id))
    latest: dict[bytes, Row] = {}
    for r in ordered:
        if r.key is not None:
            latest[r.key] = r
    live = {(r.ledger_id, r.entry_id) for r in latest.values()
            if not r.is_tombstone or keeps_tombstone(r.publish_time, tombstone_cutoff_ms)}
    return [r for r in ordered
            if (r.key is None and retain_null_key) or (r.ledger_id, r.entry_id) in live]


def live_keys(rows: Iterable[Row]) -> int:
    """Distinct keys of `rows` whose row is not a tombstone (compacted rows: one per key)."""
    return len({r.key for r in rows if r.key is not None and not r.is_tombstone})


def kept_tombstones(rows: Iterable[Row]) -> int:
    return sum(1 for r in rows if r.key is not None and r.is_tombstone)


def read_rows(storage: Storage, rel_paths: list[str]) -> list[Row]:
    out: list[Row] = []
    for rel in rel_paths:
        t = pq.read_table(storage.full(rel), filesystem=storage.fs)
        cols = [t.column(name).to_pylist() for name in columns.KEY_COLUMNS]
        cols.append(columns.raws(t).to_pylist())
        out.extend(Row(*values) for values in zip(*cols, strict=True))
    return out


def run(plan: Plan, storage: Storage, out_dir_rel: str) -> mpb.CompactedManifest:
    """Compact `plan`'s input with `compact` and write it as the Spark job does (one file)."""
    rows = read_rows(storage, plan.input_files())
    survivors = compact(rows, plan.retain_null_key, plan.tombstone_cutoff_ms)
    storage.delete_dir(out_dir_rel)
    storage.fs.create_dir(storage.full(out_dir_rel), recursive=True)
    manifest = new_manifest(plan)
    if survivors:
        rel = f"{out_dir_rel}/part-00000.parquet"
        table = columns.upgrade(pa.table(
            [pa.array(list(c), t) for c, t in
             zip(zip(*survivors, strict=True), columns.SCHEMA_V1.types, strict=True)],
            schema=columns.SCHEMA_V1))
        pq.write_table(table, storage.full(rel), filesystem=storage.fs, compression="zstd")
        described = describe_file(storage, rel)
        if described is None:  # it was written with the survivors: it has rows
            raise errors.Internal(f"compaction {plan.job_id}: {rel} holds no rows")
        manifest.files.append(described)
    finish_manifest(manifest, storage, out_dir_rel, len(rows), live_keys(survivors),
                    kept_tombstones(survivors))
    return manifest
