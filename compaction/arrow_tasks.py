"""What the compaction job's Spark tasks run: Arrow compute over one run of the input.

The Spark job (compaction/spark_job.py) cuts its input into runs, contiguous in id order,
and runs one task per run (an RDD partition holding one `(task, root, items)`: `root` a URI
pyarrow's filesystems open, the same from every executor; `items` in id order, each a
storage-relative file read whole or a `Slice` of its row groups, compaction/slices.py).
Each task reads its items with pyarrow a few row groups at a time, single-threaded (Spark
runs one task per core). This module imports pyarrow, numpy and the sealed format
(source/ledger/sealed.py: the columns and writer options parts share with sealed
ledgers): it is what every Python worker of every executor loads. It needs no
pandas (which pyarrow would then import lazily into every broker, ~90 MiB each).

- `latest_per_key(cutoff)` (phase one) reads `key`, the ids, `is_tombstone` and
  `publish_time` only and yields one table per group, `(key binary, m int64)`: per key of
  its files the max of `position << 1 | dropped` (`position = ledger_id << 32 | entry_id`),
  the key's latest message and whether the job drops it: a tombstone published before the
  job's tombstone cutoff (compaction/plan.py; a cutoff of None drops every tombstone, a
  newer tombstone is kept as a delete marker). `merge_latest` merges two such tables (Spark's
  treeReduce runs it on the executors) and `live_positions` keeps the positions of the keys
  whose latest message is not dropped, sorted.
- `write_survivors` (phase two) keeps the rows whose position is in the broadcast sorted
  set of live positions (and keyless rows when `retain_null_key`): it reads a file's ids
  (and keys) first, then every column of the row groups holding a row to keep, and
  writes them in format 2 (rows of a format-1 input converted: source/columns.py) to
  `<out_dir>/part-<task>.parquet` in row groups of about `GROUP_BYTES` of messages: a
  task's files are contiguous in id order and each is in id order, so every part is
  sorted and the parts follow the task order. On a local root the part is written under a
  hidden temp name, fsynced and renamed; on an object store it is one object put when the
  stream closes (deleted again if the task fails). A retried or killed attempt never leaves
  half a part under the final name. Yields `(task, rows written, keyed tombstones written)`.
- `compact_alone` runs both phases in one task, for a job whose input is one group.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from shadowtopic.columns import KEY_COLUMNS, SCHEMA, upgrade
from shadowtopic.compaction.slices import Slice
from shadowtopic.ledger.object_store import open_root
from shadowtopic.ledger.sealed import GROUP_BYTES, GROUP_ROWS, WRITER_OPTIONS

PARTIAL = pa.schema([("key", pa.binary()), ("m", pa.int64())])
#: a task's input: (task, root, files, or row-group slices of files: compaction/slices.py)
Group = tuple[int, str, Sequence[str | Slice]]
T = TypeVar("T")
CHUNK_ROWS = 1 << 20        # rows read at a time (whole row groups)
REDUCE_ROWS = 4 << 20       # partial rows a task holds before it reduces them


def _item(item: str | Slice) -> tuple[str, int, int | None]:
    """A task's input item as (file, first row group, end row group or None: to the end)."""
    return (item, 0, None) if isinstance(item, str) else item


def _chunks(fs: pafs.FileSystem, path: str, columns: list[str] | None, first: int = 0,
            end: int | None = None) -> Iterator[pa.Table]:
    """Row groups `first` to `end` (all by default) of the file at `path`, a few whole row
    groups (about CHUNK_ROWS rows) at a time."""
    with fs.open_input_file(path) as f:
        pf = pq.ParquetFile(f)
        meta = pf.metadata
        groups: list[int] = []
        rows = 0
        for i in range(first, meta.num_row_groups if end is None else end):
            groups.append(i)
            rows += meta.row_group(i).num_rows
            if rows >= CHUNK_ROWS:
                yield pf.read_row_groups(groups, columns=columns, use_threads=False)
                groups, rows = [], 0
        if groups:
            yield pf.read_row_groups(groups, columns=columns, use_threads=False)


def _positions(t: pa.Table) -> pa.Array:
    return pc.add(pc.shift_left(t["ledger_id"], 32), t["entry_id"])


def _reduce(parts: list[pa.Table]) -> pa.Table:
    t = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    out = t.group_by("key", use_threads=False).aggregate([("m", "max")])
    return out.select(["key", "m_max"]).rename_columns(["key", "m"])


def _groups(groups: Iterator[tuple[int, str, Sequence[T]]]
            ) -> Iterator[tuple[int, pafs.FileSystem, str, Sequence[T]]]:
    for task, root, files in groups:
        fs, base = open_root(root)
        yield task, fs, base, files


def _dropped(t: pa.Table, tombstone_cutoff_ms: int | None) -> pa.Array:
    """Per row: a tombstone this job drops should it be its key's latest message."""
    tomb = t["is_tombstone"]
    if tombstone_cutoff_ms is None:
        return tomb
    return pc.and_(tomb, pc.less(t["publish_time"], pa.scalar(tombstone_cutoff_ms, pa.int64())))


def latest_per_key(tombstone_cutoff_ms: int | None):
    """Phase one over each group: (key, max of position << 1 | dropped)."""
    def run(groups: Iterator[Group]) -> Iterator[pa.Table]:
        for _task, fs, base, items in _groups(groups):
            parts: list[pa.Table] = [PARTIAL.empty_table()]
            held = 0
            for item in items:
                rel, first, end = _item(item)
                for t in _chunks(fs, f"{base}/{rel}", KEY_COLUMNS, first, end):
                    marked = pc.add(pc.shift_left(_positions(t), 1),
                                    pc.cast(_dropped(t, tombstone_cutoff_ms), pa.int64()))
                    keyed = pa.table({"key": t["key"], "m": marked}).filter(
                        pc.is_valid(t["key"]))
                    parts.append(keyed)
                    held += keyed.num_rows
                    if held >= REDUCE_ROWS:
                        parts = [_reduce(parts)]
                        held = parts[0].num_rows
            yield _reduce(parts)
    return run


def merge_latest(a: pa.Table, b: pa.Table) -> pa.Table:
    return _reduce([a, b])


def live_positions(latest: pa.Table) -> np.ndarray:
    """The positions of the keys whose latest message is kept (not a dropped tombstone),
    sorted."""
    m = latest.column("m").to_numpy()
    return np.sort(m[(m & 1) == 0] >> 1)


def _bytes(t: pa.Table) -> int:
    """The bytes of the messages in `t` (format 2)."""
    return t["head"].nbytes + t["payload"].nbytes + t["tail"].nbytes


class _PartWriter:
    """One part file written in row groups of about GROUP_BYTES of raw, under a temp name
    until `close` renames it (after an fsync, on a local root)."""

    def __init__(self, fs: pafs.FileSystem, path: str):
        self.fs, self.path = fs, path
        parent, name = path.rsplit("/", 1)
        self.local = isinstance(fs, pafs.LocalFileSystem)
        self.tmp = f"{parent}/.{name}.{uuid.uuid4().hex[:8]}.tmp" if self.local else path
        self.out = open(self.tmp, "wb") if self.local else fs.open_output_stream(path)
        self.writer = pq.ParquetWriter(self.out, SCHEMA, **WRITER_OPTIONS)
        self.held: list[pa.Table] = []
        self.held_bytes = 0
        self.rows = 0

    def write(self, t: pa.Table) -> None:
        self.held.append(t)
        self.held_bytes += _bytes(t)
        self.rows += t.num_rows
        if self.held_bytes >= 4 * GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self.held:
            return
        t = pa.concat_tables(self.held)
        per_row = max(1, _bytes(t) // max(1, t.num_rows))
        self.writer.write_table(t, row_group_size=max(1, min(GROUP_ROWS, GROUP_BYTES // per_row)))
        self.held, self.held_bytes = [], 0

    def close(self) -> None:
        self._flush()
        self.writer.close()
        if self.local:
            self.out.flush()
            os.fsync(self.out.fileno())
            self.out.close()
            os.replace(self.tmp, self.path)
            fd = os.open(os.path.dirname(self.path), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            self.out.close()

    def abort(self) -> None:
        try:
            self.writer.close()
            self.out.close()
        finally:
            if self.local:
                if os.path.exists(self.tmp):
                    os.unlink(self.tmp)
            else:  # closing an object store's stream put the object: take it back
                self.fs.delete_file(self.path)


def _survivors(pf: pq.ParquetFile, positions: np.ndarray, retain_null_key: bool,
               first: int = 0, end: int | None = None) -> Iterator[pa.Table]:
    """The rows to keep of one input file's row groups `first` to `end` (all by default), a
    few row groups at a time: their ids (and keys, for keyless rows) are read first, and of
    the other columns only the row groups that hold a row to keep. A key's latest message is
    near the end of the log, so most of an older ledger's row groups hold none and are never
    read whole."""
    meta = pf.metadata
    numbers = range(first, meta.num_row_groups if end is None else end)
    if not numbers:
        return
    probe = pf.read_row_groups(
        numbers, columns=["ledger_id", "entry_id", *(["key"] if retain_null_key else [])],
        use_threads=False)
    if probe.num_rows == 0:
        return
    pos = _positions(probe)
    span = pc.min_max(pos).as_py()  # the live positions in this file's range
    lo = np.searchsorted(positions, span["min"], side="left")
    hi = np.searchsorted(positions, span["max"], side="right")
    keep = pc.is_in(pos, value_set=pa.array(positions[lo:hi]))
    if retain_null_key:
        keep = pc.or_(keep, pc.is_null(probe["key"]))
    mask = keep.to_numpy(zero_copy_only=False)
    groups: list[int] = []
    masks: list[np.ndarray] = []
    rows = start = 0
    for i in numbers:
        n = meta.row_group(i).num_rows
        part = mask[start:start + n]
        start += n
        if part.any():
            groups.append(i)
            masks.append(part)
            rows += n
        if groups and (rows >= CHUNK_ROWS or i == numbers[-1]):
            t = pf.read_row_groups(groups, use_threads=False)
            yield t.filter(pa.array(np.concatenate(masks)))
            groups, masks, rows = [], [], 0


def write_survivors(live, retain_null_key: bool, out_dir: str):
    """Phase two over each group, against `live` (a Spark broadcast of the sorted live
    positions, a numpy int64 array): writes `<out_dir>/part-<task>.parquet`."""
    return survivors_of(lambda: live.value, retain_null_key, out_dir)


def survivors_of(positions_of, retain_null_key: bool, out_dir: str):
    """Phase two over each group against the sorted live positions `positions_of()` gives
    (read once per partition)."""
    def run(groups: Iterator[Group]) -> Iterator[tuple[int, int, int]]:
        positions = positions_of()
        for task, fs, base, items in _groups(groups):
            part = None
            tombstones = 0
            try:
                for item in items:
                    rel, first, end = _item(item)
                    with fs.open_input_file(f"{base}/{rel}") as f:
                        for t in _survivors(pq.ParquetFile(f), positions, retain_null_key,
                                            first, end):
                            # format 2 whatever the input's (a format-1 file's rows converted)
                            kept = upgrade(t).select(SCHEMA.names).cast(SCHEMA)
                            tombstones += pc.sum(pc.and_(pc.is_valid(kept["key"]),
                                                         kept["is_tombstone"])).as_py() or 0
                            if kept.num_rows:
                                if part is None:
                                    part = _PartWriter(
                                        fs, f"{base}/{out_dir}/part-{task:05d}.parquet")
                                part.write(kept)
                if part is not None:
                    part.close()
            except BaseException:
                if part is not None:
                    part.abort()
                raise
            yield task, part.rows if part is not None else 0, tombstones
    return run


def compact_alone(tombstone_cutoff_ms: int | None, retain_null_key: bool, out_dir: str):
    """Both phases in one task, for a job whose input is one group: phase one over the
    group, its live positions, then phase two against them. Yields `(task, rows written,
    keyed tombstones written, live positions)`."""
    def run(groups: Iterator[Group]) -> Iterator[tuple[int, int, int, int]]:
        for group in groups:
            (latest,) = latest_per_key(tombstone_cutoff_ms)(iter([group]))
            positions = live_positions(latest)
            for task, rows, tombstones in survivors_of(lambda p=positions: p, retain_null_key,
                                                       out_dir)(iter([group])):
                yield task, rows, tombstones, len(positions)
    return run
