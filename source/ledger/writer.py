"""`GroupCommitWriter`: the write path of a `ManagedLedger` (source/ledger/managed.py):
appends, group commit and ledger rolls. The open ledger it writes, and the steps of a group
that need no writer (taking a group, failing appends), are source/ledger/open_ledger.py.

- append: batches queue on the open ledger; one writer task per open ledger takes everything
  queued, assigns entry ids, writes one buffer and fdatasyncs it (group commit), then makes
  the entries visible and resolves every waiting append. Nothing is acknowledged before its
  fsync; a failed write acknowledges nothing and cuts the WAL back. With the WAL on object
  storage a group is durable once in an object and committed in etcd (its
  `CommitPipeline`, source/ledger/wal_sink.py); the writer then takes the next groups while
  earlier ones are committed (`_pipelined_loop`) and acknowledges them in entry order; a
  commit refused for lost ownership, or whose outcome is unknown, fences the ledger; the
  ledger rolls after `max_commits` flush windows.
- rollover (by entries, bytes or age): a new ledger is registered OPEN in etcd before it takes
  writes, the old one drains and is sealed to Parquet in the background (by the `Seals` it
  was given: source/ledger/sealing.py), then marked SEALED.
- sealing ahead (`SealAheadMode`): once a roll was asked for (a compaction files its request
  with one, and so do `topics roll` and `truncate`), the open ledger and every later one
  has its Parquet file written as it fills (its `SealAhead`, offered the frames after each
  group commit: source/ledger/seal_ahead.py), so the next such seal writes only the last
  entries. Not before: a step is ~100 ms of Python a row group in the broker's process, and
  with steps running the p99 of produce acknowledgements at 10,000 msgs/s on 2 busy cores
  rose from 23-84 to 110-200 ms (bench/RESULTS.md), a cost a topic nobody compacts has no
  reason to pay.
- order across a rollover: while the current ledger is full, appends wait in `_blocked` and
  move to the new ledger in arrival order; the new ledger's writer waits for the old one's
  before its first write, so a crash never keeps a later batch of a stream without an
  earlier one.
- idempotent producing (source/ledger/dedup.py): the writer checks each sequenced batch
  against the topic's `DedupMap` as it takes the batch, before it assigns ids, so the
  check is ordered with every write of the topic; a duplicate is not written and resolves
  with the original's ids once the group's fsync is done. The map counts a group's batches
  as stored only after its fsync. When a ledger's writer ends, it has the map snapshotted
  for that ledger's seal.
- ownership: a writer whose broker's lease may have expired acknowledges nothing more, not
  even what it has written (the next owner's recovery decides what the log holds).
- a full or read-only disk (source/ledger/disk.py): a failed write acknowledges nothing and
  fails its appends with `StorageFull` or `StorageReadOnly`, and so does a roll that cannot
  create its new ledger's WAL (probed first when the disk was last seen unwritable, so no
  ledger id is taken in vain). A topic that loaded while its disk took no writes has no
  open ledger (`start` failed): it serves reads, and its first append tries to start one
  (and fails the same way until the disk takes writes again).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Protocol

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import wal as walmod
from shadowtopic.ledger.dedup import EXPIRE_EVERY_MS, DedupMap, Duplicate
from shadowtopic.ledger.disk import write_failure
from shadowtopic.ledger.ledger_list import OPEN, SEALED, Fencing, OwnedLedgerList, now_ms
from shadowtopic.ledger.open_ledger import (
    AppendResult,
    InFlight,
    LedgerConfig,
    OpenLedger,
    Pending,
    Taken,
    fail_group,
    fail_pending,
    take_group,
)
from shadowtopic.ledger.seal_ahead import SealAhead, SealAheadMode
from shadowtopic.ledger.storage import Storage
from shadowtopic.ledger.tails import Tails
from shadowtopic.ledger.wal_sink import CommitFailed, CommitPipeline, WalSink
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import MetadataStore, MetadataUnavailable
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

# The ManagedLedger's parts log under one name, as it did when it was a single module.
log = logging.getLogger("shadowtopic.ledger.managed")

#: a rolled ledger's seal: its info once SEALED (None: it was empty and left the list)
SealTask = asyncio.Task[mpb.LedgerInfo | None]


class Seals(Protocol):
    """What the writer needs of the sealer (source/ledger/sealing.py)."""

    def snapshot_dedup(self, ledger_id: int) -> None: ...

    async def seal_or_keep(self, lid: int, wal_rel: str, frames: walmod.FrameIndex,
                           count: int, recovered: walmod.Entries | None = None,
                           ahead: SealAhead | None = None) -> mpb.LedgerInfo | None: ...

    async def retry_seals(self) -> None: ...


class GroupCommitWriter:
    """A topic's appends, the group-commit writer of each open ledger, and ledger rolls.

    It registers new ledgers through `ledger_list`, keeps their entries in `tails`, checks
    sequenced batches against `dedup`, hands rolled ledgers to `seals`, tells `on_entries`
    of each group commit, and fences the ledger through `fencing` (a lease that may have
    expired, a WAL it cannot cut back). `config` may be replaced at any time (policies);
    the next append or roll goes by the new one.
    """

    def __init__(self, topic: TopicName, store: MetadataStore, storage: Storage,
                 executor: Executor, config: LedgerConfig, ledger_list: OwnedLedgerList,
                 tails: Tails, dedup: DedupMap, seals: Seals, fencing: Fencing,
                 lease_ok: Callable[[], bool], on_entries: Callable[[], None],
                 sink: WalSink, pipeline: CommitPipeline | None = None,
                 seal_ahead: SealAheadMode = "after_roll",
                 ahead_executor: Executor | None = None):
        self.config = config
        # each open ledger's Parquet file written as it fills (source/ledger/seal_ahead.py),
        # in threads of its own where the broker gives them (not the WAL's fsync threads):
        # from the start ("always"), once a roll was asked for ("after_roll"), or never
        self._seal_ahead = seal_ahead == "always"
        self._ahead_on_roll = seal_ahead == "after_roll"
        self._ahead_executor = ahead_executor or executor
        self._sink = sink
        self._pipeline = pipeline  # commits several groups at once (the object WAL)
        self._topic = topic
        self._store = store
        self._storage = storage
        self._executor = executor
        self._list = ledger_list
        self._tails = tails
        self._dedup = dedup
        self._seals = seals
        self._fencing = fencing
        self._lease_ok = lease_ok  # False once this broker's lease may have expired
        self._on_entries = on_entries
        self._current: OpenLedger | None = None
        self._draining: list[OpenLedger] = []  # rolled ledgers whose writer has not ended
        self._roll_task: asyncio.Task[SealTask | None] | None = None
        self._blocked: deque[Pending] = deque()  # appends waiting for a ledger switch
        self._seal_tasks: set[SealTask] = set()

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the first ledger (the topic opened); raises what `_create_ledger` raises
        (then the first append tries again)."""
        self._current = await self._create_ledger()

    async def close(self, reason: errors.ShadowTopicError) -> None:
        """Fail the appends waiting for a ledger switch with `reason`, let the open ledger's
        writer finish what is queued, wait for the seals under way (30 s at most)."""
        while self._roll_task is not None:
            await asyncio.gather(self._roll_task, return_exceptions=True)
        self._fail_blocked(reason)
        cur = self._current
        if cur is not None:
            cur.closing = True
            cur.wake.set()
            if cur.writer is not None:
                await asyncio.gather(cur.writer, return_exceptions=True)
            cur.wal.close()
            if cur.ahead is not None:  # the next owner seals it from the WAL
                await cur.ahead.discard()
        if self._seal_tasks:
            await asyncio.wait(list(self._seal_tasks), timeout=30)

    def next_position(self) -> MessageId | None:
        """Where the next confirmed entry goes (None: no open ledger). A rolled ledger whose
        writer is still draining confirms more entries after the switch: until it is done,
        that is its next entry, never the new ledger's first."""
        cur = self._draining[0] if self._draining else self._current
        return None if cur is None else MessageId(cur.ledger_id, len(cur.entries))

    @property
    def current_ledger(self) -> tuple[int, int, int]:
        """(ledger id, entries, bytes) of the ledger taking appends ((0, 0, 0): none)."""
        cur = self._current
        if cur is None:
            return 0, 0, 0
        return cur.ledger_id, len(cur.entries), cur.entries.size

    # ---- append ----------------------------------------------------------------------------

    async def append_batch(self, raws: list[bytes], request: bytes, size: int,
                           sequence: tuple[str, int] | None = None) -> AppendResult:
        """Append a batch durably (`request` is the ProduceRequest the raws came in, written
        to the WAL as it is); `sequence` = (producer name, sequence id of its first message)
        or None. Returns (ledger_id, first_entry_id, duplicate) after the fsync: a duplicate
        was not stored again, the ids are its original's ((0, 0): unknown)."""
        refused = self._fencing.fenced
        if refused is not None:
            raise refused
        if not self._lease_ok():
            raise self._fence(errors.Fenced(f"{self._topic}: this broker's lease may have "
                                            "expired"))
        fut: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        item: Pending = (raws, request, size, fut, sequence)
        if self._blocked or self._current is None or self._current.full(self.config):
            self._blocked.append(item)
            self._ensure_roll()
        else:
            self._enqueue(self._current, item)
        return await fut

    def _fence(self, err: errors.ShadowTopicError) -> errors.ShadowTopicError:
        """Fence the ledger with `err`; returns why it is fenced (an earlier reason stays)."""
        self._fencing.fence(err)
        return self._fencing.fenced or err

    @staticmethod
    def _enqueue(led: OpenLedger, item: Pending) -> None:
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
        dedup = self._dedup
        while True:
            await led.wake.wait()
            led.wake.clear()
            if led.after is not None:
                # the previous ledger's last batches are durable before any of this one's,
                # so a crash never keeps a later batch of a stream without an earlier one
                await asyncio.gather(led.after, return_exceptions=True)
                led.after = None
            while led.pending:
                pending, led.pending = led.pending, []
                first_id = len(led.entries)
                publish_ms, group = take_group(led, pending, dedup)
                frames = [item[1] for item in group if item[1] is not None]
                at = led.wal.size  # where the first frame goes
                try:
                    if frames:
                        await self._sink.persist(led.wal, led.ledger_id, first_id,
                                                 sum(len(item[0]) for item in group
                                                     if item[1] is not None),
                                                 b"".join(frames))
                except OSError as exc:  # nothing of the group is acknowledged
                    dedup.rollback()
                    self._storage.disk.report(exc)
                    err = errors.storage_error(exc, f"{self._topic}: WAL write")
                    if led.wal.broken:  # could not cut the failed frame off: stop here
                        self._fence(errors.Internal(f"{self._topic}: WAL unusable: {exc}"))
                    fail_group(led, group, err)
                    continue
                if not self._lease_ok():
                    # durable, but this broker may no longer own the topic: acknowledge
                    # nothing (the next owner's recovery decides what the log holds)
                    dedup.rollback()
                    why = self._fence(errors.Fenced(f"{self._topic}: lease may have expired"))
                    for _raws, _frame, _size, fut, _first in group:
                        if not fut.done():
                            fut.set_exception(why)
                    continue
                dedup.commit()
                self._confirm(led, group, publish_ms, at)
            if led.closing and not led.pending:
                # everything of this ledger is written: what the map holds now is what its
                # seal records (source/ledger/dedup.py)
                self._seals.snapshot_dedup(led.ledger_id)
                return

    def _confirm(self, led: OpenLedger, group: list[Taken], publish_ms: int, at: int) -> None:
        """A group is durable: its entries become readable, its appends resolve (a duplicate
        with its original's ids)."""
        dedup = self._dedup
        ents = led.entries
        wrote = False
        for raws, frame, size, fut, first in group:
            if frame is None or not isinstance(first, int):
                # a duplicate: resolved with its original's ids (a refused batch failed
                # already)
                if isinstance(first, Duplicate) and not fut.done():
                    fut.set_result((first[0], first[1], True))
                continue
            ents.confirmed(publish_ms, raws, size, at, len(frame))  # evictable now
            at += len(frame)
            wrote = True
            if not fut.done():
                fut.set_result((led.ledger_id, first, False))
        if wrote:
            self._on_entries()
            if led.ahead is not None:
                led.ahead.offer(ents.frames)
        if publish_ms - dedup.expired_at_ms >= min(EXPIRE_EVERY_MS, dedup.idle_ms):
            dedup.expire(publish_ms)

    # ---- the pipelined writer (the WAL on object storage) ---------------------------------

    async def _pipelined_loop(self, led: OpenLedger, pipe: CommitPipeline) -> None:
        """The writer of one open ledger when groups are committed to WAL objects: it takes
        the next group while up to `pipe.depth` earlier ones are still being committed (each
        would otherwise wait for a whole PUT and commit before it is even sent), and
        confirms and acknowledges them strictly in entry order. A group that fails fails
        every group after it too; their entry ids are used again only when none was in
        flight, else the ledger is fenced (a later group may be committed: its next owner's
        restore stops at the first entry no commit holds)."""
        dedup = self._dedup
        window: deque[InFlight] = deque()
        next_id = len(led.entries)
        while True:
            if led.pending and self._fencing.fenced is not None:
                refused, led.pending = led.pending, []
                fail_pending(led, refused, self._fencing.fenced)
            if led.after is not None and led.pending:
                await asyncio.gather(led.after, return_exceptions=True)
                led.after = None
            if led.pending and len(window) < pipe.depth:
                pending, led.pending = led.pending, []
                led.wake.clear()
                staged_before = dedup.staged
                publish_ms, group = take_group(led, pending, dedup, next_id)
                frames = [item[1] for item in group if item[1] is not None]
                count = sum(len(item[0]) for item in group if item[1] is not None)
                at = led.wal.size
                task = None
                if frames:
                    blob = b"".join(frames)
                    try:
                        await pipe.write_copy(led.wal, blob)
                    except OSError as exc:  # the local copy: nothing of it was sent
                        dedup.drop_staged(dedup.staged - staged_before)
                        self._storage.disk.report(exc)
                        if led.wal.broken:
                            self._fence(errors.Internal(f"{self._topic}: WAL unusable: {exc}"))
                        fail_group(led, group, errors.storage_error(
                            exc, f"{self._topic}: WAL write"))
                        continue
                    task = asyncio.ensure_future(pipe.commit(led.ledger_id, next_id, count,
                                                             blob))
                    led.commits += 1
                window.append(InFlight(task, group, publish_ms, at,
                                        dedup.staged - staged_before))
                next_id += count
                continue
            if not window:
                if led.closing and not led.pending:
                    self._seals.snapshot_dedup(led.ledger_id)
                    return
                await led.wake.wait()
                led.wake.clear()
                continue
            head = window[0]
            if head.task is not None and not head.task.done():
                waits: set[asyncio.Future[Any]] = {head.task}
                woke = None
                if len(window) < pipe.depth:  # new appends may start the next group
                    woke = asyncio.ensure_future(led.wake.wait())
                    waits.add(woke)
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if woke is not None and not woke.done():
                    woke.cancel()
                continue
            window.popleft()
            failure = None if head.task is None else head.task.exception()
            if failure is None and self._fencing.fenced is None and not self._lease_ok():
                failure = CommitFailed(errors.Fenced(f"{self._topic}: lease may have expired"),
                                       fence=True)
            if failure is None:
                dedup.commit_staged(head.staged)
                self._confirm(led, head.group, head.publish_ms, head.at)
                continue
            # nothing from here on is acknowledged
            dedup.rollback()
            if isinstance(failure, CommitFailed):
                err, fence = failure.error, failure.fence
            else:
                err, fence = errors.Internal(f"{self._topic}: WAL commit: {failure}"), True
            if window or fence or self._fencing.fenced is not None:
                err = self._fence(err)
            else:  # nothing after it was sent: the ids are used again
                try:
                    await pipe.cut_back(led.wal, head.at)
                    next_id = len(led.entries)
                except OSError as exc:
                    err = self._fence(errors.Internal(f"{self._topic}: WAL unusable: {exc}"))
            fail_group(led, head.group, err)
            while window:
                later = window.popleft()
                fail_group(led, later.group, err)

    # ---- rollover --------------------------------------------------------------------------

    async def _create_ledger(self) -> OpenLedger:
        """Start a new ledger: create its WAL, register it OPEN in the ledger list (before it
        takes any write) and start its writer."""
        storage = self._storage
        disk = storage.disk
        if disk.error is not None:
            err = await disk.probe(self._executor)
            if err is not None:
                raise type(err)(f"{self._topic}: cannot start a new ledger: {err.message}")
        try:
            lid = await self._store.next_id(keys.LEDGER_ID_COUNTER)
        except MetadataUnavailable as exc:
            raise errors.MetadataUnavailable(f"cannot start a new ledger: {exc}") from None
        rel = storage.wal_rel(self._topic, lid)
        loop = asyncio.get_running_loop()
        try:
            wal = await loop.run_in_executor(self._executor, walmod.WalFile.create,
                                             storage.wal_path(rel), lid)
        except OSError as exc:
            raise await write_failure(disk, exc, f"{self._topic}: starting a new ledger",
                                      self._executor) from None
        info = mpb.LedgerInfo(ledger_id=lid, state=OPEN, wal_path=rel, created_ms=now_ms(),
                              wal_objects=self._pipeline is not None)
        try:
            await self._list.update(lambda lst: lst.ledgers.append(info))
        except errors.ShadowTopicError:
            wal.close()
            storage.delete_wal(rel)
            raise
        led = OpenLedger(lid, wal, rel, self._tails.add(lid, wal.path))
        if self._seal_ahead:
            self._attach_ahead(led)
        loop_of = (self._write_loop(led) if self._pipeline is None
                   else self._pipelined_loop(led, self._pipeline))
        led.writer = asyncio.create_task(loop_of, name=f"wal-{lid}")
        return led

    def _attach_ahead(self, led: OpenLedger) -> None:
        """Seal `led` ahead from now on (its frames so far too: the next offer writes every
        row group they fill)."""
        storage = self._storage
        led.ahead = SealAhead(storage.fs, storage.full(storage.sealed_rel(
            self._topic, led.ledger_id, self._list.epoch)), led.wal.path, led.ledger_id,
            self._ahead_executor)

    async def _roll(self) -> SealTask | None:
        """Switch to a new ledger; the old one drains and seals in its own task (returned;
        None when there was no open ledger: the topic loaded on an unwritable disk)."""
        try:
            new = await self._create_ledger()
        except BaseException as exc:
            self._roll_task = None
            log.warning("%s: rollover failed: %s", self._topic, exc)
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
            if old.writer is not None:
                await asyncio.gather(old.writer, return_exceptions=True)
        finally:
            if old in self._draining:
                self._draining.remove(old)
        old.wal.close()
        return await self._seals.seal_or_keep(old.ledger_id, old.wal_rel, old.entries.frames,
                                              len(old.entries), ahead=old.ahead)

    def _seal_done(self, task: SealTask) -> None:
        self._seal_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s: sealing failed (retried once the disk takes writes, else the "
                        "next owner seals it): %s", self._topic, task.exception())

    async def roll(self) -> mpb.LedgerInfo | None:
        """Seal the current ledger now, as asked (RollLedger, a compaction, truncate);
        returns the sealed ledger's info, or the newest sealed ledger when the current one
        is empty. Asked once, asked again (a compacted topic): seal ahead from now on."""
        if self._ahead_on_roll and not self._seal_ahead and self._fencing.fenced is None:
            self._seal_ahead = True
            cur = self._current
            if cur is not None and cur.ahead is None and cur.queued_entries == 0:
                self._attach_ahead(cur)  # (one with entries is sealed whole now)
        return await self._roll_now()

    async def _roll_now(self) -> mpb.LedgerInfo | None:
        refused = self._fencing.fenced
        if refused is not None:
            raise refused
        while self._roll_task is not None:  # a roll may start another (blocked appends)
            await asyncio.gather(self._roll_task, return_exceptions=True)
        refused = self._fencing.fenced
        if refused is not None:
            raise refused
        await self._seals.retry_seals()  # seals that found the disk unwritable first (or raise)
        if self._current is None or self._current.queued_entries == 0:
            if self._seal_tasks:
                await asyncio.gather(*self._seal_tasks, return_exceptions=True)
            sealed = [i for i in self._list.current.ledgers if i.state == SEALED]
            return sealed[-1] if sealed else None
        self._roll_task = task = asyncio.create_task(self._roll())
        seal = await task
        return None if seal is None else await seal

    async def roll_if_aged(self) -> bool:
        """Roll a quiet topic's open ledger once it is older than `max_age_s` (appends check
        age themselves; this catches a topic nobody writes to)."""
        cur = self._current
        if (self._fencing.fenced is None and self._roll_task is None and cur is not None
                and cur.queued_entries
                and time.monotonic() - cur.created >= self.config.max_age_s):
            await self._roll_now()  # (not asked for: it turns no sealing ahead on)
            return True
        return False


def _consume(task: asyncio.Task[Any]) -> None:
    """Retrieve a background task's exception (it is reported where it matters)."""
    if not task.cancelled():
        task.exception()
