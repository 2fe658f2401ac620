"""Sealed ledgers: one immutable Parquet file per ledger, and reads from it by entry id.

The columns are source/columns.py's (format 2: the payload, properties, event time,
producer and sequence id as columns SQL reads, beside the ids, key, tombstone flag and
publish time; files sealed in format 1 read the same). Compacted ledgers (compaction/) have
the same columns. A row group closes at `GROUP_BYTES` of raw or `GROUP_ROWS` entries,
whichever comes first (8,000 entries of 130 bytes; a few of 1 MiB): a read by id touches
one row group of about a MiB, found from the footer's row counts, and a scan (Spark,
pyarrow, DuckDB) pays the per-group cost once per MiB, not once per 1,024 entries. Files
sealed with 1,024-entry groups, and files sealed ahead (their groups close at frame
boundaries: source/ledger/seal_ahead.py), read the same way. Spark reads only the columns it needs.
Integrity: Parquet page checksums, plus the crc32c of the whole file recorded in the ledger
list (streamed through when a broker first opens the file; a mismatch is `ChecksumError`);
row groups are then read from the file on demand, so an open reader holds a file handle,
not the file; on an object store a file of up to 64 MiB is fetched whole instead, in one
request (source/ledger/remote_files.py). A reader rebuilds each entry's bytes as sent
(`columns.raws`: one concatenation per row, vectorized) once per row group it reads.

Writing streams, one row group at a time: a ledger that stopped taking appends is sealed
from its WAL (`seal_wal`, frames read one at a time through `wal.MappedWal`), never from a
copy of the whole ledger. The columns are cut from each entry's bytes as it goes
(`columns.Rows`: read off the wire; a payload of `columns.ZERO_COPY_BYTES` or more becomes an
Arrow array over the bytes it already is, a view of the mapped WAL, so a row group of large
entries costs no copy); `payload` is PLAIN-encoded (no dictionary), so the writer emits a
page every ~1 MiB and the WAL pages it has read are dropped from memory at each write. The
crc32c is computed as the file is written; the file is fsynced and its footer checked
(rows, row groups) before the caller marks the ledger SEALED. Arrow's unused memory is
handed back after each seal.
"""
from __future__ import annotations

import bisect
import ctypes
import itertools
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import google_crc32c
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from shadowtopic.columns import RAW_COLUMNS, SCHEMA, Rows, raws, read_rows, version
from shadowtopic.core.errors import ChecksumError, DataLoss
from shadowtopic.ledger import wal as walmod
from shadowtopic.ledger.remote_files import fetch_whole
from shadowtopic.ledger.wal import Buffer, Entries
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

GROUP_BYTES = 1 << 20    # raw bytes that close a row group
GROUP_ROWS = 16384       # entries that close a row group of small entries
WRITER_OPTIONS = dict(compression="zstd", write_page_checksum=True,
                      write_statistics=["entry_id", "publish_time", "event_time"],
                      use_dictionary=["ledger_id", "key", "publish_time", "producer_name",
                                      "compression"])


class _Writable(Protocol):
    """Where a Parquet file is written: a local file or an object store's output stream."""

    def write(self, data: bytes, /) -> object: ...


@dataclass
class SealResult:
    entries: int
    raw_bytes: int          # sum of the raws' lengths
    file_bytes: int
    crc32c: int             # of the whole file
    first_publish_ms: int
    last_publish_ms: int


class _RowGroup:
    """The columns of one row group as they fill, a run of entries at a time."""

    def __init__(self, ledger_id: int, base: int):
        self.ledger_id = ledger_id
        self.base = base
        self.rows = 0
        self.bytes = 0
        self.pubs: list[int] = []
        self.columns = Rows()

    @property
    def full(self) -> bool:
        return self.rows >= GROUP_ROWS or self.bytes >= GROUP_BYTES

    def room(self, sizes: list[int], i: int) -> int:
        """How many of the raws from i on go into this group, given their running total
        `sizes` (the one that reaches GROUP_BYTES included)."""
        before = sizes[i - 1] if i else 0
        upto = bisect.bisect_left(sizes, before + GROUP_BYTES - self.bytes, i) + 1
        return min(min(upto, len(sizes)) - i, GROUP_ROWS - self.rows)

    def extend(self, publish_ms: int, raws: Sequence[Buffer], size: int) -> None:
        self.columns.extend(raws)
        self.pubs.extend([publish_ms] * len(raws))
        self.rows += len(raws)
        self.bytes += size

    def table(self) -> pa.Table:
        return pa.table({
            "ledger_id": pa.repeat(pa.scalar(self.ledger_id, pa.int64()), self.rows),
            "entry_id": pa.array(range(self.base, self.base + self.rows), pa.int64()),
            "publish_time": pa.array(self.pubs, pa.int64()),
            **self.columns.arrays(),
        }).select(SCHEMA.names).cast(SCHEMA)


class _Sink:
    """What ParquetWriter writes to: forwards to `out`, keeps the crc32c and length of all
    written, and calls `on_write` after each write."""

    closed = False

    def __init__(self, out: _Writable, on_write: Callable[[], None] | None):
        self.out = out
        self.on_write = on_write
        self.crc = 0
        self.size = 0

    def write(self, data: bytes) -> int:
        self.out.write(data)
        self.crc = google_crc32c.extend(self.crc, data)
        self.size += len(data)
        if self.on_write is not None:
            self.on_write()
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class _Nowhere:
    """Where an aborted file's last bytes go."""

    def write(self, data: bytes, /) -> int:
        return len(data)


class LedgerWriter:
    """A sealed ledger's Parquet file as it is written to `out`: the entries of runs
    ((publish_ms, raws) in entry order) cut into row groups (`add`); `cut` writes the row
    group filling now, short (a seal-ahead cuts at its steps' ends: the runs it read are
    views of a WAL mapping it closes), `close` the last one and the footer."""

    def __init__(self, out: _Writable, ledger_id: int,
                 on_write: Callable[[], None] | None = None):
        self.sink = _Sink(out, on_write)
        self._writer = pq.ParquetWriter(self.sink, SCHEMA, **WRITER_OPTIONS)
        self._group = _RowGroup(ledger_id, 0)
        self._raw_bytes = 0
        self._first: int | None = None
        self._last: int | None = None

    @property
    def entries(self) -> int:
        return self._group.base + self._group.rows

    def add(self, runs: Iterable[tuple[int, Sequence[Buffer]]]) -> None:
        group = self._group
        for publish_ms, run in runs:
            if not run:
                continue
            self._first = publish_ms if self._first is None else self._first
            self._last = publish_ms
            sizes = list(itertools.accumulate(map(len, run)))
            self._raw_bytes += sizes[-1]
            i = 0
            while i < len(run):
                take = group.room(sizes, i)
                size = sizes[i + take - 1] - (sizes[i - 1] if i else 0)
                group.extend(publish_ms, run[i:i + take] if take < len(run) else run, size)
                i += take
                if group.full:
                    self._writer.write_table(group.table(), row_group_size=group.rows)
                    group = self._group = _RowGroup(group.ledger_id, group.base + group.rows)
            del run  # hold no view of a frame already written

    def cut(self) -> None:
        group = self._group
        if group.rows:
            self._writer.write_table(group.table(), row_group_size=group.rows)
            self._group = _RowGroup(group.ledger_id, group.base + group.rows)

    def close(self) -> SealResult:
        self.cut()
        self._writer.close()
        return SealResult(self.entries, self._raw_bytes, self.sink.size, self.sink.crc,
                          self._first or 0, self._last or 0)

    def abort(self) -> None:
        """Drop what is not written (an error ends the file; the caller removes it). The
        writer's close still emits its last column chunks and footer: they go nowhere, so
        an abort never writes (a full disk cannot fail it)."""
        self._group = _RowGroup(self._group.ledger_id, self._group.base)
        self._detach()
        try:
            self._writer.close()
        except Exception:  # noqa: BLE001 - the first error is the one to report
            pass

    def _detach(self) -> None:
        self.sink.out = _Nowhere()
        self.sink.on_write = None

    def __del__(self) -> None:
        # abandoned (its owner gone without close or abort: a fenced broker's seal-ahead):
        # pyarrow's writer closes itself when collected, and writes nothing anywhere
        self._detach()


def _write(out: _Writable, ledger_id: int, runs: Iterable[tuple[int, Sequence[Buffer]]],
           on_write: Callable[[], None] | None) -> SealResult:
    """Write the Parquet file of the entries in `runs` ((publish_ms, raws) in entry order)
    to `out`, one row group at a time."""
    writer = LedgerWriter(out, ledger_id, on_write)
    try:
        writer.add(runs)
    except BaseException:
        writer.abort()
        raise
    return writer.close()


def _check(fs: pafs.FileSystem, path: str, res: SealResult, expect: int | None) -> None:
    """The written file is whole: its length, its footer's rows and row groups, and (when
    given) the number of entries it was to hold."""
    if expect is not None and res.entries != expect:
        raise DataLoss(f"{path}: sealed {res.entries} entries, expected {expect}")
    info = fs.get_file_info(path)
    with fs.open_input_file(path) as f:
        meta = pq.ParquetFile(f).metadata
        groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    if (info.size != res.file_bytes or meta.num_rows != res.entries
            or not all(0 < g <= GROUP_ROWS for g in groups)):
        raise DataLoss(f"{path}: the sealed file does not hold what was written")


def temp_path(path: str) -> str:
    """Where a local seal writes `path` before it is whole: hidden (`.<name>.tmp`), so a
    dataset reader of the directory never sees a half-written file."""
    parent, name = path.rsplit("/", 1)
    return f"{parent}/.{name}.tmp"


def publish_local(fs: pafs.FileSystem, tmp: str, path: str, res: SealResult,
                  expect: int | None) -> None:
    """A local file written (and fsynced) at `tmp`, checked, becomes `path` durably; it is
    removed if the check fails."""
    try:
        _check(fs, tmp, res, expect)
    except BaseException:
        _remove(tmp)
        raise
    os.replace(tmp, path)
    walmod.fsync_dir(path.rsplit("/", 1)[0])


def publish_remote(fs: pafs.FileSystem, local: str, path: str, res: SealResult,
                   expect: int | None) -> None:
    """A file written whole (and fsynced) at the local path `local` becomes the object at
    `path` on the object store `fs`: copied in one stream (the object appears whole when the
    stream closes), then checked; a failed copy's object is deleted. The local file is
    removed either way."""
    try:
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        try:
            with open(local, "rb") as src, fs.open_output_stream(path) as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            _check(fs, path, res, expect)
        except BaseException:
            _delete_object(fs, path)
            raise
    finally:
        _remove(local)


def _delete_object(fs: pafs.FileSystem, path: str) -> None:
    """A failed write's object goes (the ledger is not SEALED: nobody reads it)."""
    try:
        fs.delete_file(path)
    except OSError:
        pass


def write_runs(fs: pafs.FileSystem, path: str, runs: Iterable[tuple[int, Sequence[Buffer]]],
               expect: int | None = None,
               on_write: Callable[[], None] | None = None, *, ledger_id: int) -> SealResult:
    """Write a sealed ledger durably from `runs` ((publish_ms, raws) in entry order) and
    check it. Written to a temp name, fsynced and renamed, so a crash leaves either no file
    or a whole one; on an object store a failed write's object is deleted (the ledger is not
    SEALED yet: nobody reads it). The temp name is hidden (`.<name>.tmp`), so a dataset
    reader of the directory never sees a half-written file."""
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    try:
        if isinstance(fs, pafs.LocalFileSystem):
            tmp = temp_path(path)
            try:
                with open(tmp, "wb") as f:
                    res = _write(f, ledger_id, runs, on_write)
                    f.flush()
                    os.fsync(f.fileno())
            except BaseException:
                _remove(tmp)
                raise
            publish_local(fs, tmp, path, res, expect)
        else:  # object stores: the object appears whole when the stream closes
            try:
                with fs.open_output_stream(path) as out:
                    res = _write(out, ledger_id, runs, on_write)
                _check(fs, path, res, expect)
            except BaseException:
                _delete_object(fs, path)
                raise
    finally:
        release_memory()
    return res


def seal_wal(fs: pafs.FileSystem, path: str, wal_path: str, frames: walmod.FrameIndex,
             expect: int, *, ledger_id: int) -> SealResult:
    """Seal a ledger that takes no more appends from its WAL: the `expect` entries of
    `frames`, read back (CRC-checked) a frame at a time."""
    try:
        wal = walmod.MappedWal(wal_path, frames)
    except FileNotFoundError:
        raise DataLoss(f"WAL {wal_path} is missing") from None
    with wal:
        return write_runs(fs, path, wal.runs(), expect, on_write=page_written(wal),
                          ledger_id=ledger_id)


def page_written(wal: walmod.MappedWal) -> Callable[[], None]:
    """What a writer reading `wal` does after each page it writes: what the page was made
    of can go (the WAL's pages mapped so far, Arrow's freed memory)."""
    def on_write() -> None:
        wal.drop_pages()
        _release_default()
    return on_write


def write_sealed(fs: pafs.FileSystem, path: str, entries: Entries, *, ledger_id: int
                 ) -> tuple[int, int]:
    """Write the Parquet file of entries held in memory; return (size_bytes, crc32c)."""
    if entries.offset:
        raise ValueError("entries dropped from memory: seal from the WAL")
    runs = ((pub, [raw for _, raw in group]) for pub, group in
            itertools.groupby(zip(entries.publish_ms, entries.raws, strict=True),
                              key=lambda pr: pr[0]))
    res = write_runs(fs, path, runs, len(entries), ledger_id=ledger_id)
    return res.file_bytes, res.crc32c


def mark_sealed(info: mpb.LedgerInfo, rel: str, res: SealResult, sealed_ms: int) -> None:
    """Record in a ledger's info that it is sealed in the file `rel` that `res` describes."""
    info.state = mpb.LedgerState.SEALED
    info.path = rel
    info.wal_path = ""
    info.entries = res.entries
    info.size_bytes = res.raw_bytes
    info.crc32c = res.crc32c
    info.sealed_ms = sealed_ms
    info.first_publish_ms = res.first_publish_ms
    info.last_publish_ms = res.last_publish_ms


def _release_default() -> None:
    release = getattr(pa.default_memory_pool(), "release_unused", None)
    if release is not None:
        release()


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def release_memory() -> None:
    """Hand the memory a seal freed back to the system: Arrow's pool keeps freed pages
    (`release_unused`), and so does malloc (frames decoded, pages passed to the file)."""
    _release_default()
    if _TRIM is not None:
        _TRIM(0)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


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
            whole = fetch_whole(fs, path, self)  # (an object store's file: one GET)
            if crc32c is not None and (_file_crc(fs, path) if whole is None
                                       else google_crc32c.value(whole)) != crc32c:
                raise ChecksumError(f"checksum mismatch in sealed ledger {path}")
            self._source = fs.open_input_file(path) if whole is None else pa.BufferReader(whole)
        except (FileNotFoundError, OSError) as exc:
            raise DataLoss(f"sealed ledger file missing: {path} ({exc})") from None
        try:
            self._file = pq.ParquetFile(self._source, page_checksum_verification=True)
        except Exception as exc:  # noqa: BLE001 - a corrupt footer raises assorted errors
            raise ChecksumError(f"corrupt sealed ledger {path}: {exc}") from None
        self.path = path
        self.format = version(self._file.schema_arrow)
        self._columns = ["publish_time", *RAW_COLUMNS[self.format]]
        meta = self._file.metadata
        self.num_entries = meta.num_rows
        #: the first entry of each row group
        self._starts = list(itertools.accumulate(
            (meta.row_group(i).num_rows for i in range(meta.num_row_groups - 1)), initial=0))
        self._groups: OrderedDict[int, pa.Table] = OrderedDict()
        self._lock = threading.Lock()
        # one reader of the file at a time: pyarrow's ParquetFile is not safe to read from
        # several threads at once (concurrent read_row_group calls crashed the broker in
        # libarrow, bench/NOTES.md); executor threads of several readers share this object
        self._read_lock = threading.Lock()

    def _group(self, index: int) -> pa.Table:
        """One row group (publish_time, raw), from a small per-ledger cache."""
        with self._lock:
            table = self._groups.get(index)
            if table is not None:
                self._groups.move_to_end(index)
                return table
        try:
            with self._read_lock:
                table = self._file.read_row_group(index, columns=self._columns)
        except Exception as exc:  # noqa: BLE001
            raise ChecksumError(f"corrupt row group {index} in {self.path}: {exc}") from None
        table = pa.table({"publish_time": table.column("publish_time"), "raw": raws(table)})
        with self._lock:
            self._groups[index] = table
            while len(self._groups) > 8:
                self._groups.popitem(last=False)
        return table

    def read_columns(self, from_entry: int, count: int) -> pa.Table:
        """Entries `from_entry ..` (at most `count`, within the file) as Arrow columns
        (source/columns.py `read_rows`): what an Arrow read sends, no object per entry."""
        count = min(count, self.num_entries - from_entry)
        try:
            with self._read_lock:
                return read_rows(self._file, self.format, from_entry, count, self._starts)
        except Exception as exc:  # noqa: BLE001
            raise ChecksumError(f"corrupt sealed ledger {self.path}: {exc}") from None

    def publish_times(self) -> list[int]:
        """Every entry's publish time, in entry order (for seeks by time)."""
        try:
            with self._read_lock:
                table = self._file.read(columns=["publish_time"])
            times: list[int] = table.column(0).to_pylist()
            return times
        except Exception as exc:  # noqa: BLE001
            raise ChecksumError(f"corrupt sealed ledger {self.path}: {exc}") from None

    def read(self, from_entry: int, max_entries: int, max_bytes: int
             ) -> tuple[list[int], list[bytes]]:
        """(publish_ms, raws) for entries from `from_entry` on, within the limits."""
        publish: list[int] = []
        raws: list[bytes] = []
        size = 0
        entry = from_entry
        while entry < self.num_entries and len(raws) < max_entries and size < max_bytes:
            g = bisect.bisect_right(self._starts, entry) - 1
            table = self._group(g)
            start = entry - self._starts[g]
            stop = min(table.num_rows, start + (max_entries - len(raws)))
            col_raw = table.column("raw").slice(start, stop - start).to_pylist()
            col_pub = table.column("publish_time").slice(start, stop - start).to_pylist()
            for p, r in zip(col_pub, col_raw, strict=True):
                publish.append(p)
                raws.append(r)
                size += len(r)
                entry += 1
                if size >= max_bytes:
                    break
        return publish, raws
