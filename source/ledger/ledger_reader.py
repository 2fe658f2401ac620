"""Reads by MessageId over a ledger list: the read half of every `LedgerView`.

`LedgerListReader` knows nothing of who writes the ledgers: it takes the current ledger list
(a callable, so it always sees the live list), the in-memory entries of unsealed ledgers
(`tail`), and how many entries of an unsealed ledger are confirmed (`confirmed`). The
source's `ManagedLedger` gives it its own list and memory; a shadow's ledger gives it the
source's list from etcd and the ids the replicator confirmed.

Where entries come from, newest first:
- memory (`tail(ledger_id)`): entries confirmed after their fsync;
- the WAL of an unsealed ledger whose entries are not in memory (re-read from the file,
  up to the confirmed count, cached by file size);
- the sealed ledger's Parquet file (a few open files in an LRU).
A read works on a copy of the list but re-checks each ledger in the live list before
touching storage, so a ledger that sealed meanwhile is read from Parquet and one that
retention deleted meanwhile is skipped, never mistaken for empty.
"""
from __future__ import annotations

import asyncio
import bisect
import os
from collections import OrderedDict
from concurrent.futures import Executor
from typing import Callable, Sequence

from source.core import errors
from source.core.message_id import MessageId
from source.ledger import wal as walmod
from source.ledger.sealed import SealedLedger
from source.ledger.storage import Storage
from source.ledger.view import LedgerRange, ReadEntry
from source.pb.storage.v1 import metadata_pb2 as mpb

SEALED = mpb.LedgerState.SEALED
OPEN_FILES = 4


class LedgerListReader:
    def __init__(self, storage: Storage, executor: Executor,
                 ledgers: Callable[[], Sequence[mpb.LedgerInfo]],
                 tail: Callable[[int], walmod.Entries | None] = lambda lid: None,
                 confirmed: Callable[[mpb.LedgerInfo], int] = lambda info: info.entries):
        self.storage = storage
        self._executor = executor
        self._ledgers = ledgers
        self._tail = tail
        self._confirmed = confirmed
        self._sealed: OrderedDict[int, SealedLedger] = OrderedDict()
        self._wal_cache: dict[int, tuple[int, walmod.Entries]] = {}

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
            return (await self._wal_entries(info)).publish_ms
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
            if mem is None and info.state != SEALED and first < self._confirmed(info):
                mem = await self._wal_entries(info)
            if mem is not None:
                stop = min(self.count(info), len(mem), first + want)
                raws, pubs = mem.raws, mem.publish_ms
                for i in range(first, stop):
                    raw = raws[i]
                    out.append(ReadEntry(lid, i, pubs[i], raw))
                    size += len(raw)
                    if size >= max_bytes:
                        break
            else:
                info = self._live(lid)  # it may have sealed or gone since the copy
                if info is None or info.state != SEALED or first >= info.entries:
                    continue
                try:
                    reader = await self._open_sealed(info)
                except errors.DataLoss:
                    if self._live(lid) is None:  # deleted by retention meanwhile: skip
                        continue
                    raise
                loop = asyncio.get_running_loop()
                pubs, raws = await loop.run_in_executor(self._executor, reader.read, first,
                                                        want, max_bytes - size)
                for i, (p, r) in enumerate(zip(pubs, raws)):
                    out.append(ReadEntry(lid, first + i, p, r))
                    size += len(r)
            if len(out) >= max_entries or size >= max_bytes:
                break
        return out

    def _live(self, lid: int) -> mpb.LedgerInfo | None:
        for info in self._ledgers():
            if info.ledger_id == lid:
                return info
        return None

    def forget(self, ledger_id: int) -> None:
        """Drop cached readers of a deleted ledger."""
        self._sealed.pop(ledger_id, None)
        self._wal_cache.pop(ledger_id, None)

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

    async def _wal_entries(self, info: mpb.LedgerInfo) -> walmod.Entries:
        """An unsealed ledger's entries re-read from its WAL (cached while the file does not
        grow). Only the first `confirmed` of them are ever served."""
        path = self.storage.wal_path(info.wal_path)
        loop = asyncio.get_running_loop()

        def load() -> tuple[int, walmod.Entries]:
            try:
                size = os.path.getsize(path)
            except FileNotFoundError:
                raise errors.DataLoss(f"WAL of ledger {info.ledger_id} is missing: "
                                      f"{info.wal_path}") from None
            cached = self._wal_cache.get(info.ledger_id)
            if cached is not None and cached[0] == size:
                return cached
            return size, walmod.recover(path, truncate=False).entries

        size, entries = await loop.run_in_executor(self._executor, load)
        self._wal_cache[info.ledger_id] = (size, entries)
        return entries
