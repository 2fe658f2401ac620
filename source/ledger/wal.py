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
that is short, fails its CRC or breaks the numbering, truncates the file there and returns
every entry before it.

An owner that dropped entries from memory (source/ledger/entry_cache.py) reads them back by
frame: `FrameIndex` records where each frame starts (the writer fills it as it writes; a
reader without the writer scans frame headers), and `read_frames` decodes just the frames
of a byte range, each checked against its CRC.
"""
from __future__ import annotations

import bisect
import os
import struct
from array import array
from dataclasses import dataclass, field

import google_crc32c

from source.core import errors
from source.pb.storage.v1 import views_pb2

MAGIC = b"STWAL002"
HEADER = struct.Struct("<8sQ")
FRAME = struct.Struct("<II")
BATCH = struct.Struct("<QIq")
MAX_FRAME = 256 << 20


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


def parse_body(body: bytes) -> tuple[int, int, list[bytes]]:
    """A frame body as (first_entry_id, publish_ms, raws)."""
    first, count, publish_ms = BATCH.unpack_from(body, 0)
    raws = list(views_pb2.RawProduceRequest.FromString(body[BATCH.size:]).messages)
    if len(raws) != count:
        raise ValueError("frame count does not match its messages")
    return first, publish_ms, raws


def decode_body(body: bytes, entries: Entries) -> tuple[int, int]:
    """Append a frame body's entries to `entries`; return (first_entry_id, count)."""
    first, publish_ms, raws = parse_body(body)
    entries.extend(publish_ms, raws, sum(map(len, raws)))
    return first, len(raws)


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
    entries: Entries
    valid_bytes: int     # file length after truncation
    truncated_bytes: int  # bytes cut off the torn tail


def recover(path: str, truncate: bool = True) -> Recovered:
    """Read every valid frame; cut the file at the first invalid one (torn tail)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER.size or data[:8] != MAGIC:
        raise ValueError(f"{path}: not a shadowtopic WAL (bad header)")
    _, ledger_id = HEADER.unpack_from(data, 0)
    entries = Entries()
    pos = HEADER.size
    while pos + FRAME.size <= len(data):
        length, crc = FRAME.unpack_from(data, pos)
        end = pos + FRAME.size + length
        if length < BATCH.size or length > MAX_FRAME or end > len(data):
            break
        body = data[pos + FRAME.size:end]
        if google_crc32c.value(body) != crc:
            break
        first = BATCH.unpack_from(body, 0)[0]
        if first != len(entries):
            break
        try:
            decode_body(body, entries)
        except Exception:  # noqa: BLE001 - a body that does not parse ends the valid log
            break
        pos = end
    cut = len(data) - pos
    if cut and truncate:
        with open(path, "r+b") as f:
            f.truncate(pos)
            f.flush()
            os.fsync(f.fileno())
    return Recovered(ledger_id, entries, pos, cut)


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
    def create(cls, path: str, ledger_id: int) -> "WalFile":
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        os.write(fd, encode_header(ledger_id))
        os.fsync(fd)
        fsync_dir(os.path.dirname(path))
        return cls(path, fd, HEADER.size)

    def write_sync(self, data: bytes) -> None:
        """Append and fdatasync (refused once `broken`). On failure (e.g. ENOSPC) the partial frame is cut off so
        later frames never sit behind garbage, and the OSError propagates (nothing acked)."""
        if self.broken:
            raise OSError(5, "WAL is broken after a failed write")
        try:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            os.fdatasync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                self.broken = True
            raise
        self._size += len(data)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
