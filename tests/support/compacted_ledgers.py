"""Compacted ledgers written here per the format (compaction/ledger.py), for tests of their
readers: a topic over the in-memory ledger twin (`Topic`: a `MemoryView` and its messages as
`Row`s), an in-test PIP-14 reference (`pip14`: the latest value of each key at or before the
horizon, tombstones dropped, keyless messages kept or dropped), and `write_compacted` (format-1
rows, columns.SCHEMA_V1, sorted by id, any row-group size, one or more files, `describe_file` +
`write_manifest`). Nothing here uses the compaction job."""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from shadowtopic import columns
from shadowtopic.compaction.ledger import describe_file, write_manifest
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.memory_view import MemoryView
from shadowtopic.ledger.storage import Storage
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import common_pb2

TOPIC = TopicName.parse("persistent://t/ns/compacted-view")
BIG = 1 << 30


# ---- the topic, the reference, the writer -----------------------------------------------------

@dataclass(frozen=True)
class Row:
    ledger_id: int
    entry_id: int
    key: bytes | None
    payload: bytes
    publish_ms: int
    raw: bytes

    @property
    def id(self) -> tuple[int, int]:
        return (self.ledger_id, self.entry_id)


def message(key: str | None, payload: str) -> bytes:
    m = common_pb2.Message(payload=payload.encode())
    if key is not None:
        m.key = key.encode()
    return m.SerializeToString()


class Topic:
    """A raw view (MemoryView) and every message it holds, as `Row`s in id order."""

    def __init__(self):
        self.mem = MemoryView()
        self.rows: list[Row] = []

    def produce(self, items: list[tuple[str | None, str]]) -> list[tuple[int, int]]:
        raws = [message(k, p) for k, p in items]
        lid = self.mem.next_position().ledger_id
        base = self.mem.next_position().entry_id
        self.mem.append(raws)
        out = []
        for i, ((k, p), raw) in enumerate(zip(items, raws)):
            self.rows.append(Row(lid, base + i, k.encode() if k is not None else None,
                                 p.encode(), 1000 + len(self.rows), raw))
            out.append((lid, base + i))
        return out

    def roll(self) -> None:
        self.mem.roll()

    def last(self) -> tuple[int, int]:
        return self.rows[-1].id


def pip14(rows: list[Row], horizon: tuple[int, int], retain_null_key: bool = True) -> list[Row]:
    """The compacted ledger of `rows` up to `horizon` (PIP-14)."""
    latest = {r.key: r.id for r in rows if r.id <= horizon and r.key is not None}
    return [r for r in rows if r.id <= horizon and
            (retain_null_key if r.key is None else latest[r.key] == r.id and r.payload)]


def write_compacted(storage: Storage, job: str, rows: list[Row], horizon: tuple[int, int],
                    files: int = 1, group_rows: int = 3) -> mpb.CompactionPointer:
    """Write `rows` (already compacted, in id order) as job `job`'s compacted ledger: `files`
    Parquet files of row groups of `group_rows` rows, then its manifest; the pointer to it."""
    dir_rel = Storage.compacted_rel(TOPIC, job)
    manifest = mpb.CompactedManifest(job_id=job, topic=str(TOPIC), entries=len(rows),
                                     horizon=common_pb2.MessageIdData(ledger_id=horizon[0],
                                                                      entry_id=horizon[1]))
    per = -(-len(rows) // files) if rows else 0
    for i in range(files if rows else 0):
        part = rows[i * per:(i + 1) * per]
        if not part:
            continue
        table = pa.table({
            "ledger_id": pa.array([r.ledger_id for r in part], pa.int64()),
            "entry_id": pa.array([r.entry_id for r in part], pa.int64()),
            "key": pa.array([r.key for r in part], pa.binary()),
            "is_tombstone": pa.array([not r.payload for r in part], pa.bool_()),
            "publish_time": pa.array([r.publish_ms for r in part], pa.int64()),
            "raw": pa.array([r.raw for r in part], pa.binary()),
        }, schema=columns.SCHEMA_V1)  # format 1: it reads as format 2 does
        rel = f"{dir_rel}/part-{i:05d}.parquet"
        storage.fs.create_dir(storage.full(dir_rel), recursive=True)
        pq.write_table(table, storage.full(rel), row_group_size=group_rows,
                       write_page_checksum=True)
        manifest.files.append(describe_file(storage, rel))
    path = write_manifest(storage, dir_rel, manifest)
    return mpb.CompactionPointer(manifest_path=path, horizon=manifest.horizon, job_id=job,
                                 manifest=manifest)


def compact(storage: Storage, topic: Topic, job: str, horizon: tuple[int, int] | None = None,
            retain_null_key: bool = True, **kw) -> mpb.CompactionPointer:
    horizon = horizon or topic.last()
    return write_compacted(storage, job, pip14(topic.rows, horizon, retain_null_key), horizon,
                           **kw)
