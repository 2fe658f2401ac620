"""Compacted ledgers: the stored format, shared by the compaction job that writes them
(compaction/) and the brokers that read them (compaction/view.py).

    <root>/compacted/<topic-dir>/<job_id>/part-*.parquet   the surviving messages
    <root>/compacted/<topic-dir>/<job_id>/manifest.pb      CompactedManifest (metadata.proto)

A compacted ledger holds, for every id at or before its horizon, the latest message of each
key that was not deleted (PIP-14: an empty payload deletes its key), the latest message of
each deleted key when it is a recent delete (a tombstone published at or after the job's
tombstone cutoff, the manifest's `tombstone_cutoff_ms`: its request time minus the topic's
`delete_retention_seconds`, compaction/plan.py; older tombstones are not written), and the
keyless messages when the topic's `retain_null_key` is on. Rows keep their original ids
and bytes: a kept tombstone reads as the empty-payload message it was produced as, so
a compacted reader sees it as a reader of the raw ledgers does (K18). The manifest counts
them in `entries` and `tombstones`; `keys` counts the live keys only. Files have the
columns of a sealed ledger (source/columns.py: format 2, written by every compaction;
compacted ledgers written in format 1 read the same), rows sorted by (ledger_id, entry_id)
within a file, files in id order with ranges that do not overlap; row groups may have any
size (a reader locates rows from the id columns, not from a fixed group size). A compaction
that kept nothing writes no Parquet file, only its manifest.

The manifest is written last (temp name, fsync, rename), after every data file is durable;
the topic's `CompactionPointer` in etcd (keys.compaction) names it and carries a copy, and
is replaced by one transaction on the previous pointer's revision. A directory that no
pointer names is garbage once its job is over (the compaction worker collects it).
"""
from __future__ import annotations

import os
import threading
from array import array
from bisect import bisect_left
from collections import OrderedDict

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shadowtopic.columns import RAW_COLUMNS, raws, read_rows, version
from shadowtopic.core.errors import ChecksumError, DataLoss
from shadowtopic.ledger import wal as walmod
from shadowtopic.ledger.storage import Storage
from shadowtopic.ledger.view import ReadEntry
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import common_pb2

MANIFEST = "manifest.pb"
GROUPS_CACHED = 4  # row groups kept per file, as entries (about 1 MiB of payloads each)


def manifest_rel(dir_rel: str) -> str:
    return f"{dir_rel}/{MANIFEST}"


def _crc(storage: Storage, rel: str, chunk: int = 1 << 20) -> int:
    crc = 0
    with storage.fs.open_input_stream(storage.full(rel)) as f:
        while True:
            data = f.read(chunk)
            if not data:
                return crc
            crc = google_crc32c.extend(crc, data)


def describe_file(storage: Storage, rel: str) -> mpb.CompactedFile | None:
    """The manifest entry of one written data file (None when it holds no rows): rows,
    first and last id (from the id columns), size and crc32c."""
    with storage.fs.open_input_file(storage.full(rel)) as f:
        pf = pq.ParquetFile(f)
        rows = pf.metadata.num_rows
        if rows == 0:
            return None
        ids = pf.read(columns=["ledger_id", "entry_id"])
    lids, eids = ids.column(0), ids.column(1)
    first = common_pb2.MessageIdData(ledger_id=lids[0].as_py(), entry_id=eids[0].as_py())
    last = common_pb2.MessageIdData(ledger_id=lids[rows - 1].as_py(),
                                    entry_id=eids[rows - 1].as_py())
    size = storage.fs.get_file_info(storage.full(rel)).size
    return mpb.CompactedFile(path=rel, rows=rows, first=first, last=last, size_bytes=size,
                             crc32c=_crc(storage, rel))


def write_manifest(storage: Storage, dir_rel: str, manifest: mpb.CompactedManifest) -> str:
    """Write `manifest` durably as the last file of its compacted ledger; returns its path."""
    rel = manifest_rel(dir_rel)
    data = manifest.SerializeToString()
    if storage.shared_wal:  # local filesystem: temp name, fsync, rename, fsync the directory
        path = storage.full(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(os.path.dirname(path), "." + MANIFEST + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        walmod.fsync_dir(os.path.dirname(path))
    else:  # object stores: the object appears whole when the stream closes
        storage.fs.create_dir(storage.full(dir_rel), recursive=True)
        with storage.fs.open_output_stream(storage.full(rel)) as out:
            out.write(data)
    return rel


def read_manifest(storage: Storage, rel: str) -> mpb.CompactedManifest:
    try:
        with storage.fs.open_input_stream(storage.full(rel)) as f:
            return mpb.CompactedManifest.FromString(f.read())
    except (FileNotFoundError, OSError) as exc:
        raise DataLoss(f"compaction manifest missing: {rel} ({exc})") from None


def position(ledger_id, entry_id):
    """A message id as one int64 (`ledger_id << 32 | entry_id`), the order of ids."""
    return (ledger_id << 32) | entry_id


_MAX_POSITION = (1 << 63) - 1


def _search_key(ledger_id: int, entry_id: int) -> int:
    """`position` of any id a client may send (entry ids past 32 bits are past every entry
    of their ledger; ids past int64 are past everything), for a search in int64 positions."""
    if entry_id >= 1 << 32:
        ledger_id, entry_id = ledger_id + 1, 0
    return min(position(ledger_id, entry_id), _MAX_POSITION)


class _Group:
    """One row group as readers take it: its entries (made once, then sliced by every read
    of every view that shares the ledger) and the running total of their `raw` sizes."""

    __slots__ = ("entries", "ends")

    def __init__(self, entries: list[ReadEntry]):
        self.entries = entries
        self.ends = np.cumsum([len(e.raw) for e in entries], dtype=np.int64)


class _File:
    """One data file: an open reader, its row groups' first rows, a small group cache."""

    def __init__(self, storage: Storage, f: mpb.CompactedFile):
        self.path = f.path
        try:
            if _crc(storage, f.path) != f.crc32c:
                raise ChecksumError(f"checksum mismatch in compacted ledger file {f.path}")
            self.source = storage.fs.open_input_file(storage.full(f.path))
        except (FileNotFoundError, OSError) as exc:
            raise DataLoss(f"compacted ledger file missing: {f.path} ({exc})") from None
        try:
            self.pf = pq.ParquetFile(self.source, page_checksum_verification=True)
            ids = self.pf.read(columns=["ledger_id", "entry_id", "publish_time"])
        except Exception as exc:  # noqa: BLE001 - a corrupt file raises assorted errors
            raise ChecksumError(f"corrupt compacted ledger file {f.path}: {exc}") from None
        if ids.num_rows != f.rows:
            raise DataLoss(f"{f.path}: {ids.num_rows} rows, the manifest says {f.rows}")
        self.positions = position(ids.column(0).to_numpy().astype(np.int64),
                                  ids.column(1).to_numpy().astype(np.int64))
        self.publish = ids.column(2).to_numpy().astype(np.int64)
        self.format = version(self.pf.schema_arrow)
        meta = self.pf.metadata
        self.group_starts = np.cumsum([0] + [meta.row_group(i).num_rows
                                             for i in range(meta.num_row_groups)])
        self.groups: OrderedDict[int, _Group] = OrderedDict()
        self.lock = threading.Lock()   # ParquetFile is not safe from several threads

    def group(self, index: int) -> _Group:
        with self.lock:
            group = self.groups.get(index)
            if group is None:
                try:
                    table = self.pf.read_row_group(
                        index, columns=["publish_time", *RAW_COLUMNS[self.format]])
                    payloads = raws(table).to_pylist()
                    publish = table.column("publish_time").to_pylist()
                except Exception as exc:  # noqa: BLE001
                    raise ChecksumError(f"corrupt row group {index} in {self.path}: "
                                        f"{exc}") from None
                at = self.positions[self.group_starts[index]:self.group_starts[index + 1]]
                group = _Group(list(map(ReadEntry, (at >> 32).tolist(),
                                        (at & 0xFFFFFFFF).tolist(), publish, payloads)))
                self.groups[index] = group
                while len(self.groups) > GROUPS_CACHED:
                    self.groups.popitem(last=False)
            else:
                self.groups.move_to_end(index)
            return group


class CompactedLedger:
    """Reads of one compacted ledger (what a manifest describes), by row index and by id.

    Opening it (blocking: do it in an executor) checks every file against the manifest
    (missing: `DataLoss`; crc32c or rows differ: `ChecksumError` / `DataLoss`) and keeps the
    ids and publish times of all rows in memory (24 bytes per row: each file's ids and
    times as numpy arrays, and all ids once more as machine ints for `find`), so finding
    the first surviving id at or after a position is a binary search; entries are read a
    row group at a time, and the last `GROUPS_CACHED` of each file are kept as entries."""

    def __init__(self, storage: Storage, manifest: mpb.CompactedManifest):
        self.manifest = manifest
        self.job_id = manifest.job_id
        self._files = [_File(storage, f) for f in manifest.files]
        # every row's `position`, as machine ints: `bisect` on them is 3x faster than numpy's
        # searchsorted of one value (a subscription leaving walks its unacked ids, a `find`
        # each)
        self._ids = array("q")
        for f in self._files:
            self._ids.frombytes(f.positions.tobytes())
        self.publish = np.concatenate([f.publish for f in self._files]) \
            if self._files else np.empty(0, np.int64)
        self._starts = np.cumsum([0] + [len(f.positions) for f in self._files])

    def __len__(self) -> int:
        return len(self._ids)

    def find(self, ledger_id: int, entry_id: int) -> int:
        """Index of the first row with id >= (ledger_id, entry_id) (len(self) if none)."""
        return bisect_left(self._ids, _search_key(ledger_id, entry_id))

    def count_between(self, start: tuple[int, ...], end: tuple[int, ...]) -> int:
        """Rows with ids in [start, end) (ids as MessageId or (ledger_id, entry_id))."""
        return max(0, self.find(end[0], end[1]) - self.find(start[0], start[1]))

    def id_at(self, index: int) -> tuple[int, int]:
        p = self._ids[index]
        return p >> 32, p & 0xFFFFFFFF

    def first_id(self) -> tuple[int, int] | None:
        return self.id_at(0) if len(self) else None

    def last_id(self) -> tuple[int, int] | None:
        return self.id_at(len(self) - 1) if len(self) else None

    def first_published_at(self, publish_ms: int) -> int:
        """Index of the first row published at or after `publish_ms` (len(self) if none)."""
        hits = np.flatnonzero(self.publish >= publish_ms)
        return int(hits[0]) if len(hits) else len(self)

    def read(self, index: int, max_entries: int, max_bytes: int) -> list[ReadEntry]:
        """Entries from row `index` on: at most `max_entries`, and no more once their `raw`
        bytes reach `max_bytes` (the entry that reaches it included: one at least). Rows are
        slices of the cached groups' entries: a second reader of the same rows, of any
        view sharing this ledger, builds nothing."""
        out: list[ReadEntry] = []
        size = 0
        i = index
        while i < len(self) and len(out) < max_entries and size < max_bytes:
            fi = int(np.searchsorted(self._starts, i, "right")) - 1
            f = self._files[fi]
            row = i - int(self._starts[fi])
            g = int(np.searchsorted(f.group_starts, row, "right")) - 1
            group = f.group(g)
            start = row - int(f.group_starts[g])
            stop = min(len(group.entries), start + (max_entries - len(out)))
            base = int(group.ends[start - 1]) if start else 0
            # the first entry whose running size reaches the budget is the last one taken
            reach = int(np.searchsorted(group.ends, base + max_bytes - size, "left"))
            stop = min(stop, reach + 1)
            out += group.entries[start:stop]
            size += int(group.ends[stop - 1]) - base
            i += stop - start
        return out

    def read_columns(self, index: int, max_entries: int) -> pa.Table:
        """Rows from `index` (at most `max_entries`, within one file) as Arrow columns
        (source/columns.py `read_rows`): what an Arrow read sends, no object per row."""
        fi = int(np.searchsorted(self._starts, index, "right")) - 1
        f = self._files[fi]
        row = index - int(self._starts[fi])
        count = min(max_entries, int(f.group_starts[-1]) - row)
        try:
            with f.lock:
                return read_rows(f.pf, f.format, row, count, [int(x) for x in f.group_starts[:-1]])
        except Exception as exc:  # noqa: BLE001
            raise ChecksumError(f"corrupt compacted ledger file {f.path}: {exc}") from None

    def close(self) -> None:
        for f in self._files:
            try:
                f.source.close()
            except Exception:  # noqa: BLE001 - closing a reader: nothing to report
                pass
