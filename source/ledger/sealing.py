"""Sealing a `ManagedLedger`'s ledgers to Parquet, and taking over a previous owner's.

- seal: a ledger that takes no more appends (rolled and drained, or left OPEN by a previous
  owner) is written to Parquet from its WAL, streamed a frame at a time (the file format:
  source/ledger/sealed.py), then marked SEALED in the ledger list; only then are its WAL
  and its in-memory entries dropped. An empty ledger leaves the list instead.
- open: every OPEN ledger left by a previous owner is recovered from its WAL (torn tail cut)
  and sealed before this owner starts a new ledger. Then the topic's files the ledger list
  does not name are deleted (the sweep), still before this owner creates any file.
"""
from __future__ import annotations

import asyncio
import functools
import logging

from source import failpoints
from source.ledger import retention
from source.ledger import wal as walmod
from source.ledger.entry_cache import TailEntries
from source.ledger.ledger_list import OPEN, now_ms
from source.ledger.sealed import mark_sealed, seal_wal
from source.pb.storage.v1 import metadata_pb2 as mpb

# The ManagedLedger's parts log under one name, as it did when it was a single module.
log = logging.getLogger("source.ledger.managed")


class Sealing:
    """The ManagedLedger's sealing, and its taking over of a topic when it opens.

    A part of `ManagedLedger` (source/ledger/managed.py), which sets up the state used here
    (`_list`, `_mem`, `reader`, `storage`, ...) and provides `_update_list` and
    `_create_ledger`.
    """

    # ---- taking over -----------------------------------------------------------------------

    async def _load(self) -> None:
        """Read the ledger list, recover and seal every OPEN ledger, sweep orphan files, then
        start this owner's first ledger."""
        kv = await self.store.get(self._list_key)
        if kv is not None:
            self._list.ParseFromString(kv.value)
            self._list_rev = kv.mod_revision
        for info in self._list.ledgers:
            if info.state == mpb.LedgerState.LEDGER_STATE_UNSPECIFIED:
                info.state = OPEN  # written before LedgerState had a zero value of its own
        for info in [i for i in self._list.ledgers if i.state == OPEN]:
            await self._recover(info)
        await asyncio.get_running_loop().run_in_executor(self._executor, self._sweep)
        self._current = await self._create_ledger()

    def _sweep(self) -> None:
        """Delete this topic's files that the ledger list does not name: a WAL left after
        its ledger's SEALED CAS, a Parquet file after a retention CAS, a `.tmp` of a seal
        cut short.

        Safe here: the new owner runs it before it creates any file itself.
        """
        keep = {i.path for i in self._list.ledgers if i.path}
        keep |= {i.wal_path for i in self._list.ledgers if i.wal_path}
        for rel_dir in (self.storage.topic_sealed_dir(self.topic),
                        self.storage.topic_wal_dir(self.topic)):
            for rel in self.storage.list_dir(rel_dir):
                if rel not in keep:
                    log.info("%s: removing orphan file %s", self.topic, rel)
                    if rel.startswith("wal/"):
                        self.storage.delete_wal(rel)
                    else:
                        self.storage.delete(rel)

    async def _recover(self, info: mpb.LedgerInfo) -> None:
        """Seal an OPEN ledger left by a previous owner from its WAL (cutting a torn tail).

        A WAL that is not there was never created or is already removed: with WALs under
        the root every broker shares, the ledger leaves the list; with WALs on each
        broker's own disk it is on the previous owner's, and the ledger stays OPEN.
        """
        path = self.storage.wal_path(info.wal_path)
        loop = asyncio.get_running_loop()
        try:  # only the frame index: the seal reads the entries back a frame at a time
            rec = await loop.run_in_executor(self._executor, lambda: walmod.recover(
                path, keep_raws=False))
        except FileNotFoundError:
            if self.storage.shared_wal:  # the WAL was never created or already removed
                gone = {info.ledger_id}
                await self._update_list(lambda lst: retention.remove_ledgers(lst, gone))
            else:
                log.warning("%s: WAL of open ledger %d is on another broker's disk",
                            self.topic, info.ledger_id)
            return
        if rec.truncated_bytes:
            log.warning("%s: ledger %d: cut %d bytes of torn WAL tail", self.topic,
                        info.ledger_id, rec.truncated_bytes)
        await self._seal(info.ledger_id, info.wal_path, rec.frames, len(rec.entries))

    # ---- sealing ---------------------------------------------------------------------------

    async def _seal(self, lid: int, wal_rel: str, frames: walmod.FrameIndex, count: int
                    ) -> mpb.LedgerInfo | None:
        """Write a ledger that takes no more appends to Parquet from its WAL (the `count`
        entries of `frames`, streamed: source/ledger/sealed.py), then mark it SEALED.

        The WAL and the ledger's in-memory entries go only once the list says SEALED; then
        `on_sealed` hears of it. An empty ledger is removed from the list (None returned).
        """
        if count == 0:
            await self._update_list(lambda lst: retention.remove_ledgers(lst, {lid}))
            self._forget_tail(lid)
            self.storage.delete_wal(wal_rel)
            return None
        rel = self.storage.sealed_rel(self.topic, lid)
        res = await asyncio.get_running_loop().run_in_executor(
            self._executor, functools.partial(
                seal_wal, self.storage.fs, self.storage.full(rel),
                self.storage.wal_path(wal_rel), frames, count, ledger_id=lid))
        failpoints.hit("ledger.seal.before_publish")

        def mark(lst: mpb.LedgerList) -> None:
            for info in lst.ledgers:
                if info.ledger_id == lid:
                    mark_sealed(info, rel, res, now_ms())
            lst.entries_added += res.entries

        await self._update_list(mark)
        self._forget_tail(lid)
        self.storage.delete_wal(wal_rel)
        info = next(i for i in self._list.ledgers if i.ledger_id == lid)
        if self.on_sealed is not None:
            self.on_sealed(info)
        return info

    def _forget_tail(self, lid: int) -> None:
        """Drop an unsealed ledger's in-memory entries and the reader's handle on its WAL."""
        self._mem.pop(lid, TailEntries(self.entry_cache, "")).drop_all()
        self.reader.forget_wal(lid)
