"""Following metadata keys: the one way every follower does it (docs/ARCHITECTURE.md,
"Metadata in etcd": list, then watch from the listed revision + 1; list again when that
revision was compacted away or the store went away).

`Follower` is that loop, over every key under a prefix; what a list and a batch of watch
events become is its subclass's: `KeyFollower` follows one key, `PrefixFollower` hands the
lists and the batches of a whole prefix to two callbacks.

`KeyFollower(store, key, apply, retry_delay)` hands every new value of one key (None: the
key was deleted) and its mod revision to `apply(value, revision)`, a plain function or a
coroutine function:

- **Version-monotonic.** A value is applied only when its mod revision is higher than the
  one already held, so a re-list, a `refresh` and the watch may all deliver the same update
  in any order and it is applied once, and an older value never replaces a newer one. A
  deletion of a key never held applies nothing.
- **Serialized.** Applies never overlap: the watch, a re-list and `refresh` take turns
  (a lock held across the check, the apply and the update of `revision`), so an async
  apply (starting replicators, opening a ledger in an executor) sees one value at a time.
- **One key.** A watch on a key also matches longer keys sharing it as a prefix (etcd
  watches ranges); their events are ignored. (The key schema keeps every followed key from
  being a prefix of another, so etcd does not even send them: source/metadata/keys.py.)
- **Nothing lost while starting.** `start` lists the key (its errors reach the caller,
  nothing is started then), applies it, and only then starts the watch task, which watches
  from the listed revision + 1, so an update written in between is replayed by the watch
  (or, if the store compacted that revision meanwhile, found by the re-list that the
  watch's `RevisionCompacted` leads to).
- **Never silently stopped.** Whatever ends the watch (`RevisionCompacted`: list again at
  once; `MetadataUnavailable`, a watch that just ends, any other error of the store or of
  `apply`, a cancellation that is not `close`: list again after `retry_delay`, and again
  until a list succeeds) the task lists the key again and watches from there; `relists`
  counts those re-lists. Only `close` stops it. An etcd that is paused and resumed keeps the
  watch stream (its events come late, none lost); one killed and restarted breaks it and the
  follower re-lists once etcd answers again.

Raising in `apply` means "not applied": the value is not held, and the next list offers it
again (after `retry_delay`). The follower only reads: it never writes to the store.

Every follower of one key uses `KeyFollower`: a shadow's ledger list (shadow/ledger.py) and
info (shadow/served.py), a source's shadow list (shadow/replicators.py), a compaction pointer
(compaction/view.py). `PrefixFollower(store, prefix, on_snapshot, on_events)` follows every
key under a prefix (the compaction worker's queue of requests, compaction/worker.py): each
list goes to `on_snapshot(snap)` (the prefix's whole state), each batch of watch events to
`on_events(events)`, one call at a time, with the same loop: never silently stopped.
"""
from __future__ import annotations

import abc
import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

from shadowtopic.metadata.base import (
    MetadataStore,
    MetadataUnavailable,
    RevisionCompacted,
    Snapshot,
    WatchEvent,
)

log = logging.getLogger(__name__)

#: apply(value, revision): the key's new value (None: deleted) as of `revision`; a plain
#: function or a coroutine function
Apply = Callable[[bytes | None, int], "Awaitable[None] | None"]

#: PrefixFollower's callbacks: a list of the prefix, a batch of its watch events
OnSnapshot = Callable[[Snapshot], Awaitable[None]]
OnEvents = Callable[[list[WatchEvent]], Awaitable[None]]


class Follower(abc.ABC):
    """The list-then-watch loop over the keys under `prefix` (see the module doc)."""

    def __init__(self, store: MetadataStore, prefix: str, retry_delay: float = 0.5):
        self.store = store
        self.prefix = prefix
        self.retry_delay = retry_delay
        # re-lists after the start (compacted revision, store unavailable, errors)
        self.relists = 0
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._failing = False  # the last list or watch failed (log the first failure only)

    @property
    def running(self) -> bool:
        """True from a successful `start` until `close`."""
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """List the prefix and take it, then follow it in a task. Raises
        `MetadataUnavailable` when the first list fails, or what taking it raised (nothing
        is started then)."""
        if self._task is not None:
            raise RuntimeError(f"follower of {self.prefix} already started")
        snap = await self.store.get_prefix(self.prefix)
        await self._take_snapshot(snap)
        if self._closed:
            return  # closed while it listed: nothing to follow
        if self._failing:
            log.info("%s: following from revision %d", self.prefix, snap.revision)
            self._failing = False
        self._task = asyncio.get_running_loop().create_task(
            self._follow(snap.revision), name=f"follow {self.prefix}")

    async def start_retrying(self) -> None:
        """`start`, tried again every `retry_delay` until it succeeds (the store is
        unavailable, or taking the first list failed), for a follower whose owner goes on
        meanwhile: run it as a task. `close` stops the trying too."""
        while not self._closed:
            try:
                return await self.start()
            except MetadataUnavailable as exc:
                self._log_failure(logging.INFO, f"not started: {exc}")
            except Exception:  # noqa: BLE001 - nothing may end the following
                self._log_failure(logging.ERROR, "not started", exc_info=True)
            await asyncio.sleep(self.retry_delay)

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    @abc.abstractmethod
    async def _take_snapshot(self, snap: Snapshot) -> object:
        """A list of the prefix (its whole state at `snap.revision`)."""

    @abc.abstractmethod
    async def _take_events(self, events: list[WatchEvent]) -> None:
        """A batch of watch events under the prefix, in revision order."""

    # ---- following -----------------------------------------------------------------------

    async def _follow(self, listed: int | None) -> None:
        revision = listed
        while True:
            try:
                if revision is None:
                    snap = await self.store.get_prefix(self.prefix)
                    await self._take_snapshot(snap)
                    revision = snap.revision
                    if self._failing:
                        log.info("%s: following again from revision %d", self.prefix, revision)
                        self._failing = False
                await self._watch(revision + 1)
                raise MetadataUnavailable("the watch ended")
            except RevisionCompacted as exc:
                log.info("%s: %s; listing again", self.prefix, exc)
                delay = 0.0
            except MetadataUnavailable as exc:
                self._log_failure(logging.INFO, str(exc))
                delay = self.retry_delay
            except asyncio.CancelledError:
                if self._closed or _cancelling():
                    raise
                # not ours (something inside the store or `apply` was cancelled): go on
                self._log_failure(logging.WARNING, "cancelled from inside")
                delay = self.retry_delay
            except Exception:  # noqa: BLE001 - nothing may end the following
                self._log_failure(logging.ERROR, "following failed", exc_info=True)
                delay = self.retry_delay
            revision = None  # list again
            self.relists += 1
            await asyncio.sleep(delay)  # 0: still let others run, never spin

    async def _watch(self, start_revision: int) -> None:
        watch = self.store.watch_prefix(self.prefix, start_revision)
        try:
            async for events in watch:
                await self._take_events(events)
        finally:  # close the watch now, not at garbage collection
            aclose = getattr(watch, "aclose", None)
            if aclose is not None:
                await aclose()

    def _log_failure(self, level: int, what: str, exc_info: bool = False) -> None:
        """Log the first failure of a run of them at `level`, the rest at debug."""
        log.log(logging.DEBUG if self._failing else level, "%s: %s; listing again in %.1fs",
                self.prefix, what, self.retry_delay, exc_info=exc_info)
        self._failing = True


class KeyFollower(Follower):
    """Every new value of one key to `apply`, version-monotonically (see the module doc)."""

    def __init__(self, store: MetadataStore, key: str, apply: Apply,
                 retry_delay: float = 0.5):
        super().__init__(store, key, retry_delay)
        self.key = key
        self._apply = apply
        #: mod revision of the value held (of the deletion when it was deleted); 0: none yet
        self.revision = 0
        self._present = False
        self._lock = asyncio.Lock()  # serializes applies

    async def refresh(self) -> bool:
        """Read the key now (a reader found the state it holds outdated: a WAL that was
        sealed and removed, a file retention deleted). True when that changed it."""
        try:
            snap = await self.store.get_prefix(self.key)
        except MetadataUnavailable as exc:
            log.info("%s: refresh failed: %s", self.key, exc)
            return False
        return await self._take_snapshot(snap)

    # ---- applying ------------------------------------------------------------------------

    async def _offer(self, value: bytes | None, revision: int) -> bool:
        async with self._lock:
            if revision <= self.revision:
                return False  # already held, or older than what is held
            if value is None and not self._present:
                self.revision = revision
                return False  # deleted, and we never held it: nothing changes
            result = self._apply(value, revision)  # raises: not held, the next list offers it
            if inspect.isawaitable(result):
                await result
            self.revision = revision
            self._present = value is not None
            return True

    async def _take_snapshot(self, snap: Snapshot) -> bool:
        kv = next((kv for kv in snap.items if kv.key == self.key), None)
        if kv is not None:
            return await self._offer(kv.value, kv.mod_revision)
        # absent at snap.revision: deleted at or before it (any later put is newer)
        return await self._offer(None, snap.revision)

    async def _take_events(self, events: list[WatchEvent]) -> None:
        mine = [e for e in events if e.key == self.key]  # the prefix may match longer keys
        if mine:  # each value is the key's whole state: the last one of a batch is enough
            last = mine[-1]
            await self._offer(last.value if last.type == "put" else None, last.mod_revision)


class PrefixFollower(Follower):
    """Every list and every batch of watch events of a prefix to two callbacks, one call at
    a time (see the module doc)."""

    def __init__(self, store: MetadataStore, prefix: str, on_snapshot: OnSnapshot,
                 on_events: OnEvents, retry_delay: float = 0.5):
        super().__init__(store, prefix, retry_delay)
        self._on_snapshot = on_snapshot
        self._on_events = on_events

    async def _take_snapshot(self, snap: Snapshot) -> None:
        await self._on_snapshot(snap)

    async def _take_events(self, events: list[WatchEvent]) -> None:
        await self._on_events(events)


def _cancelling() -> bool:
    """True when the running task has been asked to cancel (by `close` or its owner)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
