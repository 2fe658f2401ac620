"""`Sealer`: sealing a `ManagedLedger`'s ledgers to Parquet, and taking over a previous
owner's.

- seal: a ledger that takes no more appends (rolled and drained, or left OPEN by a previous
  owner) is written to Parquet from its WAL, streamed a frame at a time (the file format:
  source/ledger/sealed.py; a ledger sealed ahead as it filled has only its last frames
  written: source/ledger/seal_ahead.py), then marked SEALED in the ledger list (with the
  snapshot of the producers' sequence ids as of its end: source/ledger/dedup.py); only
  then are its WAL and its in-memory entries dropped. An empty ledger leaves the list
  instead.
- open: every OPEN ledger left by a previous owner is recovered from its WAL (torn tail cut;
  a ledger written with the WAL on object storage has its local WAL rebuilt from its
  commits first: source/ledger/wal_restore.py) and sealed before this owner starts a new
  ledger; its frames' producer sequence ids are
  replayed into the dedup map, which starts from the list's last snapshot. Then the topic's
  files the ledger list does not name are deleted (the sweep), still before this owner
  creates any file.
- a full or read-only disk (source/ledger/disk.py), or an object store or etcd that fails
  the seal: a seal that cannot write its Parquet file or mark it SEALED keeps its ledger
  OPEN in the list and readable from its WAL (its frame index held as the ledger's
  in-memory entries, its raws dropped), and remembers it; `retry_seals` seals those
  ledgers, in order, once the disk takes writes (the broker calls it when its probe sees
  the disk writable again, and from its maintenance loop, every `--retention-interval`; a
  roll calls it too). A topic that opens on such a disk is served read-only: recovery reads
  the WALs without writing (a torn tail stays, unindexed), the ledgers it cannot seal stay
  open, the sweep skips what it cannot delete, and no new ledger starts until an append
  finds the disk writable (source/ledger/writer.py). Nothing is acknowledged that was not
  fsynced, and nothing fsynced is dropped: a ledger leaves the list, or its WAL the disk,
  only after its Parquet file is written and named SEALED.

Failpoints: `ledger.seal.write` (in the executor thread, before the Parquet file is
written) and `ledger.seal.before_publish` (written, not yet SEALED in the list).
"""
from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import Executor

import pyarrow.fs as pafs

from shadowtopic import failpoints
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import retention
from shadowtopic.ledger import wal as walmod
from shadowtopic.ledger.dedup import DedupMap
from shadowtopic.ledger.disk import write_failure
from shadowtopic.ledger.ledger_list import OPEN, Fencing, OwnedLedgerList, now_ms
from shadowtopic.ledger.ledger_reader import LedgerListReader
from shadowtopic.ledger.seal_ahead import SealAhead
from shadowtopic.ledger.sealed import SealResult, mark_sealed, seal_wal
from shadowtopic.ledger.storage import Storage
from shadowtopic.ledger.tails import Tails
from shadowtopic.ledger.wal_restore import TopicWalObjects
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

# The ManagedLedger's parts log under one name, as it did when it was a single module.
log = logging.getLogger("shadowtopic.ledger.managed")
UNWRITABLE = (errors.StorageFull, errors.StorageReadOnly)


class Sealer:
    """Seals a topic's ledgers that take no more appends, keeps those it cannot seal yet
    open (and seals them in `retry_seals`), and recovers a previous owner's open ledgers.

    It changes the list through `ledger_list`, the unsealed ledgers' entries in `tails`
    (dropping the reader's handles on a sealed ledger's WAL), and tells `on_sealed` of
    each ledger it marks SEALED.
    """

    def __init__(self, topic: TopicName, storage: Storage, executor: Executor,
                 ledger_list: OwnedLedgerList, tails: Tails, reader: LedgerListReader,
                 dedup: DedupMap, fencing: Fencing,
                 on_sealed: Callable[[mpb.LedgerInfo], None], objects: TopicWalObjects):
        self._topic = topic
        self._objects = objects
        self._storage = storage
        self._executor = executor
        self._list = ledger_list
        self._tails = tails
        self._reader = reader
        self._dedup = dedup
        self._fencing = fencing
        self._on_sealed = on_sealed
        # each ledger's snapshot of the producers' sequence ids, from when it took its last
        # append until its seal writes it into the list (source/ledger/dedup.py)
        self._dedup_snaps: dict[int, mpb.DedupSnapshot] = {}
        # ledgers a full or read-only disk kept from sealing: id -> (wal_rel, frames, count)
        self._unsealed: dict[int, tuple[str, walmod.FrameIndex, int]] = {}
        self._retry_lock = asyncio.Lock()

    def snapshot_dedup(self, ledger_id: int) -> None:
        """A ledger took its last append: what the dedup map holds now is what its seal
        records."""
        self._dedup_snaps[ledger_id] = self._dedup.snapshot(ledger_id)

    # ---- taking over -----------------------------------------------------------------------

    async def recover_open(self) -> None:
        """Recover and seal every ledger the list has OPEN (a previous owner's), in order."""
        for info in [i for i in self._list.current.ledgers if i.state == OPEN]:
            await self._recover(info)

    async def sweep(self) -> None:
        """Delete this topic's files that the ledger list does not name (off the loop), and
        the WAL commits of ledgers no longer open (source/ledger/wal_restore.py)."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self._sweep)
        await self._objects.drop_stale({i.ledger_id for i in self._list.current.ledgers
                                        if i.state == OPEN})

    def _sweep(self) -> None:
        """Delete this topic's files that the ledger list does not name: a WAL left after
        its ledger's SEALED CAS, a Parquet file after a retention CAS, a `.tmp` of a seal
        cut short.

        Safe here: the new owner runs it before it creates any file itself.
        """
        ledgers = self._list.current.ledgers
        keep = {i.path for i in ledgers if i.path}
        keep |= {i.wal_path for i in ledgers if i.wal_path}
        for rel_dir in (self._storage.topic_sealed_dir(self._topic),
                        self._storage.topic_wal_dir(self._topic)):
            for rel in self._storage.list_dir(rel_dir):
                if rel not in keep:
                    log.info("%s: removing orphan file %s", self._topic, rel)
                    if rel.startswith("wal/"):
                        self._storage.delete_wal(rel)
                    else:
                        self._storage.delete(rel)

    async def _recover(self, info: mpb.LedgerInfo) -> None:
        """Seal an OPEN ledger left by a previous owner from its WAL (cutting a torn tail).

        A WAL that is not there was never created or is already removed: with WALs under
        the root every broker shares, the ledger leaves the list; with WALs on each
        broker's own disk it is on the previous owner's, and the ledger stays OPEN.
        """
        path = self._storage.wal_path(info.wal_path)
        loop = asyncio.get_running_loop()
        if info.wal_objects:  # what its commits say, whatever the local copy holds
            await self._objects.restore(info.ledger_id, path)
        try:  # only the frame index: the seal reads the entries back a frame at a time
            rec = await loop.run_in_executor(self._executor, lambda: walmod.recover(
                path, keep_raws=False))
        except FileNotFoundError:
            if self._storage.shared_wal:  # the WAL was never created or already removed
                gone = {info.ledger_id}
                await self._list.update(lambda lst: retention.remove_ledgers(lst, gone))
            else:
                log.warning("%s: WAL of open ledger %d is on another broker's disk",
                            self._topic, info.ledger_id)
            return
        if rec.truncated_bytes:
            log.warning("%s: ledger %d: %d bytes of torn WAL tail are not part of it",
                        self._topic, info.ledger_id, rec.truncated_bytes)
        for name, seq, count, first, publish_ms in rec.sequences:
            self._dedup.record(name, seq, count, info.ledger_id, first, publish_ms)
        self.snapshot_dedup(info.ledger_id)
        try:
            await self.seal_or_keep(info.ledger_id, info.wal_path, rec.frames,
                                    len(rec.entries), rec.entries)
        except UNWRITABLE:
            pass  # open, and read from its WAL until `retry_seals` seals it

    # ---- sealing, or keeping open ----------------------------------------------------------

    async def seal_or_keep(self, lid: int, wal_rel: str, frames: walmod.FrameIndex,
                           count: int, recovered: walmod.Entries | None = None,
                           ahead: SealAhead | None = None) -> mpb.LedgerInfo | None:
        """`_seal`; when it fails (a full or read-only disk, an object store or etcd that
        does not answer) the ledger stays open and readable, to be sealed by `retry_seals`
        (the error is raised). Not after the topic was fenced: its next owner seals it.

        `recovered`: the entries of a ledger recovered from its WAL (no raws), served
        through its frame index while it stays open. `ahead`: the ledger's file written
        as it filled (source/ledger/seal_ahead.py), finished instead of a whole seal."""
        try:
            return await self._seal(lid, wal_rel, frames, count, ahead)
        except UNWRITABLE as exc:
            log.warning("%s: ledger %d stays open (read from its WAL) until the disk takes "
                        "writes: %s", self._topic, lid, exc)
            self._keep_unsealed(lid, wal_rel, frames, count, recovered)
            raise
        except Exception as exc:
            if self._fencing.fenced is not None or isinstance(exc, errors.Fenced):
                raise
            log.warning("%s: ledger %d stays open (read from its WAL) until it can be "
                        "sealed (retried each maintenance pass): %s", self._topic, lid, exc)
            self._keep_unsealed(lid, wal_rel, frames, count, recovered)
            raise

    def _keep_unsealed(self, lid: int, wal_rel: str, frames: walmod.FrameIndex, count: int,
                       recovered: walmod.Entries | None = None) -> None:
        """Serve a ledger that could not be sealed from its WAL, and seal it later."""
        if lid not in self._tails and recovered is not None:
            # recovered without raws: every entry is read back through the frame index
            tail = self._tails.add(lid, self._storage.wal_path(wal_rel))
            tail.frames = frames
            tail.publish_ms = recovered.publish_ms
            tail.size = recovered.size
            tail.offset = count
        self._unsealed[lid] = (wal_rel, frames, count)

    async def retry_seals(self) -> None:
        """Seal, in order, the ledgers a full or read-only disk kept open; raises what the
        first one that still cannot be sealed raises (it and those after it stay)."""
        if not self._unsealed:
            return
        err = await self._refused()
        if err is not None:
            raise type(err)(f"{self._topic}: cannot seal ledgers: {err.message}")
        async with self._retry_lock:
            for lid in sorted(self._unsealed):
                if self._fencing.fenced is not None:
                    return  # closing, or ownership lost: the next owner seals them
                wal_rel, frames, count = self._unsealed[lid]
                await self._seal(lid, wal_rel, frames, count)
                del self._unsealed[lid]

    async def _refused(self) -> errors.ShadowTopicError | None:
        """The disk's error if it was seen unwritable and a probe still finds it so."""
        disk = self._storage.disk
        if disk.error is None:
            return None
        return await disk.probe(self._executor)

    async def _seal(self, lid: int, wal_rel: str, frames: walmod.FrameIndex, count: int,
                    ahead: SealAhead | None = None) -> mpb.LedgerInfo | None:
        """Write a ledger that takes no more appends to Parquet from its WAL (the `count`
        entries of `frames`, streamed: source/ledger/sealed.py), then mark it SEALED.

        The WAL and the ledger's in-memory entries go only once the list says SEALED; then
        `on_sealed` hears of it. An empty ledger is removed from the list (None returned).
        """
        known = self._list.info(lid)
        objects = known is not None and known.wal_objects
        if count == 0:
            if ahead is not None:
                await ahead.discard()
            self._dedup_snaps.pop(lid, None)
            await self._list.update(lambda lst: retention.remove_ledgers(lst, {lid}))
            self._forget_tail(lid)
            self._storage.delete_wal(wal_rel)
            if objects:
                await self._objects.release(lid)
            return None
        storage = self._storage
        rel = storage.sealed_rel(self._topic, lid, self._list.epoch)
        try:
            res = await self._write(lid, rel, wal_rel, frames, count, ahead)
        except OSError as exc:  # a full or read-only disk: StorageFull / StorageReadOnly
            raise await write_failure(storage.disk, exc, f"{self._topic}: sealing ledger "
                                      f"{lid}", self._executor) from None
        failpoints.hit("ledger.seal.before_publish")
        snap = self._dedup_snaps.get(lid)

        def mark(lst: mpb.LedgerList) -> None:
            for info in lst.ledgers:
                if info.ledger_id == lid:
                    mark_sealed(info, rel, res, now_ms())
            lst.entries_added += res.entries
            if snap is not None and snap.ledger_id >= lst.dedup.ledger_id:
                lst.dedup.CopyFrom(snap)  # source/ledger/dedup.py

        await self._list.update(mark)
        self._dedup_snaps.pop(lid, None)
        self._forget_tail(lid)
        storage.delete_wal(wal_rel)
        if objects:
            await self._objects.release(lid)
        info = self._list.info(lid)
        if info is None:  # the CAS that wrote it keeps it: never the case
            raise errors.Internal(f"{self._topic}: sealed ledger {lid} is not in the list")
        self._on_sealed(info)
        return info

    async def _write(self, lid: int, rel: str, wal_rel: str, frames: walmod.FrameIndex,
                     count: int, ahead: SealAhead | None) -> SealResult:
        """The ledger's Parquet file at `rel`: its seal-ahead finished, else (none, or it
        ended or failed) written whole from the WAL."""
        storage = self._storage
        if ahead is not None:
            if ahead.path == storage.full(rel) and not ahead.ended:
                try:
                    return await ahead.finish(frames, count)
                except Exception as exc:  # noqa: BLE001 - sealed whole instead
                    log.info("%s: ledger %d sealed whole from its WAL (sealing ahead "
                             "failed: %s)", self._topic, lid, exc)
            await ahead.discard()
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, functools.partial(
                _write_sealed, storage.fs, storage.full(rel), storage.wal_path(wal_rel),
                frames, count, lid))

    def _forget_tail(self, lid: int) -> None:
        """Drop an unsealed ledger's in-memory entries and the reader's handle on its WAL."""
        self._tails.forget(lid)
        self._reader.forget_wal(lid)


def _write_sealed(fs: pafs.FileSystem, path: str, wal_path: str, frames: walmod.FrameIndex,
                  count: int, ledger_id: int) -> SealResult:
    """`seal_wal`, in the executor thread (a failpoint's pause there holds this one seal
    while the broker goes on: its other seals, produces and reads)."""
    failpoints.hit("ledger.seal.write")
    return seal_wal(fs, path, wal_path, frames, count, ledger_id=ledger_id)
