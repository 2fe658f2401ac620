"""Sealing a `ManagedLedger`'s ledgers to Parquet, and taking over a previous owner's.

- seal: a ledger that takes no more appends (rolled and drained, or left OPEN by a previous
  owner) is written to Parquet from its WAL, streamed a frame at a time (the file format:
  source/ledger/sealed.py), then marked SEALED in the ledger list (with the snapshot of the
  producers' sequence ids as of its end: source/ledger/dedup.py); only then are its WAL
  and its in-memory entries dropped. An empty ledger leaves the list instead.
- open: every OPEN ledger left by a previous owner is recovered from its WAL (torn tail cut)
  and sealed before this owner starts a new ledger; its frames' producer sequence ids are
  replayed into the dedup map, which starts from the list's last snapshot. Then the topic's files the ledger list
  does not name are deleted (the sweep), still before this owner creates any file.
- a full or read-only disk (source/ledger/disk.py), or an object store or etcd that fails
  the seal: a seal that cannot write its Parquet file or mark it SEALED keeps its ledger
  OPEN in the list and readable from its WAL (its frame index held as the ledger's
  in-memory entries, its raws dropped), and remembers it in `_unsealed`; `retry_seals`
  seals those ledgers, in order, once the disk takes writes (the broker calls it when its
  probe sees the disk writable again, and from its maintenance loop, every
  `--retention-interval`; a roll calls it too). (A seal cut off by an S3 outage was never
  tried again before: the ledger stayed OPEN until the broker restarted.) A topic that opens on such a disk is served read-only: recovery reads the
  WALs without writing (a torn tail stays, unindexed), the ledgers it cannot seal stay
  open, the sweep skips what it cannot delete, and no new ledger starts (`_current` is
  None) until an append finds the disk writable. Nothing is acknowledged that was not
  fsynced, and nothing fsynced is dropped: a ledger leaves the list, or its WAL the disk,
  only after its Parquet file is written and named SEALED.
"""
from __future__ import annotations

import asyncio
import functools
import logging

from shadowtopic import failpoints
from shadowtopic.core import errors
from shadowtopic.ledger import retention
from shadowtopic.ledger import wal as walmod
from shadowtopic.ledger.entry_cache import TailEntries
from shadowtopic.ledger.ledger_list import OPEN, now_ms
from shadowtopic.ledger.sealed import mark_sealed, seal_wal
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

# The ManagedLedger's parts log under one name, as it did when it was a single module.
log = logging.getLogger("shadowtopic.ledger.managed")
UNWRITABLE = (errors.StorageFull, errors.StorageReadOnly)


class Sealing:
    """The ManagedLedger's sealing, and its taking over of a topic when it opens.

    A part of `ManagedLedger` (source/ledger/managed.py), which sets up the state used here
    (`_list`, `_mem`, `reader`, `storage`, `_unsealed`, `_retry_lock`, ...) and provides
    `_update_list`, `_create_ledger` and `_storage_failure`.
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
        # idempotent producing: the producers' sequences as of the newest seal, then those
        # of every ledger still OPEN, replayed from its WAL (source/ledger/dedup.py)
        self.dedup.load(self._list.dedup)
        for info in [i for i in self._list.ledgers if i.state == OPEN]:
            await self._recover(info)
        await asyncio.get_running_loop().run_in_executor(self._executor, self._sweep)
        try:
            self._current = await self._create_ledger()
        except UNWRITABLE as exc:  # served read-only: the first append tries again
            log.warning("%s: opened without an open ledger (reads only until the disk takes "
                        "writes): %s", self.topic, exc)

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
            log.warning("%s: ledger %d: %d bytes of torn WAL tail are not part of it",
                        self.topic, info.ledger_id, rec.truncated_bytes)
        for name, seq, count, first, publish_ms in rec.sequences:
            self.dedup.record(name, seq, count, info.ledger_id, first, publish_ms)
        self._dedup_snaps[info.ledger_id] = self.dedup.snapshot(info.ledger_id)
        try:
            await self._seal_or_keep(info.ledger_id, info.wal_path, rec.frames,
                                     len(rec.entries), rec.entries)
        except UNWRITABLE:
            pass  # open, and read from its WAL until `retry_seals` seals it

    def _keep_unsealed(self, lid: int, wal_rel: str, frames: walmod.FrameIndex, count: int,
                       recovered: walmod.Entries | None = None) -> None:
        """Serve a ledger that could not be sealed from its WAL, and seal it later."""
        if lid not in self._mem and recovered is not None:
            # recovered without raws: every entry is read back through the frame index
            tail = self._mem[lid] = TailEntries(self.entry_cache, self.storage.wal_path(wal_rel))
            tail.frames = frames
            tail.publish_ms = recovered.publish_ms
            tail.size = recovered.size
            tail.offset = count
        self._unsealed[lid] = (wal_rel, frames, count)

    async def _seal_or_keep(self, lid: int, wal_rel: str, frames: walmod.FrameIndex,
                            count: int, recovered: walmod.Entries | None = None
                            ) -> mpb.LedgerInfo | None:
        """`_seal`; when it fails (a full or read-only disk, an object store or etcd that
        does not answer) the ledger stays open and readable, to be sealed by `retry_seals`
        (the error is raised). Not after the topic was fenced: its next owner seals it."""
        try:
            return await self._seal(lid, wal_rel, frames, count)
        except UNWRITABLE as exc:
            log.warning("%s: ledger %d stays open (read from its WAL) until the disk takes "
                        "writes: %s", self.topic, lid, exc)
            self._keep_unsealed(lid, wal_rel, frames, count, recovered)
            raise
        except Exception as exc:
            if self._fenced is not None or isinstance(exc, errors.Fenced):
                raise
            log.warning("%s: ledger %d stays open (read from its WAL) until it can be "
                        "sealed (retried each maintenance pass): %s", self.topic, lid, exc)
            self._keep_unsealed(lid, wal_rel, frames, count, recovered)
            raise

    async def retry_seals(self) -> None:
        """Seal, in order, the ledgers a full or read-only disk kept open; raises what the
        first one that still cannot be sealed raises (it and those after it stay)."""
        if not self._unsealed:
            return
        disk = self.storage.disk
        if disk.error is not None and await disk.probe(self._executor) is not None:
            raise type(disk.error)(f"{self.topic}: cannot seal ledgers: {disk.error.message}")
        async with self._retry_lock:
            for lid in sorted(self._unsealed):
                if self._fenced is not None:
                    return  # closing, or ownership lost: the next owner seals them
                wal_rel, frames, count = self._unsealed[lid]
                await self._seal(lid, wal_rel, frames, count)
                del self._unsealed[lid]

    # ---- sealing ---------------------------------------------------------------------------

    async def _seal(self, lid: int, wal_rel: str, frames: walmod.FrameIndex, count: int
                    ) -> mpb.LedgerInfo | None:
        """Write a ledger that takes no more appends to Parquet from its WAL (the `count`
        entries of `frames`, streamed: source/ledger/sealed.py), then mark it SEALED.

        The WAL and the ledger's in-memory entries go only once the list says SEALED; then
        `on_sealed` hears of it. An empty ledger is removed from the list (None returned).
        """
        if count == 0:
            self._dedup_snaps.pop(lid, None)
            await self._update_list(lambda lst: retention.remove_ledgers(lst, {lid}))
            self._forget_tail(lid)
            self.storage.delete_wal(wal_rel)
            return None
        rel = self.storage.sealed_rel(self.topic, lid)
        try:
            res = await asyncio.get_running_loop().run_in_executor(
                self._executor, functools.partial(
                    _write_sealed, self.storage.fs, self.storage.full(rel),
                    self.storage.wal_path(wal_rel), frames, count, ledger_id=lid))
        except OSError as exc:  # a full or read-only disk: StorageFull / StorageReadOnly
            raise await self._storage_failure(exc, f"sealing ledger {lid}") from None
        failpoints.hit("ledger.seal.before_publish")
        snap = self._dedup_snaps.get(lid)

        def mark(lst: mpb.LedgerList) -> None:
            for info in lst.ledgers:
                if info.ledger_id == lid:
                    mark_sealed(info, rel, res, now_ms())
            lst.entries_added += res.entries
            if snap is not None and snap.ledger_id >= lst.dedup.ledger_id:
                lst.dedup.CopyFrom(snap)  # source/ledger/dedup.py

        await self._update_list(mark)
        self._dedup_snaps.pop(lid, None)
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


def _write_sealed(*args, **kwargs):
    """`seal_wal`, in the executor thread (a failpoint's pause there holds this one seal
    while the broker goes on: its other seals, produces and reads)."""
    failpoints.hit("ledger.seal.write")
    return seal_wal(*args, **kwargs)
