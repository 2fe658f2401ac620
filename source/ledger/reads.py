"""The read side of a managed ledger (the LedgerView of source/ledger/view.py).

Unsealed ledgers are read from memory (`_mem`: the entries confirmed after fsync), sealed
ones from their Parquet file. A read works on a copy of the ledger list but re-checks each
ledger in the live list before touching storage, so a ledger that seals meanwhile is read
from Parquet and one that retention deleted meanwhile is skipped, never mistaken for empty.
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from concurrent.futures import Executor

from source.core import errors
from source.core.message_id import MessageId
from source.ledger import wal as walmod
from source.ledger.sealed import SealedLedger
from source.ledger.storage import Storage
from source.ledger.view import ReadEntry
from source.pb.storage.v1 import metadata_pb2 as mpb

OPEN, SEALED = mpb.LedgerState.OPEN, mpb.LedgerState.SEALED


class LedgerReads:
    """Mixin: needs `_list` (LedgerList), `_mem`, `_sealed`, `_current`, `_waiter`,
    `storage` and `_executor`, which ManagedLedger sets."""

    _list: mpb.LedgerList
    _mem: dict[int, walmod.Entries]
    _sealed: OrderedDict[int, SealedLedger]
    _waiter: asyncio.Future | None
    storage: Storage
    _executor: Executor

    def ledgers(self) -> list[mpb.LedgerInfo]:
        """The ledger list, with the live entry counts of unsealed ledgers filled in."""
        out = []
        for info in self._list.ledgers:
            mem = self._mem.get(info.ledger_id)
            if mem is not None:
                info = mpb.LedgerInfo(ledger_id=info.ledger_id, state=OPEN,
                                      wal_path=info.wal_path, created_ms=info.created_ms,
                                      entries=len(mem), size_bytes=mem.size)
            out.append(info)
        return out

    def _count(self, info: mpb.LedgerInfo) -> int:
        mem = self._mem.get(info.ledger_id)
        return len(mem) if mem is not None else (info.entries if info.state == SEALED else 0)

    def first_position(self) -> MessageId | None:
        for info in self._list.ledgers:
            if self._count(info):
                return MessageId(info.ledger_id, 0)
        return None

    def last_confirmed(self) -> MessageId | None:
        for info in reversed(self._list.ledgers):
            n = self._count(info)
            if n:
                return MessageId(info.ledger_id, n - 1)
        return None

    def next_position(self) -> MessageId:
        cur = self._current
        return MessageId(cur.ledger_id, len(cur.entries))

    def storage_size(self) -> int:
        return sum(i.size_bytes for i in self.ledgers())

    def number_of_entries(self) -> int:
        return sum(self._count(i) for i in self._list.ledgers)

    @property
    def entries_deleted(self) -> int:
        return self._list.entries_deleted

    @property
    def current_ledger(self) -> tuple[int, int, int]:
        cur = self._current
        return cur.ledger_id, len(cur.entries), cur.entries.size

    async def read(self, start: MessageId, max_entries: int, max_bytes: int) -> list[ReadEntry]:
        out: list[ReadEntry] = []
        size = 0
        for info in list(self._list.ledgers):
            lid = info.ledger_id
            if lid < start.ledger_id:
                continue
            first = start.entry_id if lid == start.ledger_id else 0
            want = max_entries - len(out)
            mem = self._mem.get(lid)
            if mem is not None:
                stop = min(len(mem), first + want)
                for i in range(first, stop):
                    raw = mem.raws[i]
                    out.append(ReadEntry(lid, i, mem.publish_ms[i], raw))
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
        for info in self._list.ledgers:
            if info.ledger_id == lid:
                return info
        return None

    async def _open_sealed(self, info: mpb.LedgerInfo) -> SealedLedger:
        reader = self._sealed.get(info.ledger_id)
        if reader is None:
            loop = asyncio.get_running_loop()
            reader = await loop.run_in_executor(self._executor, SealedLedger, self.storage.fs,
                                                self.storage.full(info.path), info.crc32c)
            self._sealed[info.ledger_id] = reader
            while len(self._sealed) > 4:
                self._sealed.popitem(last=False)  # its file closes when no read holds it
        else:
            self._sealed.move_to_end(info.ledger_id)
        return reader

    async def wait_for_entries(self, position: MessageId, timeout: float) -> bool:
        def ready() -> bool:
            last = self.last_confirmed()
            return last is not None and last >= position
        if ready():
            return True
        if self._waiter is None or self._waiter.done():
            self._waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._waiter), timeout)
        except asyncio.TimeoutError:
            pass
        return ready()
