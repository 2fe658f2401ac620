"""Sealed ledgers: one immutable Parquet file per ledger, and reads from it by entry id.

Columns: `entry_id` uint64, `key` binary (null for keyless), `is_tombstone` bool,
`publish_time` int64 (ms since epoch), `raw` binary (the serialized Message exactly as the
producer sent it). Row groups hold `ROWS_PER_GROUP` entries, so entry e lives in row group
e // ROWS_PER_GROUP and a read by id touches one row group; Spark reads only the columns it
needs. Integrity: Parquet page checksums, plus the crc32c of the whole file recorded in the
ledger list (streamed through when a broker first opens the file; a mismatch is
`ChecksumError`); row groups are then read from the file on demand, so an open reader holds
a file handle, not the file.
"""
from __future__ import annotations

import io
import threading
from collections import OrderedDict

import google_crc32c
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from source.core.errors import ChecksumError, DataLoss
from source.ledger.wal import Entries
from source.pb.storage.v1 import views_pb2

ROWS_PER_GROUP = 1024
SCHEMA = pa.schema([
    ("entry_id", pa.uint64()),
    ("key", pa.binary()),
    ("is_tombstone", pa.bool_()),
    ("publish_time", pa.int64()),
    ("raw", pa.binary()),
])


def key_columns(raws: list[bytes]) -> tuple[list[bytes | None], list[bool]]:
    """(key or None, is_tombstone) of each raw Message. Derived here, when a ledger seals,
    not on the produce path. A raw that is not a Message counts as keyless data."""
    view = views_pb2.MessageKeyView
    keys, tombs = [], []
    for raw in raws:
        try:
            m = view.FromString(raw)
        except Exception:  # noqa: BLE001 - opaque bytes: keep them, keyless
            keys.append(None)
            tombs.append(False)
            continue
        keys.append(m.key if m.HasField("key") else None)
        tombs.append(not m.payload)
    return keys, tombs


def to_table(entries: Entries) -> pa.Table:
    n = len(entries)
    keys, tombs = key_columns(entries.raws)
    return pa.table({
        "entry_id": pa.array(range(n), pa.uint64()),
        "key": pa.array(keys, pa.binary()),
        "is_tombstone": pa.array(tombs, pa.bool_()),
        "publish_time": pa.array(entries.publish_ms, pa.int64()),
        "raw": pa.array(entries.raws, pa.binary()),
    }, schema=SCHEMA)


def write_sealed(fs: pafs.FileSystem, path: str, entries: Entries) -> tuple[int, int]:
    """Write the Parquet file durably; return (size_bytes, crc32c). Written to a temp name
    and renamed, so a crash leaves either no file or a whole one."""
    buf = io.BytesIO()
    pq.write_table(to_table(entries), buf, row_group_size=ROWS_PER_GROUP, compression="zstd",
                   write_page_checksum=True, write_statistics=["entry_id", "publish_time"])
    data = buf.getvalue()
    tmp = path + ".tmp"
    parent = path.rsplit("/", 1)[0]
    fs.create_dir(parent, recursive=True)
    if isinstance(fs, pafs.LocalFileSystem):
        import os
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    else:  # object stores: a single put is atomic
        with fs.open_output_stream(path) as out:
            out.write(data)
    return len(data), google_crc32c.value(data)


def _file_crc(fs: pafs.FileSystem, path: str, chunk: int = 1 << 20) -> int:
    """crc32c of a whole file, streamed (a sealed ledger is not held in memory)."""
    crc = 0
    with fs.open_input_stream(path) as f:
        while True:
            data = f.read(chunk)
            if not data:
                return crc
            crc = google_crc32c.extend(crc, data)


class SealedLedger:
    """Reads of one sealed ledger; verified against its crc32c when opened."""

    def __init__(self, fs: pafs.FileSystem, path: str, crc32c: int | None):
        try:
            if crc32c is not None and _file_crc(fs, path) != crc32c:
                raise ChecksumError(f"checksum mismatch in sealed ledger {path}")
            self._source = fs.open_input_file(path)
        except (FileNotFoundError, OSError) as exc:
            raise DataLoss(f"sealed ledger file missing: {path} ({exc})") from None
        try:
            self._file = pq.ParquetFile(self._source, page_checksum_verification=True)
        except Exception as exc:  # noqa: BLE001 - a corrupt footer raises assorted errors
            raise ChecksumError(f"corrupt sealed ledger {path}: {exc}") from None
        self.path = path
        self.num_entries = self._file.metadata.num_rows
        self._groups: OrderedDict[int, pa.Table] = OrderedDict()
        self._lock = threading.Lock()

    def _group(self, index: int) -> pa.Table:
        """One row group (publish_time, raw), from a small per-ledger cache."""
        with self._lock:
            table = self._groups.get(index)
            if table is not None:
                self._groups.move_to_end(index)
                return table
        try:
            table = self._file.read_row_group(index, columns=["publish_time", "raw"])
        except Exception as exc:  # noqa: BLE001
            raise ChecksumError(f"corrupt row group {index} in {self.path}: {exc}") from None
        with self._lock:
            self._groups[index] = table
            while len(self._groups) > 8:
                self._groups.popitem(last=False)
        return table

    def publish_times(self) -> list[int]:
        """Every entry's publish time, in entry order (for seeks by time)."""
        try:
            return self._file.read(columns=["publish_time"]).column(0).to_pylist()
        except Exception as exc:  # noqa: BLE001
            raise ChecksumError(f"corrupt sealed ledger {self.path}: {exc}") from None

    def read(self, from_entry: int, max_entries: int, max_bytes: int
             ) -> tuple[list[int], list[bytes]]:
        """(publish_ms, raws) for entries from `from_entry` on, within the limits."""
        publish, raws = [], []
        size = 0
        entry = from_entry
        while entry < self.num_entries and len(raws) < max_entries and size < max_bytes:
            g = entry // ROWS_PER_GROUP
            table = self._group(g)
            start = entry - g * ROWS_PER_GROUP
            stop = min(table.num_rows, start + (max_entries - len(raws)))
            col_raw = table.column("raw").slice(start, stop - start).to_pylist()
            col_pub = table.column("publish_time").slice(start, stop - start).to_pylist()
            for p, r in zip(col_pub, col_raw):
                publish.append(p)
                raws.append(r)
                size += len(r)
                entry += 1
                if size >= max_bytes:
                    break
        return publish, raws
