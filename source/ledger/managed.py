"""ManagedLedger: a source topic's ledgers, written by the one broker that owns the topic.

- append: batches queue on the open ledger; one writer task per open ledger takes everything
  queued, assigns entry ids, writes one buffer and fdatasyncs it (group commit), then makes
  the entries visible and resolves every waiting append. Nothing is acknowledged before its
  fsync; a failed write acknowledges nothing and cuts the WAL back.
- rollover (by entries, bytes or age): a new ledger is registered OPEN in etcd before it takes
  writes, the old one drains and is sealed to Parquet in the background, then marked SEALED.
- every change of the ledger list is one etcd transaction that compares the list's revision
  and this broker's ownership record, so a broker that lost the topic cannot change it
  (it is fenced and stops acknowledging).
- open: every OPEN ledger left by a previous owner is recovered from its WAL (torn tail cut)
  and sealed before this owner starts a new ledger.
- it is the source's `LedgerView` (source/ledger/view.py): reads by MessageId go through a
  `LedgerListReader` over this ledger list and the in-memory entries of unsealed ledgers;
  listeners hear of new entries (once per group commit), trimmed ledgers and closing.
- memory: unsealed ledgers' entries count against the broker's `EntryCache`, which drops
  the oldest past its budget (re-read from the WAL: source/ledger/entry_cache.py).
"""
from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Callable, TypeVar

from source import failpoints
from source.core import errors
from source.core.message_id import MessageId
from source.core.names import TopicName
from source.ledger import retention
from source.ledger import wal as walmod
from source.ledger.entry_cache import EntryCache, TailEntries
from source.ledger.ledger_reader import LedgerListReader
from source.ledger.sealed import mark_sealed, seal_wal
from source.ledger.storage import Storage
from source.ledger.view import LedgerRange, ReadEntry, Trimmed, ViewListener
from source.metadata import keys
from source.metadata.base import Compare, MetadataStore, MetadataUnavailable, Put
from source.pb.storage.v1 import metadata_pb2 as mpb

log = logging.getLogger(__name__)
T = TypeVar("T")
OPEN, SEALED = mpb.LedgerState.OPEN, mpb.LedgerState.SEALED


@dataclass
class LedgerConfig:
    max_entries: int = 200_000
    max_bytes: int = 64 << 20
    max_age_s: float = 4 * 3600


def now_ms() -> int:
    return int(time.time() * 1000)


class _OpenLedger:
    """A ledger taking appends: its WAL, its confirmed entries and its queue."""

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


class ManagedLedger:
    def __init__(self, topic: TopicName, store: MetadataStore, storage: Storage,
                 ownership_key: str, ownership_value: bytes, epoch: int,
                 executor: Executor, config: LedgerConfig | None = None,
                 lease_ok: Callable[[], bool] = lambda: True,
                 entry_cache: EntryCache | None = None):
        self.topic = topic
        self._lease_ok = lease_ok  # False once this broker's lease may have expired
        self.store = store
        self.storage = storage
        self.epoch = epoch
        self.config = config or LedgerConfig()
        self._own_key = ownership_key
        self._own_value = ownership_value
        self._executor = executor
        self._list_key = keys.ledgers(topic)
        self._list = mpb.LedgerList()
        self._list_rev = 0
        self._list_lock = asyncio.Lock()
        self.entry_cache = entry_cache if entry_cache is not None else EntryCache()
        self._mem: dict[int, TailEntries] = {}       # unsealed ledgers, by id
        self.reader = LedgerListReader(storage, executor, lambda: self._list.ledgers,
                                       self._mem.get, cache=self.entry_cache)
        self._listeners: list[ViewListener] = []
        self._current: _OpenLedger | None = None
        self._draining: list[_OpenLedger] = []  # rolled ledgers whose writer has not ended
        self._roll_task: asyncio.Task | None = None
        self._blocked: deque[tuple] = deque()  # appends waiting for a ledger switch, in order
        self._seal_tasks: set[asyncio.Task] = set()
        self._fenced: errors.ShadowTopicError | None = None
        self.on_sealed: Callable[[mpb.LedgerInfo], None] | None = None
        self.on_fenced: Callable[["ManagedLedger"], None] | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    @classmethod
    async def open(cls, *args, **kwargs) -> "ManagedLedger":
        ml = cls(*args, **kwargs)
        await ml._load()
        return ml

    async def _load(self) -> None:
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
        cut short. Safe here: the new owner runs it before it creates any file itself."""
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
        """Seal an OPEN ledger left by a previous owner from its WAL (cutting a torn tail)."""
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

    async def close(self) -> None:
        """Stop taking appends, finish every queued write and seal; the WAL stays for the
        next owner (who seals the open ledger)."""
        if self._fenced is None:
            self._fenced = errors.TopicNotOwned(f"{self.topic} is closing on this broker")
        while self._roll_task is not None:
            await asyncio.gather(self._roll_task, return_exceptions=True)
        self._fail_blocked(self._fenced)
        cur = self._current
        if cur is not None:
            cur.closing = True
            cur.wake.set()
            if cur.writer is not None:
                await asyncio.gather(cur.writer, return_exceptions=True)
            cur.wal.close()
        if self._seal_tasks:
            await asyncio.wait(list(self._seal_tasks), timeout=30)
        for tail in self._mem.values():  # what is left is read from the WALs, if at all
            tail.drop_all()
        self.reader.forget_wals()
        self._notify_closed()

    @property
    def fenced(self) -> errors.ShadowTopicError | None:
        """Why this ledger takes no more appends (closed, or ownership lost), or None."""
        return self._fenced

    def fence(self, err: errors.ShadowTopicError) -> None:
        """Refuse further appends (ownership lost); the owner of this object drops it."""
        if self._fenced is None:
            self._fenced = err
            log.warning("%s fenced: %s", self.topic, err)
            self._notify_closed()
            if self.on_fenced is not None:
                self.on_fenced(self)

    @property
    def ownership(self) -> tuple[str, bytes]:
        """(ownership key, value) this ledger writes under."""
        return self._own_key, self._own_value

    # ---- LedgerView ------------------------------------------------------------------------

    @property
    def closed(self) -> errors.ShadowTopicError | None:
        return self._fenced

    def add_listener(self, listener: ViewListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: ViewListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def ranges(self) -> list[LedgerRange]:
        return self.reader.ranges()

    def first_position(self) -> MessageId | None:
        return self.reader.first_position()

    def last_confirmed(self) -> MessageId | None:
        return self.reader.last_confirmed()

    def next_position(self) -> MessageId:
        # A rolled ledger whose writer is still draining confirms more entries after the
        # switch: until it is done, the next entry is its next one, never the new ledger's
        # first (a reader at its end would be moved past entries still to come).
        cur = self._draining[0] if self._draining else self._current
        return MessageId(cur.ledger_id, len(cur.entries))

    def valid_position(self, position: MessageId) -> MessageId:
        return self.reader.valid_position(position, self.next_position())

    def entries_between(self, start: MessageId, end: MessageId) -> int:
        return self.reader.entries_between(start, end)

    async def position_at_time(self, publish_ms: int) -> MessageId:
        return await self.reader.position_at_time(publish_ms) or self.next_position()

    async def read(self, start: MessageId, max_entries: int, max_bytes: int) -> list[ReadEntry]:
        return await self.reader.read(start, max_entries, max_bytes)

    # ---- stats -----------------------------------------------------------------------------

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

    def storage_size(self) -> int:
        return sum(r.size_bytes for r in self.reader.ranges())

    def number_of_entries(self) -> int:
        return sum(r.entries for r in self.reader.ranges())

    @property
    def entries_deleted(self) -> int:
        return self._list.entries_deleted

    @property
    def current_ledger(self) -> tuple[int, int, int]:
        cur = self._current
        return cur.ledger_id, len(cur.entries), cur.entries.size

    # ---- metadata --------------------------------------------------------------------------

    async def _update_list(self, mutate: Callable[[mpb.LedgerList], T]) -> T:
        """Apply `mutate` to a copy of the ledger list and write it with one CAS; returns what
        the mutation that was written returned. On a CAS failure the list is re-read and
        `mutate` runs again on the fresh copy, so a mutator must be a pure function of the
        list it is given (no side effects outside it)."""
        async with self._list_lock:
            new = mpb.LedgerList()
            new.CopyFrom(self._list)
            result = mutate(new)
            new.writer_epoch = self.epoch
            for _attempt in range(3):
                try:
                    res = await self.store.txn(
                        [Compare(self._list_key, "mod_revision", "==", self._list_rev),
                         Compare(self._own_key, "value", "==", self._own_value)],
                        [Put(self._list_key, new.SerializeToString())])
                    if res.succeeded:
                        self._list = new
                        self._list_rev = res.revision
                        return result
                    # the list moved under us (e.g. a write whose reply was lost) or we
                    # lost the topic: re-read both and retry only if we still own it
                    own = await self.store.get(self._own_key)
                    if own is None or own.value != self._own_value:
                        break
                    kv = await self.store.get(self._list_key)
                except MetadataUnavailable as exc:
                    raise errors.MetadataUnavailable(str(exc)) from None
                self._list = mpb.LedgerList.FromString(kv.value) if kv else mpb.LedgerList()
                self._list_rev = kv.mod_revision if kv else 0
                new = mpb.LedgerList()
                new.CopyFrom(self._list)
                result = mutate(new)
                new.writer_epoch = self.epoch
            err = errors.Fenced(f"{self.topic}: ownership lost (epoch {self.epoch})")
            self.fence(err)
            raise err

    async def _create_ledger(self) -> _OpenLedger:
        try:
            lid = await self.store.next_id(keys.LEDGER_ID_COUNTER)
        except MetadataUnavailable as exc:
            raise errors.MetadataUnavailable(f"cannot start a new ledger: {exc}") from None
        rel = self.storage.wal_rel(self.topic, lid)
        loop = asyncio.get_running_loop()
        wal = await loop.run_in_executor(self._executor, walmod.WalFile.create,
                                         self.storage.wal_path(rel), lid)
        info = mpb.LedgerInfo(ledger_id=lid, state=OPEN, wal_path=rel, created_ms=now_ms())
        try:
            await self._update_list(lambda lst: lst.ledgers.append(info))
        except errors.ShadowTopicError:
            wal.close()
            self.storage.delete_wal(rel)
            raise
        led = _OpenLedger(lid, wal, rel, TailEntries(self.entry_cache, wal.path))
        self._mem[lid] = led.entries
        led.writer = asyncio.create_task(self._write_loop(led), name=f"wal-{lid}")
        return led

    # ---- append ----------------------------------------------------------------------------

    async def append(self, raws: list[bytes], request: bytes, size: int) -> tuple[int, int]:
        """Append a batch durably; return (ledger_id, first_entry_id) after the fsync.
        `request` is the ProduceRequest the raws came in (written to the WAL as it is).
        Order is kept across ledger switches: while the current ledger is full, batches wait
        in `_blocked` and move to the new ledger in arrival order."""
        if self._fenced is not None:
            raise self._fenced
        if not self._lease_ok():
            self.fence(errors.Fenced(f"{self.topic}: this broker's lease may have expired"))
            raise self._fenced
        fut = asyncio.get_running_loop().create_future()
        item = (raws, request, size, fut)
        if self._blocked or self._current.full(self.config):
            self._blocked.append(item)
            self._ensure_roll()
        else:
            self._enqueue(self._current, item)
        return await fut

    @staticmethod
    def _enqueue(led: _OpenLedger, item: tuple) -> None:
        led.pending.append(item)
        led.queued_entries += len(item[0])
        led.queued_bytes += item[2]
        led.wake.set()

    def _ensure_roll(self) -> None:
        if self._roll_task is None:
            self._roll_task = asyncio.create_task(self._roll())
            self._roll_task.add_done_callback(_consume)

    def _drain_blocked(self) -> None:
        while self._blocked and not self._current.full(self.config):
            self._enqueue(self._current, self._blocked.popleft())
        if self._blocked:
            self._ensure_roll()

    def _fail_blocked(self, exc: BaseException) -> None:
        if isinstance(exc, MetadataUnavailable):
            exc = errors.MetadataUnavailable(f"cannot start a new ledger: {exc}")
        elif not isinstance(exc, errors.ShadowTopicError):
            exc = errors.Internal(f"cannot start a new ledger: {exc}")
        while self._blocked:
            fut = self._blocked.popleft()[3]
            if not fut.done():
                fut.set_exception(exc)

    async def _write_loop(self, led: _OpenLedger) -> None:
        loop = asyncio.get_running_loop()
        encode = walmod.encode_batch
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
                publish_ms = now_ms()
                next_id = len(led.entries)
                firsts, frames = [], []
                for raws, request, _size, _fut in group:
                    firsts.append(next_id)
                    frames.append(encode(next_id, publish_ms, request, len(raws)))
                    next_id += len(raws)
                at = led.wal.size  # where the first frame goes
                try:
                    await loop.run_in_executor(self._executor, led.wal.write_sync,
                                               b"".join(frames))
                except OSError as exc:
                    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
                    cls = errors.StorageFull if full else errors.Internal
                    err = cls(f"{self.topic}: WAL write failed: {exc.strerror or exc}")
                    if led.wal.broken:  # could not cut the failed frame off: stop here
                        self.fence(errors.Internal(f"{self.topic}: WAL unusable: {exc}"))
                    for raws, _request, size, fut in group:
                        led.queued_entries -= len(raws)
                        led.queued_bytes -= size
                        if not fut.done():
                            fut.set_exception(err)
                    continue
                if not self._lease_ok():
                    # durable, but this broker may no longer own the topic: acknowledge
                    # nothing (the next owner's recovery decides what the log holds)
                    self.fence(errors.Fenced(f"{self.topic}: lease may have expired"))
                    for *_rest, fut in group:
                        if not fut.done():
                            fut.set_exception(self._fenced)
                    continue
                ents = led.entries
                for (raws, _request, size, fut), first, frame in zip(group, firsts, frames):
                    ents.confirmed(publish_ms, raws, size, at, len(frame))  # evictable now
                    at += len(frame)
                    if not fut.done():
                        fut.set_result((led.ledger_id, first))
                self._notify()
            if led.closing and not led.pending:
                return

    def _notify(self) -> None:
        for listener in list(self._listeners):
            listener.on_entries()

    def _notify_closed(self) -> None:
        for listener in list(self._listeners):
            listener.on_closed(self._fenced)

    # ---- rollover and sealing --------------------------------------------------------------

    async def _roll(self) -> asyncio.Task:
        """Switch to a new ledger; the old one drains and seals in its own task (returned)."""
        try:
            new = await self._create_ledger()
        except BaseException as exc:
            self._roll_task = None
            log.warning("%s: rollover failed: %s", self.topic, exc)
            self._fail_blocked(exc)
            raise
        old, self._current = self._current, new
        new.after = old.writer
        self._draining.append(old)
        seal = asyncio.create_task(self._drain_and_seal(old), name=f"seal-{old.ledger_id}")
        self._seal_tasks.add(seal)
        seal.add_done_callback(self._seal_done)
        self._roll_task = None
        self._drain_blocked()
        return seal

    async def _drain_and_seal(self, old: _OpenLedger) -> mpb.LedgerInfo | None:
        old.closing = True
        old.wake.set()
        try:
            await asyncio.gather(old.writer, return_exceptions=True)
        finally:
            if old in self._draining:
                self._draining.remove(old)
        old.wal.close()
        return await self._seal(old.ledger_id, old.wal_rel, old.entries.frames, len(old.entries))

    def _seal_done(self, task: asyncio.Task) -> None:
        self._seal_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s: sealing failed (the next owner seals it): %s", self.topic,
                        task.exception())

    async def roll(self) -> mpb.LedgerInfo | None:
        """Seal the current ledger now (RollLedger); returns the sealed ledger's info, or the
        newest sealed ledger when the current one is empty."""
        if self._fenced is not None:
            raise self._fenced
        while self._roll_task is not None:  # a roll may start another (blocked appends)
            await asyncio.gather(self._roll_task, return_exceptions=True)
        if self._fenced is not None:
            raise self._fenced
        if self._current.queued_entries == 0:
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
        if (self._fenced is None and self._roll_task is None and cur.queued_entries
                and time.monotonic() - cur.created >= self.config.max_age_s):
            await self.roll()
            return True
        return False

    async def _seal(self, lid: int, wal_rel: str, frames: walmod.FrameIndex, count: int
                    ) -> mpb.LedgerInfo | None:
        """Write a ledger that takes no more appends to Parquet from its WAL (the `count`
        entries of `frames`, streamed: source/ledger/sealed.py), then mark it SEALED."""
        if count == 0:
            await self._update_list(lambda lst: retention.remove_ledgers(lst, {lid}))
            self._forget_tail(lid)
            self.storage.delete_wal(wal_rel)
            return None
        rel = self.storage.sealed_rel(self.topic, lid)
        res = await asyncio.get_running_loop().run_in_executor(
            self._executor, lambda: seal_wal(self.storage.fs, self.storage.full(rel),
                                             self.storage.wal_path(wal_rel), frames, count,
                                             ledger_id=lid))
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
        self._mem.pop(lid, TailEntries(self.entry_cache, "")).drop_all()
        self.reader.forget_wal(lid)

    # ---- retention and truncation ----------------------------------------------------------

    async def apply_retention(self, time_s: int, size_bytes: int,
                              keep_from: MessageId | None = None) -> tuple[int, int]:
        """Delete the sealed ledgers retention picks (source/ledger/retention.py): beyond
        the time / size limits (-1 = no limit), never from the ledger of `keep_from` (the
        first entry a durable subscription has not acknowledged) on."""
        cutoff = now_ms() - time_s * 1000 if time_s >= 0 else None
        return await self._delete_ledgers(lambda lst: retention.victims(
            lst.ledgers, self._size, cutoff, size_bytes, keep_from))

    async def truncate(self) -> tuple[int, int]:
        """Seal the current ledger and delete every sealed ledger (cursors move to the end)."""
        await self.roll()
        return await self._delete_ledgers(
            lambda lst: [i for i in lst.ledgers if i.state == SEALED])

    async def _delete_ledgers(self, select: Callable[[mpb.LedgerList], list]) -> tuple[int, int]:
        """Delete the ledgers `select` picks from the list as it is inside the list lock, so
        concurrent retention and truncate never count a ledger twice."""
        def drop(lst: mpb.LedgerList) -> list[mpb.LedgerInfo]:
            victims = [mpb.LedgerInfo.FromString(i.SerializeToString()) for i in select(lst)]
            retention.remove_ledgers(lst, {i.ledger_id for i in victims})
            lst.entries_deleted += sum(i.entries for i in victims)
            return victims

        if not select(self._list):
            return 0, 0
        victims = await self._update_list(drop)
        for info in victims:
            self.reader.forget(info.ledger_id)
            self.storage.delete(info.path)
        if victims:
            trimmed = Trimmed(tuple(LedgerRange(i.ledger_id, i.entries, True, i.size_bytes)
                                    for i in victims))
            for listener in list(self._listeners):
                listener.on_trimmed(trimmed)
        return len(victims), sum(i.entries for i in victims)

    def _size(self, info: mpb.LedgerInfo) -> int:
        mem = self._mem.get(info.ledger_id)
        return mem.size if mem is not None else info.size_bytes

def _consume(task: asyncio.Task) -> None:
    """Retrieve a background task's exception (it is reported where it matters)."""
    if not task.cancelled():
        task.exception()
