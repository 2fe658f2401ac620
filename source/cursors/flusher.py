"""`CursorFlusher`: persists a topic's changed cursors in one batch per interval.

The subscription engine marks a cursor dirty after it changes (`mark`), or gone (`remove`);
ONE asyncio task per topic saves everything marked since the last flush with one
`CursorStore.save` every `interval` seconds (never a task or a write per subscription). A
restart restores cursors at most one interval (plus one save) old: acknowledged messages
of that window are redelivered, nothing unacknowledged is lost (C4, docs/BEHAVIOURS.md).

`persist(name, state)` is the other way in: a change whose answer says it is done (reset,
seek, skip, clear-backlog, issue 29) is written at once, as a batch of just the cursors
asked for, before the caller answers. Calls that arrive while such a write (or a flush) is in
flight share the next write (group commit: one task, `_write_urgent`). Both ways take
`_lock` and read the states inside it, so writes reach the store in the order their states
were read: a flush can never put an older state of a cursor over one `persist` wrote. A
cursor persisted and not changed since is clean (the next flush skips it); one changed since
stays dirty for the next flush.

A failed save keeps its cursors dirty (a newer mark wins) and is retried at the next tick:
acks stay in memory and are flushed once storage takes writes again (a full or read-only
disk fails saves with `StorageFull` / `StorageReadOnly`, logged when a run of failures
starts, every LOG_EVERY failures of it, and when it ends).
`errors.Fenced` stops the flusher for good (`fenced` says why; the topic's new owner
writes its cursors from now on). `close()` stops the task and flushes what is left.
"""
from __future__ import annotations

import asyncio
import logging
import time

from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.cursors.state import CursorState
from shadowtopic.cursors.store import CursorStore, Fence, records

log = logging.getLogger(__name__)
LOG_EVERY = 60  # failed saves in a row between two warnings


class CursorFlusher:
    def __init__(self, store: CursorStore, topic: TopicName, fence: Fence,
                 interval: float = 1.0):
        self.store = store
        self.topic = topic
        self.fence = fence
        self.interval = interval
        self.fenced: errors.ShadowTopicError | None = None
        self.flushes = 0           # successful batched saves
        self.cursors_flushed = 0   # cursor states written by them
        self.failures = 0
        self.failing = 0           # failed saves since the last successful one
        self.last_flush_s = 0.0    # duration of the last successful save
        self._saving = 0           # cursors in the batched save under way
        self.persists = 0          # successful `persist` writes (each may serve many calls)
        self._dirty: dict[str, CursorState | None] = {}
        #: cursors `persist` was asked for, waiting for the next urgent write, and the
        #: future that write resolves (every caller in the batch awaits it)
        self._urgent: dict[str, CursorState] = {}
        self._joining: asyncio.Future[None] | None = None
        self._writer: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closed = False

    def start(self) -> CursorFlusher:
        if self._task is None and not self._closed:
            self._task = asyncio.create_task(self._run(), name=f"cursor-flush:{self.topic}")
        return self

    @property
    def pending(self) -> int:
        """Cursors changed since the last successful save."""
        return len(self._dirty)

    def mark(self, name: str, state: CursorState) -> None:
        """`state` changed: save it with the next batch (the flusher reads it then)."""
        self._check_open()
        self._dirty[name] = state

    def mark_many(self, changed: list[tuple[str, CursorState]]) -> None:
        """`mark` of many cursors."""
        self._check_open()
        self._dirty.update(changed)

    def mark_all(self, names: list[str], state: CursorState) -> None:
        """`mark` of many cursors holding one state object (a cohort's)."""
        self._check_open()
        self._dirty.update(dict.fromkeys(names, state))

    def remove(self, name: str) -> None:
        """The cursor was deleted: delete it with the next batch."""
        self._check_open()
        self._dirty[name] = None

    async def persist(self, name: str, state: CursorState) -> None:
        """Write `state` now, durably, and return once it is (a change whose answer says
        done). It joins the next urgent write, so concurrent calls share one store save of
        just their cursors, never a flush of every dirty cursor. Raises what the save
        raised (`errors.Fenced`, storage errors); the cursor then stays dirty, and the flush
        retries it as it would an acknowledgement."""
        self._check_open()
        self._dirty[name] = state
        self._urgent[name] = state
        if self._joining is None:
            self._joining = asyncio.get_running_loop().create_future()
        joined = self._joining
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_urgent(),
                                               name=f"cursor-persist:{self.topic}")
        await asyncio.shield(joined)

    async def _write_urgent(self) -> None:
        """Save what `persist` was asked for, a batch at a time, until nothing waits."""
        while self._urgent:
            async with self._lock:
                batch, self._urgent = self._urgent, {}
                done, self._joining = self._joining, None
                if done is None:  # persist sets it with every urgent cursor: cannot happen
                    raise errors.Internal(f"{self.topic}: urgent cursors without their waiter")
                written = records(batch)  # what the save below writes, read now
                try:
                    if self.fenced is not None:
                        raise self.fenced
                    await self.store.save(self.topic, batch, self.fence, urgent=True)
                except asyncio.CancelledError:
                    done.cancel()
                    raise
                except Exception as exc:  # noqa: BLE001 - every caller of the batch hears it
                    for name, state in batch.items():
                        self._dirty.setdefault(name, state)  # the flush retries it
                    self.failures += 1
                    if isinstance(exc, errors.Fenced):
                        self.fenced = exc
                    done.set_exception(exc)
                    done.exception()  # retrieved here too: a cancelled caller leaves no noise
                    continue
                for name, state in batch.items():  # unchanged since: nothing left to flush
                    if self._dirty.get(name) is state and state.to_record() == written[name]:
                        del self._dirty[name]
                self.persists += 1
                self.cursors_flushed += len(batch)
                done.set_result(None)

    def discard(self) -> None:
        """Forget the unsaved changes (the topic is being deleted)."""
        self._dirty.clear()

    def _check_open(self) -> None:
        if self.fenced is not None:
            raise self.fenced
        if self._closed:
            raise errors.AlreadyClosed(f"cursor flusher of {self.topic} is closed")

    @property
    def unsaved(self) -> int:
        """Cursors changed and not saved yet: waiting for the next flush, or in the one
        under way (what a kill -9 now would take back to their last save)."""
        return len(self._dirty) + self._saving

    async def flush_now(self) -> int:
        """Save every dirty cursor now; returns how many were saved."""
        if self.fenced is not None:
            raise self.fenced
        async with self._lock:
            batch, self._dirty = self._dirty, {}
            if not batch:
                return 0
            started = time.perf_counter()
            self._saving = len(batch)
            try:
                await self.store.save(self.topic, batch, self.fence)
            except BaseException as exc:
                self._saving = 0
                for name, state in batch.items():
                    self._dirty.setdefault(name, state)  # marks made meanwhile are newer
                self.failures += 1
                if isinstance(exc, errors.Fenced):
                    self.fenced = exc
                raise
            self._saving = 0
            self.last_flush_s = time.perf_counter() - started
            if self.failing:
                log.info("%s: cursors saved again after %d failed saves", self.topic,
                         self.failing)
                self.failing = 0
            self.flushes += 1
            self.cursors_flushed += len(batch)
            return len(batch)

    async def _run(self) -> None:
        next_at = time.monotonic() + self.interval
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), max(0.0, next_at - time.monotonic()))
                return
            except TimeoutError:
                pass
            next_at = time.monotonic() + self.interval
            try:
                await self.flush_now()
            except errors.Fenced as exc:
                log.warning("%s: cursor flusher stops: %s", self.topic, exc)
                return
            except Exception as exc:  # noqa: BLE001 - keep flushing: the batch stays dirty
                self.failing += 1
                if self.failing % LOG_EVERY == 1:
                    log.warning("%s: cursor flush failed (%d in a row; %d acked cursors kept "
                                "in memory, retrying every %.1fs): %s", self.topic,
                                self.failing, len(self._dirty), self.interval, exc,
                                exc_info=not isinstance(exc, errors.ShadowTopicError))

    async def close(self, timeout: float = 10.0) -> None:
        """Stop the task (letting a save in flight finish) and flush what is left, bounded
        by `timeout`; raises what the last flush raised (e.g. `errors.Fenced`)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        running = [t for t in (self._task, self._writer) if t is not None]
        if running:
            await asyncio.wait_for(asyncio.gather(*running, return_exceptions=True), timeout)
        if self.fenced is not None:
            raise self.fenced
        await asyncio.wait_for(self.flush_now(), timeout)
