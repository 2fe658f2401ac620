"""Write-ahead log of an open ledger: format, append with fsync, and recovery.

File layout (little-endian):

    header  = b"STWAL002" u64 ledger_id                                   (16 bytes)
    frame   = u32 length, u32 crc32c(body), body[length]
    body    = u64 first_entry_id, u32 count, i64 publish_time_ms, request
    request = the producer's ProduceRequest exactly as it arrived; its `messages` (read
              through storage.v1.RawProduceRequest) are the entries' `raw` bytes, in order

One frame holds one produce batch (as a Kafka record batch does): the batch is appended and
fsynced as a unit and acknowledged only after the fsync, so one CRC per batch finds a torn
tail, and the broker writes the request bytes it received instead of re-encoding messages.
Entries are numbered contiguously from 0 within a ledger; `recover` stops at the first frame
that is short, fails its CRC or breaks the numbering, truncates the file there (unless the
disk is read-only or full: then the tail stays, unindexed) and returns every entry before
it (reading one frame at a time; with `keep_raws=False` it keeps only the frame index, for
a recovery that seals from the WAL), and the producer sequence ids of its sequenced
batches (idempotent producing: source/ledger/dedup.py).

An owner that dropped entries from memory (source/ledger/entry_cache.py) reads them back by
frame: `FrameIndex` records where each frame starts (the writer fills it as it writes; a
reader without the writer scans frame headers), and `read_frames` decodes just the frames
of a byte range, each checked against its CRC.

Sealing reads a WAL that takes no more appends through `MappedWal` (source/ledger/sealed.py):
one frame at a time, CRC-checked; the messages of frames of large messages come as views
of a read-only shared mapping of the file, whose pages are dropped from the process as the
Parquet writer moves on, so the memory a seal takes depends on neither the ledger nor the
size of a row group.
"""
from __future__ import annotations

import bisect
import mmap
import os
import struct
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import google_crc32c

from shadowtopic import wire
from shadowtopic.core import errors
from shadowtopic.pb.storage.v1 import views_pb2

MAGIC = b"STWAL002"
HEADER = struct.Struct("<8sQ")
FRAME = struct.Struct("<II")
BATCH = struct.Struct("<QIq")
MAX_FRAME = 256 << 20
#: a message as read for sealing: bytes, or a view of a mapped WAL (`MappedWal`)
Buffer = bytes | memoryview


def encode_header(ledger_id: int) -> bytes:
    return HEADER.pack(MAGIC, ledger_id)


def encode_batch(first_entry_id: int, publish_ms: int, request: bytes, count: int) -> bytes:
    """One frame for a batch: the request bytes behind a batch header (pure, no copies of
    individual messages)."""
    head = BATCH.pack(first_entry_id, count, publish_ms)
    crc = google_crc32c.extend(google_crc32c.value(head), request)
    return b"".join((FRAME.pack(len(head) + len(request), crc), head, request))


def request_bytes(raws: list[bytes]) -> bytes:
    """A minimal request carrying `raws` (for callers that have messages, not a request)."""
    return views_pb2.RawProduceRequest(messages=raws).SerializeToString()


@dataclass
class Entries:
    """Entries of one ledger in column form (what the WAL holds and Parquet gets).

    `offset` > 0: the raws of entries 0 .. offset-1 were dropped from memory (they are in
    the WAL); `raws[i - offset]` is entry i, `publish_ms[i]` and `size` cover every entry."""

    raws: list[bytes] = field(default_factory=list)
    publish_ms: list[int] = field(default_factory=list)
    size: int = 0
    offset: int = 0

    def __len__(self) -> int:
        return self.offset + len(self.raws)

    def extend(self, publish_ms: int, raws: list[bytes], size: int) -> None:
        self.raws.extend(raws)
        self.publish_ms.extend([publish_ms] * len(raws))
        self.size += size


def parse_request(body: bytes) -> tuple[int, int, views_pb2.RawProduceRequest]:
    """A frame body as (first_entry_id, publish_ms, the request it holds)."""
    first, count, publish_ms = BATCH.unpack_from(body, 0)
    # protobuf parses any buffer (no copy of the body here); its stubs say bytes
    req = views_pb2.RawProduceRequest.FromString(
        memoryview(body)[BATCH.size:])  # type: ignore[arg-type]
    if len(req.messages) != count:
        raise ValueError("frame count does not match its messages")
    return first, publish_ms, req


def parse_body(body: bytes) -> tuple[int, int, list[bytes]]:
    """A frame body as (first_entry_id, publish_ms, raws)."""
    first, publish_ms, req = parse_request(body)
    return first, publish_ms, list(req.messages)


class FrameIndex:
    """Where the frames of one WAL start: frame k holds entries firsts[k] .. firsts[k+1]-1,
    published at pubs[k], and sits at file bytes offsets[k] .. offsets[k+1] (the last one
    up to `end`). Arrays of int64: 24 bytes per frame."""

    __slots__ = ("firsts", "offsets", "pubs", "end", "entries")

    def __init__(self) -> None:
        self.firsts = array("q")
        self.offsets = array("q")
        self.pubs = array("q")
        self.end = HEADER.size   # file offset after the last indexed frame
        self.entries = 0         # entry id after the last indexed frame

    def __len__(self) -> int:
        return len(self.firsts)

    def add(self, first: int, count: int, publish_ms: int, offset: int, length: int) -> None:
        self.firsts.append(first)
        self.offsets.append(offset)
        self.pubs.append(publish_ms)
        self.end = offset + length
        self.entries = first + count

    def window(self, start: int, stop: int) -> FrameIndex:
        """Frames start .. stop-1 as an index of their own, copied (a seal-ahead reads it in
        another thread while this one grows: source/ledger/seal_ahead.py)."""
        w = FrameIndex()
        w.firsts = self.firsts[start:stop]
        w.offsets = self.offsets[start:stop]
        w.pubs = self.pubs[start:stop]
        w.end = self.offsets[stop] if stop < len(self) else self.end
        w.entries = self.firsts[stop] if stop < len(self) else self.entries
        return w

    def frame_of(self, entry_id: int) -> int:
        """Index of the frame holding `entry_id` (-1 when it is not indexed)."""
        if entry_id >= self.entries:
            return -1
        return bisect.bisect_right(self.firsts, entry_id) - 1

    def span(self, k: int) -> tuple[int, int]:
        """File bytes [start, stop) of frame k."""
        stop = self.offsets[k + 1] if k + 1 < len(self.offsets) else self.end
        return self.offsets[k], stop

    def publish_times(self) -> list[int]:
        """The publish time of every indexed entry."""
        out: list[int] = []
        for k, first in enumerate(self.firsts):
            nxt = self.firsts[k + 1] if k + 1 < len(self.firsts) else self.entries
            out.extend([self.pubs[k]] * (nxt - first))
        return out


def scan_frames(path: str, start: int, next_id: int) -> list[tuple[int, int, int, int, int]]:
    """Frame headers of a WAL from file offset `start` (whose first frame starts at entry
    `next_id`), as FrameIndex.add arguments, reading headers only (no bodies, no CRC: a
    frame is checked when `read_frames` decodes it). Stops before a frame that is not
    complete yet or breaks the numbering."""
    out = []
    with open(path, "rb") as f:
        if start <= HEADER.size:
            head = f.read(HEADER.size)
            if len(head) < HEADER.size or head[:8] != MAGIC:
                raise ValueError(f"{path}: not a shadowtopic WAL (bad header)")
            start = HEADER.size
        size = os.fstat(f.fileno()).st_size
        pos = start
        while pos + FRAME.size + BATCH.size <= size:
            f.seek(pos)
            head = f.read(FRAME.size + BATCH.size)
            if len(head) < FRAME.size + BATCH.size:
                break
            length, _crc = FRAME.unpack_from(head, 0)
            first, count, publish_ms = BATCH.unpack_from(head, FRAME.size)
            end = pos + FRAME.size + length
            if length < BATCH.size or length > MAX_FRAME or end > size or first != next_id:
                break
            out.append((first, count, publish_ms, pos, FRAME.size + length))
            next_id += count
            pos = end
    return out


def read_frames(path: str, spans: list[tuple[int, int]]) -> list[tuple[int, int, list[bytes]]]:
    """Decode the whole frames in each byte range [start, stop) of a WAL, every frame checked
    against its CRC: a list of (first_entry_id, publish_ms, raws), in order."""
    out = []
    with open(path, "rb") as f:
        for start, stop in spans:
            f.seek(start)
            data = f.read(stop - start)
            if len(data) != stop - start:
                raise errors.DataLoss(f"{path}: WAL ends before byte {stop}")
            pos = 0
            while pos < len(data):
                length, crc = FRAME.unpack_from(data, pos)
                body = data[pos + FRAME.size:pos + FRAME.size + length]
                if (len(body) != length or length < BATCH.size
                        or google_crc32c.value(body) != crc):
                    raise errors.ChecksumError(f"{path}: WAL frame at byte {start + pos} "
                                               "is damaged")
                try:
                    out.append(parse_body(body))
                except Exception as exc:  # noqa: BLE001 - a body that does not parse
                    raise errors.ChecksumError(f"{path}: WAL frame at byte {start + pos}: "
                                               f"{exc}") from None
                pos += FRAME.size + length
    return out


@dataclass
class Recovered:
    ledger_id: int
    entries: Entries     # without raws (offset = every entry) when recovered keep_raws=False
    valid_bytes: int     # file length after truncation
    truncated_bytes: int  # bytes cut off the torn tail
    frames: FrameIndex = field(default_factory=FrameIndex)  # every valid frame
    # sequenced batches (idempotent producing, source/ledger/dedup.py), in order:
    # (producer_name, first sequence id, count, first entry id, publish_ms)
    sequences: list[tuple[str, int, int, int, int]] = field(default_factory=list)


def recover(path: str, truncate: bool = True, keep_raws: bool = True) -> Recovered:
    """Check every frame (one at a time); cut the file at the first invalid one (torn tail).
    Every entry before it is returned, its raws too unless `keep_raws` is False."""
    entries = Entries()
    frames = FrameIndex()
    sequences: list[tuple[str, int, int, int, int]] = []
    with open(path, "rb") as f:
        head = f.read(HEADER.size)
        if len(head) < HEADER.size or head[:8] != MAGIC:
            raise ValueError(f"{path}: not a shadowtopic WAL (bad header)")
        _, ledger_id = HEADER.unpack_from(head, 0)
        size = os.fstat(f.fileno()).st_size
        pos = HEADER.size
        while pos + FRAME.size <= size:
            length, crc = FRAME.unpack(f.read(FRAME.size))
            end = pos + FRAME.size + length
            if length < BATCH.size or length > MAX_FRAME or end > size:
                break
            body = f.read(length)
            if len(body) != length or google_crc32c.value(body) != crc:
                break
            try:
                first, publish_ms, req = parse_request(body)
            except Exception:  # noqa: BLE001 - a body that does not parse ends the valid log
                break
            if first != len(entries):
                break
            raws = list(req.messages)
            if req.sequence_id:
                sequences.append((req.producer_name, req.sequence_id, len(raws), first,
                                  publish_ms))
            del body, req
            frames.add(first, len(raws), publish_ms, pos, end - pos)
            nbytes = sum(map(len, raws))
            if keep_raws:
                entries.extend(publish_ms, raws, nbytes)
            else:
                entries.publish_ms.extend([publish_ms] * len(raws))
                entries.size += nbytes
                entries.offset += len(raws)
            pos = end
    cut = size - pos
    if cut and truncate:
        try:
            with open(path, "r+b") as f:
                f.truncate(pos)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            if exc.errno not in errors.STORAGE_ERRNOS:
                raise
            # a read-only (or full) disk: the tail stays, but nothing past the last valid
            # frame is indexed, so nothing of it is read, sealed or served
    return Recovered(ledger_id, entries, pos, cut, frames, sequences)


def message_spans(buf: bytes | memoryview, pos: int, end: int
                  ) -> list[tuple[int, int]] | None:
    """(offset, length) in `buf` of each `messages` value of the RawProduceRequest encoded in
    buf[pos:end] (what protobuf decodes them to, without copying them), or None when the
    encoding holds anything unexpected (the caller then decodes it with protobuf, which
    decides whether the frame is corrupt)."""
    out = []
    try:
        for number, kind, _length, start, stop in wire.walk(buf, pos, end):
            if number == 4 and kind == wire.LENGTH:
                out.append((start, stop - start))
    except wire.WireError:
        return None
    return out


class MappedWal:
    """A WAL that takes no more appends, read for sealing with bounded memory: `runs` yields
    its frames one at a time as (publish_ms, raws), each checked against its CRC and the
    index. The messages of a frame whose messages average `MAP_BYTES` or more are views of a
    read-only shared mapping of the file (no copy); `drop_pages` unmaps the pages read so
    far from this process (MADV_DONTNEED: the kernel maps them back from the page cache if
    they are read again), and `runs` does so after every MiB it yields. Smaller messages
    are decoded (copies). The views are valid until `close`."""

    MAP_BYTES = 4 << 10
    DROP_EVERY = 1 << 20
    READ_PIECE = 256 << 10

    def __init__(self, path: str, frames: FrameIndex):
        self.path = path
        self.frames = frames
        self._f = open(path, "rb")
        try:
            mapping = mmap.mmap(self._f.fileno(), frames.end, access=mmap.ACCESS_READ)
        except ValueError as exc:  # shorter than its index
            self._f.close()
            raise errors.DataLoss(f"{path}: WAL ends before byte {frames.end}: {exc}") from None
        self._map: mmap.mmap | None = mapping  # None once closed
        self._view = memoryview(mapping)
        self._mapped = 0  # bytes of views yielded since the last drop

    def __enter__(self) -> MappedWal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def runs(self) -> Iterator[tuple[int, Sequence[Buffer]]]:
        index, f = self.frames, self._f
        n = len(index)
        offsets = list(index.offsets) + [index.end]
        k = 0
        while k < n:
            if self._mapped >= self.DROP_EVERY:
                self.drop_pages()
            start = offsets[k]
            if offsets[k + 1] - start > self.READ_PIECE:  # a large frame: on its own
                yield self._large_frame(k, start, offsets[k + 1])
                k += 1
                continue
            j = k + 1  # small frames: read together, up to READ_PIECE bytes
            while j < n and offsets[j + 1] - start <= self.READ_PIECE:
                j += 1
            f.seek(start)
            block = f.read(offsets[j] - start)
            for i in range(k, j):
                yield self._frame(i, block, offsets[i] - start, offsets[i + 1] - start, start)
            k = j

    def _check_head(self, k: int, head: bytes, at: int, start: int, stop: int
                    ) -> tuple[int, int, int]:
        """(body length, crc, entry count) of frame k from its header at `head[at:]`,
        which must match the index (file bytes start .. stop)."""
        index = self.frames
        if len(head) < at + FRAME.size + BATCH.size:
            raise errors.DataLoss(f"{self.path}: WAL ends before byte {stop}")
        length, crc = FRAME.unpack_from(head, at)
        first = index.firsts[k]
        count = (index.firsts[k + 1] if k + 1 < len(index) else index.entries) - first
        if (length != stop - start - FRAME.size
                or BATCH.unpack_from(head, at + FRAME.size) != (first, count, index.pubs[k])):
            raise errors.ChecksumError(f"{self.path}: WAL frame at byte {start} does not "
                                       "match its index")
        return length, crc, count

    def _frame(self, k: int, block: bytes, lo: int, hi: int, base: int
               ) -> tuple[int, Sequence[Buffer]]:
        """Frame k, at block[lo:hi] (file offset `base` + lo)."""
        length, crc, count = self._check_head(k, block, lo, base + lo, base + hi)
        body = block[lo + FRAME.size:hi]
        if len(body) != length or google_crc32c.value(body) != crc:
            raise errors.ChecksumError(f"{self.path}: WAL frame at byte {base + lo} is "
                                       "damaged")
        if length - BATCH.size >= count * self.MAP_BYTES:  # large messages: map them
            spans = message_spans(body, BATCH.size, length)
            if spans is not None and len(spans) == count:
                at = base + lo + FRAME.size
                self._mapped += length
                return self.frames.pubs[k], [self._view[at + o:at + o + m] for o, m in spans]
        return self._decode(k, body, base + lo)

    def _large_frame(self, k: int, start: int, stop: int) -> tuple[int, Sequence[Buffer]]:
        """Frame k, larger than READ_PIECE: its CRC checked a piece at a time and its
        messages located in the mapping, so it is never copied whole."""
        f = self._f
        f.seek(start)
        head = f.read(FRAME.size + BATCH.size)
        length, crc, count = self._check_head(k, head, 0, start, stop)
        crc_now = google_crc32c.value(head[FRAME.size:])
        left = length - BATCH.size
        while left > 0:
            piece = f.read(min(left, self.READ_PIECE))
            if not piece:
                break
            crc_now = google_crc32c.extend(crc_now, piece)
            left -= len(piece)
        if left or crc_now != crc:
            raise errors.ChecksumError(f"{self.path}: WAL frame at byte {start} is damaged")
        at = start + FRAME.size
        if length - BATCH.size >= count * self.MAP_BYTES:
            spans = message_spans(self._view, at + BATCH.size, at + length)
            if spans is not None and len(spans) == count:
                self._mapped += length
                return self.frames.pubs[k], [self._view[o:o + m] for o, m in spans]
        f.seek(at)
        return self._decode(k, f.read(length), start)

    def _decode(self, k: int, body: bytes, start: int) -> tuple[int, Sequence[Buffer]]:
        try:
            _first, publish_ms, raws = parse_body(body)
        except Exception as exc:  # noqa: BLE001
            raise errors.ChecksumError(f"{self.path}: WAL frame at byte {start}: "
                                       f"{exc}") from None
        return publish_ms, raws

    def drop_pages(self) -> None:
        """Unmap the pages read so far from this process (they stay in the page cache)."""
        self._mapped = 0
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Unmap the file (at once, or once the last view of it is gone) and close it."""
        if self._map is None:
            return
        self._view.release()
        try:
            self._map.close()
        except BufferError:  # a view is still referenced: the mapping goes with it
            pass
        self._map = None
        self._f.close()


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WalFile:
    """An open WAL file: `create` writes and fsyncs the header (and the directory entry);
    `write_sync` appends frames and fdatasyncs (call it from a worker thread)."""

    def __init__(self, path: str, fd: int, size: int):
        self.path = path
        self._fd = fd
        self._size = size  # bytes known durable; a failed write is cut back to this
        self.broken = False  # a failed write could not be cut off: append nothing more

    @property
    def size(self) -> int:
        """File length after the last successful write (where the next frame goes)."""
        return self._size

    @classmethod
    def create(cls, path: str, ledger_id: int) -> WalFile:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            os.write(fd, encode_header(ledger_id))
            os.fsync(fd)
            fsync_dir(os.path.dirname(path))
        except OSError:  # a full disk: no half-made WAL stays behind
            os.close(fd)
            try:
                os.remove(path)
            except OSError:
                pass
            raise
        return cls(path, fd, HEADER.size)

    def write_sync(self, data: bytes) -> None:
        """Append and fdatasync (refused once `broken`). On failure (e.g. ENOSPC) the partial
        frame is cut off so later frames never sit behind garbage, and the OSError propagates
        (nothing acked)."""
        self._append(data, sync=True)

    def _append(self, data: bytes, sync: bool) -> None:
        if self.broken:
            raise OSError(5, "WAL is broken after a failed write")
        try:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            if sync:
                os.fdatasync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                self.broken = True
            raise
        self._size += len(data)

    def write(self, data: bytes) -> None:
        """Append without an fsync (a local copy of what a WAL on object storage makes
        durable: source/ledger/wal_sink.py); on failure the partial frame is cut off."""
        self._append(data, sync=False)

    def cut_back(self, size: int) -> None:
        """Cut the file back to `size` bytes (frames written but never made durable);
        `broken` when it cannot be cut."""
        try:
            os.ftruncate(self._fd, size)
        except OSError:
            self.broken = True
            raise
        self._size = size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
