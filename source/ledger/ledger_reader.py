"""Reads by MessageId over a ledger list: the read half of every `LedgerView`.

`LedgerListReader` knows nothing of who writes the ledgers: it takes the current ledger list
(a callable, so it always sees the live list), the in-memory entries of unsealed ledgers
(`tail`), and how many entries of an unsealed ledger are confirmed (`confirmed`). The
source's `ManagedLedger` gives it its own list and memory; a shadow's ledger gives it the
source's list from etcd and the ids the replicator confirmed.

Where entries come from, newest first:
- memory (`tail(ledger_id)`): entries confirmed after their fsync, from its `offset` on
  (the broker's entry cache drops the oldest ones: source/ledger/entry_cache.py);
- the WAL of an unsealed ledger, for entries not in memory: only the frames holding them
  are read (found through the tail's `FrameIndex`, or one this reader builds by scanning
  frame headers), CRC-checked, never beyond the confirmed count; decoded frames are kept
  in a small cache charged to the same `EntryCache`;
- the sealed ledger's Parquet file (a few open files in an LRU).
An entry reads byte-identical from any of them.
A reader that may not have the WAL of an unsealed ledger (a shadow broker on another
machine than its source's owner) is given `unsealed` (`UnsealedReads`): its reads and
publish times of unsealed entries not in memory go there instead of the WAL; `read_wal`
and `wal_publish_times` are the WAL's own, for such an `unsealed` to fall back on.
A read works on a copy of the list but re-checks each ledger in the live list before
touching storage, so a ledger that sealed meanwhile is read from Parquet and one that
retention deleted meanwhile is skipped, never mistaken for empty.
"""
from __future__ import annotations

import asyncio
import bisect
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Protocol

import pyarrow as pa

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.ledger import wal as walmod
from shadowtopic.ledger.entry_cache import EntryCache, Item, TailEntries
from shadowtopic.ledger.sealed import SealedLedger
from shadowtopic.ledger.storage import Storage
from shadowtopic.ledger.view import LedgerRange, ReadEntry
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

SEALED = mpb.LedgerState.SEALED
OPEN_FILES = 4
READER_CACHE_BYTES = 16 << 20  # WAL frames a reader given no broker cache keeps

#: a decoded WAL frame: (first_entry_id, publish_ms, raws)
_Frame = tuple[int, int, list[bytes]]


class UnsealedReads(Protocol):
    """Where a reader reads the confirmed entries of an unsealed ledger it holds no memory
    of, instead of the ledger's WAL (shadow/tail.py)."""

    async def read(self, info: mpb.LedgerInfo, first: int, count: int,
                   max_bytes: int) -> list[ReadEntry]:
        """Entries first .. first+count-1 (fewer once `max_bytes` of raw are read, at
        least one), in order. Raises DataLoss when they cannot be read."""

    async def publish_times(self, info: mpb.LedgerInfo, count: int) -> list[int]:
        """The publish times of the ledger's first `count` entries (at least)."""


class LedgerListReader:
    def __init__(self, storage: Storage, executor: Executor,
                 ledgers: Callable[[], Sequence[mpb.LedgerInfo]],
                 tail: Callable[[int], TailEntries | None] = lambda lid: None,
                 confirmed: Callable[[mpb.LedgerInfo], int] = lambda info: info.entries,
                 cache: EntryCache | None = None, unsealed: UnsealedReads | None = None):
        self.storage = storage
        self._unsealed = unsealed
        self._executor = executor
        self._ledgers = ledgers
        self._tail = tail
        self._confirmed = confirmed
        self.cache = cache if cache is not None else EntryCache(READER_CACHE_BYTES)
        self._sealed: OrderedDict[int, SealedLedger] = OrderedDict()
        self._indexes: dict[int, walmod.FrameIndex] = {}  # scanned WALs of tail-less ledgers
        # decoded WAL frames by ledger and first entry id: (publish_ms, raws, cache item)
        self._frames: dict[int, dict[int, tuple[int, list[bytes], Item]]] = {}

    # ---- positions -------------------------------------------------------------------------

    def count(self, info: mpb.LedgerInfo) -> int:
        mem = self._tail(info.ledger_id)
        if mem is not None:
            return len(mem)
        return info.entries if info.state == SEALED else self._confirmed(info)

    def ranges(self) -> list[LedgerRange]:
        out = []
        for info in self._ledgers():
            mem = self._tail(info.ledger_id)
            size = mem.size if mem is not None else info.size_bytes
            out.append(LedgerRange(info.ledger_id, self.count(info), info.state == SEALED, size))
        return out

    def first_position(self) -> MessageId | None:
        for info in self._ledgers():
            if self.count(info):
                return MessageId(info.ledger_id, 0)
        return None

    def last_confirmed(self) -> MessageId | None:
        for info in reversed(self._ledgers()):
            n = self.count(info)
            if n:
                return MessageId(info.ledger_id, n - 1)
        return None

    def valid_position(self, position: MessageId, next_position: MessageId) -> MessageId:
        """First position >= `position` holding an entry, else `next_position` (clamped)."""
        for info in self._ledgers():
            lid = info.ledger_id
            if lid < position.ledger_id:
                continue
            n = self.count(info)
            first = position.entry_id if lid == position.ledger_id else 0
            if first < n:
                return MessageId(lid, first)
        return max(MessageId(position.ledger_id, position.entry_id), next_position)

    def entries_between(self, start: MessageId, end: MessageId) -> int:
        total = 0
        for info in self._ledgers():
            lid = info.ledger_id
            if lid < start.ledger_id or lid > end.ledger_id:
                continue
            n = self.count(info)
            lo = start.entry_id if lid == start.ledger_id else 0
            hi = min(n, end.entry_id) if lid == end.ledger_id else n
            total += max(0, hi - lo)
        return total

    async def position_at_time(self, publish_ms: int) -> MessageId | None:
        """The first entry published at or after `publish_ms`, or None."""
        for info in list(self._ledgers()):
            n = self.count(info)
            if not n or (info.state == SEALED and info.last_publish_ms < publish_ms):
                continue
            times = await self._publish_times(info)
            i = bisect.bisect_left(times, publish_ms, 0, min(n, len(times)))
            if i < min(n, len(times)):
                return MessageId(info.ledger_id, i)
        return None

    async def _publish_times(self, info: mpb.LedgerInfo) -> list[int]:
        mem = self._tail(info.ledger_id)
        if mem is not None:
            return mem.publish_ms
        if info.state != SEALED:
            if self._unsealed is not None:
                return await self._unsealed.publish_times(info, self._confirmed(info))
            return await self.wal_publish_times(info, self._confirmed(info))
        reader = await self._open_sealed(info)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, reader.publish_times)

    # ---- reads -----------------------------------------------------------------------------

    async def read(self, start: MessageId, max_entries: int, max_bytes: int) -> list[ReadEntry]:
        out: list[ReadEntry] = []
        size = 0
        for info in list(self._ledgers()):
            lid = info.ledger_id
            if lid < start.ledger_id:
                continue
            first = start.entry_id if lid == start.ledger_id else 0
            want = max_entries - len(out)
            mem = self._tail(lid)
            if mem is not None or (info.state != SEALED and first < self._confirmed(info)):
                short = False
                try:
                    if mem is None and self._unsealed is not None:
                        n = min(want, self._confirmed(info) - first)
                        got = await self._unsealed.read(info, first, n, max_bytes - size)
                        got_size = sum(len(e.raw) for e in got)
                        short = len(got) < n  # never read on past a gap
                    else:
                        got, got_size = await self._read_unsealed(info, mem, first, want,
                                                                  max_bytes - size)
                except errors.DataLoss:
                    live = self._live(lid)  # its WAL is gone: sealed or deleted meanwhile?
                    if live is not None and live.state != SEALED:
                        raise
                else:
                    out += got
                    size += got_size
                    if short or len(out) >= max_entries or size >= max_bytes:
                        break
                    continue
            sealed = self._live(lid)  # it may have sealed or gone since the copy
            if sealed is None or sealed.state != SEALED or first >= sealed.entries:
                continue
            try:
                reader = await self._open_sealed(sealed)
            except errors.DataLoss:
                if self._live(lid) is None:  # deleted by retention meanwhile: skip
                    continue
                raise
            loop = asyncio.get_running_loop()
            pubs, raws = await loop.run_in_executor(self._executor, reader.read, first,
                                                    want, max_bytes - size)
            for i, (p, r) in enumerate(zip(pubs, raws, strict=True)):
                out.append(ReadEntry(lid, first + i, p, r))
                size += len(r)
            if len(out) >= max_entries or size >= max_bytes:
                break
        return out

    async def read_columns(self, start: MessageId, max_entries: int) -> pa.Table | None:
        """The entries of a sealed ledger from `start` (at most `max_entries`, within that
        ledger) as Arrow columns read from its file; None when `start` is not in a sealed
        ledger (the caller reads entries with `read`)."""
        sealed = self._live(start.ledger_id)
        if sealed is None or sealed.state != SEALED or start.entry_id >= sealed.entries or \
                self._tail(start.ledger_id) is not None:
            return None
        reader = await self._open_sealed(sealed)
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, reader.read_columns, start.entry_id, max_entries)

    async def _read_unsealed(self, info: mpb.LedgerInfo, mem: TailEntries | None,
                             first: int, want: int, max_bytes: int
                             ) -> tuple[list[ReadEntry], int]:
        """Entries first .. of an unsealed ledger: from memory from `mem.offset` on, below
        it (or with no memory at all) from the WAL. Raises DataLoss when the WAL is gone."""
        lid = info.ledger_id
        stop = min(len(mem) if mem is not None else self._confirmed(info), first + want)
        out: list[ReadEntry] = []
        size = 0
        i = first
        while i < stop and size < max_bytes:
            if mem is not None and i >= mem.offset:  # no await from here: offset holds
                raws, pubs, off = mem.raws, mem.publish_ms, mem.offset
                for j in range(i, stop):
                    raw = raws[j - off]
                    out.append(ReadEntry(lid, j, pubs[j], raw))
                    size += len(raw)
                    if size >= max_bytes:
                        break
                break
            hi = stop if mem is None else min(stop, mem.offset)
            index = mem.frames if mem is not None else await self._scanned(info, hi)
            frames = await self._read_frames(info, index, i, hi, max_bytes - size)
            before = i
            for f_first, pub, raws in frames:
                if f_first > i:
                    break
                for j in range(i, min(hi, f_first + len(raws))):
                    raw = raws[j - f_first]
                    out.append(ReadEntry(lid, j, pub, raw))
                    size += len(raw)
                    i = j + 1
                    if size >= max_bytes:
                        break
                if size >= max_bytes or i >= hi:
                    break
            if i == before:
                raise errors.DataLoss(f"WAL of ledger {lid} does not hold entry {i}")
        return out, size

    async def read_wal(self, info: mpb.LedgerInfo, first: int, count: int,
                       max_bytes: int) -> list[ReadEntry]:
        """Confirmed entries first .. first+count-1 of an unsealed ledger, from its WAL
        (DataLoss when the WAL is gone)."""
        return (await self._read_unsealed(info, None, first, count, max_bytes))[0]

    async def wal_publish_times(self, info: mpb.LedgerInfo, entries: int) -> list[int]:
        """Publish times of an unsealed ledger's first `entries` entries, from its WAL's
        frame headers (DataLoss when the WAL is gone)."""
        return (await self._scanned(info, entries)).publish_times()

    def _live(self, lid: int) -> mpb.LedgerInfo | None:
        for info in self._ledgers():
            if info.ledger_id == lid:
                return info
        return None

    def forget(self, ledger_id: int) -> None:
        """Drop cached readers of a deleted ledger."""
        self._sealed.pop(ledger_id, None)
        self.forget_wal(ledger_id)

    def forget_wal(self, ledger_id: int) -> None:
        """Drop what was cached of a ledger's WAL (it sealed, or it was deleted)."""
        self._indexes.pop(ledger_id, None)
        frames = self._frames.pop(ledger_id, None)
        if frames:
            for item in {id(f[2]): f[2] for f in frames.values()}.values():
                self.cache.release(item)

    def forget_wals(self) -> None:
        """Drop every cached WAL frame and index (the ledger closed)."""
        for lid in list(self._frames) + list(self._indexes):
            self.forget_wal(lid)

    async def _open_sealed(self, info: mpb.LedgerInfo) -> SealedLedger:
        reader = self._sealed.get(info.ledger_id)
        if reader is None:
            loop = asyncio.get_running_loop()
            reader = await loop.run_in_executor(self._executor, SealedLedger, self.storage.fs,
                                                self.storage.full(info.path), info.crc32c)
            self._sealed[info.ledger_id] = reader
            while len(self._sealed) > OPEN_FILES:
                self._sealed.popitem(last=False)  # its file closes when no read holds it
        else:
            self._sealed.move_to_end(info.ledger_id)
        return reader

    async def _scanned(self, info: mpb.LedgerInfo, entries: int) -> walmod.FrameIndex:
        """The frame index of a ledger this reader has no tail of, scanned on from where
        it stopped until it covers `entries` entries (or the file ends)."""
        lid = info.ledger_id
        index = self._indexes.get(lid)
        if index is None:
            index = self._indexes[lid] = walmod.FrameIndex()
        if index.entries < entries:
            start, next_id = index.end, index.entries
            loop = asyncio.get_running_loop()
            try:
                found = await loop.run_in_executor(
                    self._executor, walmod.scan_frames, self.storage.wal_path(info.wal_path),
                    start, next_id)
            except FileNotFoundError:
                raise errors.DataLoss(f"WAL of ledger {lid} is missing: "
                                      f"{info.wal_path}") from None
            except ValueError as exc:
                raise errors.DataLoss(f"WAL of ledger {lid}: {exc}") from None
            if index.end == start and index.entries == next_id:  # no other scan meanwhile
                for frame in found:
                    index.add(*frame)
        return index

    async def _read_frames(self, info: mpb.LedgerInfo, index: walmod.FrameIndex, lo: int,
                           hi: int, max_bytes: int) -> list[tuple[int, int, list[bytes]]]:
        """The whole frames holding entries lo .. hi-1 (fewer once `max_bytes` of frames
        are picked, at least one) as (first_entry_id, publish_ms, raws): from this
        reader's frame cache, the others read from the WAL in one go and cached."""
        lid = info.ledger_id
        k = index.frame_of(lo)
        if k < 0:
            raise errors.DataLoss(f"WAL of ledger {lid}: entry {lo} is not in its index")
        cached = self._frames.get(lid, {})
        out: list[_Frame | None] = []  # every None is filled in from `decoded`
        missing: list[tuple[int, int]] = []  # (position in out, frame index)
        spans: list[list[int]] = []
        nbytes = 0
        while k < len(index) and index.firsts[k] < hi and (not out or nbytes < max_bytes):
            first = index.firsts[k]
            start, stop = index.span(k)
            hit = cached.get(first)
            if hit is not None:
                self.cache.touch(hit[2])
                out.append((first, hit[0], hit[1]))
            else:
                missing.append((len(out), k))
                out.append(None)
                if spans and spans[-1][1] == start:
                    spans[-1][1] = stop
                else:
                    spans.append([start, stop])
            nbytes += stop - start
            k += 1
        if not missing:
            return [f for f in out if f is not None]
        loop = asyncio.get_running_loop()
        try:
            decoded = await loop.run_in_executor(
                self._executor, walmod.read_frames, self.storage.wal_path(info.wal_path),
                [(start, stop) for start, stop in spans])
        except FileNotFoundError:
            raise errors.DataLoss(f"WAL of ledger {lid} is missing: {info.wal_path}") from None
        if len(decoded) != len(missing):
            raise errors.DataLoss(f"WAL of ledger {lid}: frames do not match its index")
        cached = self._frames.get(lid, {})
        new, total = [], 0
        for (pos, k), frame in zip(missing, decoded, strict=True):
            if frame[0] != index.firsts[k]:
                raise errors.DataLoss(f"WAL of ledger {lid}: frame of entry {frame[0]} where "
                                      f"{index.firsts[k]} was indexed")
            out[pos] = frame
            if frame[0] not in cached:  # another read may have cached it meanwhile
                new.append(frame)
                total += sum(map(len, frame[2]))
        if new:
            item = self.cache.charge(total, self._frames_evicted, (lid, [f[0] for f in new]))
            if item.live:
                cached = self._frames.setdefault(lid, {})
                for first, pub, raws in new:
                    cached[first] = (pub, raws, item)
        return [f for f in out if f is not None]

    def _frames_evicted(self, item: Item) -> None:
        lid, firsts = item.data
        cached = self._frames.get(lid)
        if cached is None:
            return
        for first in firsts:
            hit = cached.get(first)
            if hit is not None and hit[2] is item:
                del cached[first]
        if not cached:
            del self._frames[lid]
