"""The write path of a `ManagedLedger` (source/ledger/managed.py): appends, group commit and
ledger rolls.

- append: batches queue on the open ledger; one writer task per open ledger takes everything
  queued, assigns entry ids, writes one buffer and fdatasyncs it (group commit), then makes
  the entries visible and resolves every waiting append. Nothing is acknowledged before its
  fsync; a failed write acknowledges nothing and cuts the WAL back.
- rollover (by entries, bytes or age): a new ledger is registered OPEN in etcd before it takes
  writes, the old one drains and is sealed to Parquet in the background, then marked SEALED.
- order across a rollover: while the current ledger is full, appends wait in `_blocked` and
  move to the new ledger in arrival order; the new ledger's writer waits for the old one's
  before its first write, so a crash never keeps a later batch of a stream without an
  earlier one.
- idempotent producing (source/ledger/dedup.py): the writer checks each sequenced batch
  against the topic's `DedupMap` as it takes the batch, before it assigns ids, so the
  check is ordered with every write of the topic; a duplicate is not written and resolves
  with the original's ids once the group's fsync is done. The map counts a group's batches
  as stored only after its fsync. When a ledger's writer ends, it snapshots the map for
  that ledger's seal.
- ownership: a writer whose broker's lease may have expired acknowledges nothing more, not
  even what it has written (the next owner's recovery decides what the log holds).
- a full or read-only disk (source/ledger/disk.py): a failed write acknowledges nothing and
  fails its appends with `StorageFull` or `StorageReadOnly`, and so does a roll that cannot
  create its new ledger's WAL (probed first when the disk was last seen unwritable, so no
  ledger id is taken in vain). A topic that loaded while its disk took no writes has no
  open ledger (`_current` is None): it serves reads, and its first append tries to start
  one (and fails the same way until the disk takes writes again).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from shadowtopic.core import errors
from shadowtopic.ledger import wal as walmod
from shadowtopic.ledger.dedup import DEFAULT_IDLE_S, EXPIRE_EVERY_MS, Duplicate
from shadowtopic.ledger.entry_cache import TailEntries
from shadowtopic.ledger.ledger_list import OPEN, SEALED, now_ms
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import MetadataUnavailable
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

# The ManagedLedger's parts log under one name, as it did when it was a single module.
log = logging.getLogger("shadowtopic.ledger.managed")


@dataclass
class LedgerConfig:
    """When the open ledger rolls over: once `max_entries` entries or `max_bytes` bytes have
    been queued on it, or once it has an entry queued and is `max_age_s` seconds old."""

    max_entries: int = 200_000
    max_bytes: int = 64 << 20
    max_age_s: float = 4 * 3600
    #: idempotent producing: a producer idle this long is forgotten (source/ledger/dedup.py)
    dedup_idle_s: float = DEFAULT_IDLE_S


class OpenLedger:
    """A ledger taking appends: its WAL, its confirmed entries and its queue.

    `pending` holds the appends (raws, request, size, future, (producer, first sequence id)
    or None) its writer has not taken yet;
    `queued_entries` and `queued_bytes` count every batch queued on it that did not fail,
    written or not (they decide when it is full). `after` is the previous ledger's writer,
    which this one's waits for before its first write; `closing` tells the writer to end
    once nothing is pending.
    """

    def __init__(self, ledger_id: int, wal: walmod.WalFile, wal_rel: str, entries: TailEntries):
        self.ledger_id = ledger_id
        self.wal = wal
        self.wal_rel = wal_rel
        self.entries = entries
        self.queued_entries = 0
        self.queued_bytes = 0
        self.created = time.monotonic()
        self.pending: list[tuple] = []
        self.wake = asyncio.Event()
        self.after: asyncio.Task | None = None  # the previous ledger's writer
        self.closing = False
        self.writer: asyncio.Task | None = None

    def full(self, cfg: LedgerConfig) -> bool:
        return (self.queued_entries >= cfg.max_entries or self.queued_bytes >= cfg.max_bytes
                or (self.queued_entries > 0 and time.monotonic() - self.created >= cfg.max_age_s))


class WritePath:
    """The ManagedLedger's appends, the group-commit writer of each open ledger and ledger
    rolls.

    A part of `ManagedLedger` (source/ledger/managed.py), which sets up the state used here
    (`_current`, `_draining`, `_blocked`, `_roll_task`, `_seal_tasks`, `_mem`, `_fenced`,
    `_lease_ok`, ...) and provides `fence`, `_notify`, `_update_list` and `_seal`.
    """

    # ---- append ----------------------------------------------------------------------------

    async def append(self, raws: list[bytes], request: bytes, size: int) -> tuple[int, int]:
        """Append a batch durably; return (ledger_id, first_entry_id) after the fsync.

        `request` is the ProduceRequest the raws came in (written to the WAL as it is).
        Order is kept across ledger switches: while the current ledger is full, batches wait
        in `_blocked` and move to the new ledger in arrival order.
        """
        lid, first, _dup = await self.append_batch(raws, request, size)
        return lid, first

    async def append_batch(self, raws: list[bytes], request: bytes, size: int,
                           sequence: tuple[str, int] | None = None) -> tuple[int, int, bool]:
        """`append`, for a batch that may be sequenced: `sequence` = (producer name, sequence
        id of its first message). Returns (ledger_id, first_entry_id, duplicate): a
        duplicate was not stored again, the ids are its original's ((0, 0): unknown)."""
        if self._fenced is not None:
            raise self._fenced
        if not self._lease_ok():
            self.fence(errors.Fenced(f"{self.topic}: this broker's lease may have expired"))
            raise self._fenced
        fut = asyncio.get_running_loop().create_future()
        item = (raws, request, size, fut, sequence)
        if self._blocked or self._current is None or self._current.full(self.config):
            self._blocked.append(item)
            self._ensure_roll()
        else:
            self._enqueue(self._current, item)
        return await fut

    @staticmethod
    def _enqueue(led: OpenLedger, item: tuple) -> None:
        led.pending.append(item)
        led.queued_entries += len(item[0])
        led.queued_bytes += item[2]
        led.wake.set()

    def _ensure_roll(self) -> None:
        if self._roll_task is None:
            self._roll_task = asyncio.create_task(self._roll())
            self._roll_task.add_done_callback(_consume)

    def _drain_blocked(self) -> None:
        """Move the appends that waited for a ledger switch to the new current ledger, in
        order, until it is full (then roll again)."""
        while self._blocked and self._current is not None and not self._current.full(self.config):
            self._enqueue(self._current, self._blocked.popleft())
        if self._blocked:
            self._ensure_roll()

    def _fail_blocked(self, exc: BaseException) -> None:
        """Fail every append waiting for a ledger switch (the switch failed, or closing)."""
        if isinstance(exc, MetadataUnavailable):
            exc = errors.MetadataUnavailable(f"cannot start a new ledger: {exc}")
        elif not isinstance(exc, errors.ShadowTopicError):
            exc = errors.Internal(f"cannot start a new ledger: {exc}")
        while self._blocked:
            fut = self._blocked.popleft()[3]
            if not fut.done():
                fut.set_exception(exc)

    # ---- the group-commit writer -----------------------------------------------------------

    async def _write_loop(self, led: OpenLedger) -> None:
        """The writer of one open ledger: each round takes every pending append, writes their
        frames as one buffer with one fdatasync, then confirms the entries and resolves the
        appends (or fails them all). Ends when the ledger is closing and nothing is pending.
        """
        loop = asyncio.get_running_loop()
        while True:
            await led.wake.wait()
            led.wake.clear()
            if led.after is not None:
                # the previous ledger's last batches are durable before any of this one's,
                # so a crash never keeps a later batch of a stream without an earlier one
                await asyncio.gather(led.after, return_exceptions=True)
                led.after = None
            while led.pending:
                group, led.pending = led.pending, []
                publish_ms = self._write_group(led, group)
                frames = [item[1] for item in group if item[1] is not None]
                at = led.wal.size  # where the first frame goes
                try:
                    if frames:
                        await loop.run_in_executor(self._executor, led.wal.write_sync,
                                                   b"".join(frames))
                except OSError as exc:  # nothing of the group is acknowledged
                    self.dedup.rollback()
                    self.storage.disk.report(exc)
                    err = errors.storage_error(exc, f"{self.topic}: WAL write")
                    if led.wal.broken:  # could not cut the failed frame off: stop here
                        self.fence(errors.Internal(f"{self.topic}: WAL unusable: {exc}"))
                    for raws, frame, size, fut, _first in group:
                        if frame is not None:
                            led.queued_entries -= len(raws)
                            led.queued_bytes -= size
                        if not fut.done():
                            fut.set_exception(err)
                    continue
                if not self._lease_ok():
                    # durable, but this broker may no longer own the topic: acknowledge
                    # nothing (the next owner's recovery decides what the log holds)
                    self.dedup.rollback()
                    self.fence(errors.Fenced(f"{self.topic}: lease may have expired"))
                    for _raws, _frame, _size, fut, _first in group:
                        if not fut.done():
                            fut.set_exception(self._fenced)
                    continue
                self.dedup.commit()
                ents = led.entries
                for raws, frame, size, fut, first in group:
                    if frame is None:  # a duplicate: resolved with its original's ids
                        if not fut.done():
                            fut.set_result((first[0], first[1], True))
                        continue
                    ents.confirmed(publish_ms, raws, size, at, len(frame))  # evictable now
                    at += len(frame)
                    if not fut.done():
                        fut.set_result((led.ledger_id, first, False))
                if frames:
                    self._notify()
                if publish_ms - self.dedup.expired_at_ms >= min(EXPIRE_EVERY_MS,
                                                               self.dedup.idle_ms):
                    self.dedup.expire(publish_ms)
            if led.closing and not led.pending:
                # everything of this ledger is written: what the map holds now is what its
                # seal records (source/ledger/dedup.py)
                self._dedup_snaps[led.ledger_id] = self.dedup.snapshot(led.ledger_id)
                return

    def _write_group(self, led: OpenLedger, group: list) -> int:
        """Check the group's sequenced batches against the dedup map, assign entry ids and
        build the frames, in place: each item becomes (raws, frame, size, future, first
        entry id); a duplicate's frame is None and its last field its original's ids; a
        refused batch's future fails and its frame is None too. Returns the group's
        publish time."""
        encode = walmod.encode_batch
        publish_ms = now_ms()
        next_id = len(led.entries)
        dedup = self.dedup
        for k, (raws, request, size, fut, seq) in enumerate(group):
            if seq is not None:
                try:
                    dup: Duplicate | None = dedup.check(seq[0], seq[1], len(raws))
                except errors.ShadowTopicError as exc:
                    led.queued_entries -= len(raws)
                    led.queued_bytes -= size
                    if not fut.done():
                        fut.set_exception(exc)
                    group[k] = (raws, None, size, fut, None)
                    continue
                if dup is not None:
                    led.queued_entries -= len(raws)
                    led.queued_bytes -= size
                    group[k] = (raws, None, size, fut, dup)
                    continue
                dedup.stage(seq[0], seq[1], len(raws), led.ledger_id, next_id, publish_ms)
            group[k] = (raws, encode(next_id, publish_ms, request, len(raws)), size, fut, next_id)
            next_id += len(raws)
        return publish_ms


    # ---- rollover --------------------------------------------------------------------------

    async def _storage_failure(self, exc: OSError, what: str) -> errors.ShadowTopicError:
        """The typed error of a failed write (`what`): `StorageFull` / `StorageReadOnly`
        when the disk is the reason (an error without an errno, as pyarrow raises some, is
        checked with a probe), else `Internal`."""
        disk = self.storage.disk
        disk.report(exc)
        if exc.errno not in errors.STORAGE_ERRNOS and await disk.probe(self._executor):
            return type(disk.error)(f"{self.topic}: {what} failed: {disk.error.message}")
        return errors.storage_error(exc, f"{self.topic}: {what}")

    async def _create_ledger(self) -> OpenLedger:
        """Start a new ledger: create its WAL, register it OPEN in the ledger list (before it
        takes any write) and start its writer."""
        disk = self.storage.disk
        if disk.error is not None and await disk.probe(self._executor) is not None:
            raise type(disk.error)(f"{self.topic}: cannot start a new ledger: "
                                   f"{disk.error.message}")
        try:
            lid = await self.store.next_id(keys.LEDGER_ID_COUNTER)
        except MetadataUnavailable as exc:
            raise errors.MetadataUnavailable(f"cannot start a new ledger: {exc}") from None
        rel = self.storage.wal_rel(self.topic, lid)
        loop = asyncio.get_running_loop()
        try:
            wal = await loop.run_in_executor(self._executor, walmod.WalFile.create,
                                             self.storage.wal_path(rel), lid)
        except OSError as exc:
            raise await self._storage_failure(exc, "starting a new ledger") from None
        info = mpb.LedgerInfo(ledger_id=lid, state=OPEN, wal_path=rel, created_ms=now_ms())
        try:
            await self._update_list(lambda lst: lst.ledgers.append(info))
        except errors.ShadowTopicError:
            wal.close()
            self.storage.delete_wal(rel)
            raise
        led = OpenLedger(lid, wal, rel, TailEntries(self.entry_cache, wal.path))
        self._mem[lid] = led.entries
        led.writer = asyncio.create_task(self._write_loop(led), name=f"wal-{lid}")
        return led

    async def _roll(self) -> asyncio.Task | None:
        """Switch to a new ledger; the old one drains and seals in its own task (returned;
        None when there was no open ledger: the topic loaded on an unwritable disk)."""
        try:
            new = await self._create_ledger()
        except BaseException as exc:
            self._roll_task = None
            log.warning("%s: rollover failed: %s", self.topic, exc)
            self._fail_blocked(exc)
            raise
        old, self._current = self._current, new
        if old is None:
            self._roll_task = None
            self._drain_blocked()
            return None
        new.after = old.writer
        self._draining.append(old)
        seal = asyncio.create_task(self._drain_and_seal(old), name=f"seal-{old.ledger_id}")
        self._seal_tasks.add(seal)
        seal.add_done_callback(self._seal_done)
        self._roll_task = None
        self._drain_blocked()
        return seal

    async def _drain_and_seal(self, old: OpenLedger) -> mpb.LedgerInfo | None:
        """Let a rolled ledger's writer finish what is queued on it, then seal the ledger."""
        old.closing = True
        old.wake.set()
        try:
            await asyncio.gather(old.writer, return_exceptions=True)
        finally:
            if old in self._draining:
                self._draining.remove(old)
        old.wal.close()
        return await self._seal_or_keep(old.ledger_id, old.wal_rel, old.entries.frames,
                                        len(old.entries))

    def _seal_done(self, task: asyncio.Task) -> None:
        self._seal_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s: sealing failed (retried once the disk takes writes, else the "
                        "next owner seals it): %s", self.topic, task.exception())

    async def roll(self) -> mpb.LedgerInfo | None:
        """Seal the current ledger now (RollLedger); returns the sealed ledger's info, or the
        newest sealed ledger when the current one is empty."""
        if self._fenced is not None:
            raise self._fenced
        while self._roll_task is not None:  # a roll may start another (blocked appends)
            await asyncio.gather(self._roll_task, return_exceptions=True)
        if self._fenced is not None:
            raise self._fenced
        await self.retry_seals()  # seals that found the disk unwritable first (or raise)
        if self._current is None or self._current.queued_entries == 0:
            if self._seal_tasks:
                await asyncio.gather(*self._seal_tasks, return_exceptions=True)
            sealed = [i for i in self._list.ledgers if i.state == SEALED]
            return sealed[-1] if sealed else None
        self._roll_task = task = asyncio.create_task(self._roll())
        return await (await task)

    async def roll_if_aged(self) -> bool:
        """Roll a quiet topic's open ledger once it is older than `max_age_s` (appends check
        age themselves; this catches a topic nobody writes to)."""
        cur = self._current
        if (self._fenced is None and self._roll_task is None and cur is not None
                and cur.queued_entries
                and time.monotonic() - cur.created >= self.config.max_age_s):
            await self.roll()
            return True
        return False


def _consume(task: asyncio.Task) -> None:
    """Retrieve a background task's exception (it is reported where it matters)."""
    if not task.cancelled():
        task.exception()
