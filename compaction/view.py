"""`CompactedView`: a topic as `read_compacted` readers see it, a `LedgerView` wrapper.

Ids at or before the horizon are served from the compacted ledger (compaction/ledger.py:
the latest message of each key, keyless ones by policy, and recent deletes: a kept tombstone
is served as the empty-payload message it is, like a tombstone of the raw tail, K18); ids
after it from the topic's own view (the raw ledgers), so a reader crosses the horizon with
no gap and no duplicate (K7). A position at a compacted-away id lands on the next surviving
id, or past the horizon on the first raw entry after it (K8). Without a compacted ledger the
view is the raw view. The raw ledgers before the horizon may be gone (retention): the
compacted prefix does not need them (K15). A pointer whose ledger cannot be opened (a file
is missing or corrupt) makes reads at or before the horizon fail with that error (`DataLoss`,
K17), and `last_readable` (what GetLastMessageId with read_compacted answers) too when its
answer would come from there; the raw view is untouched.

A failed open is not final: the store may be back in a moment (an S3 hiccup, a timeout). While
the broken pointer is still the current one, `update` opens it again in the background after
0.5 s, then doubling to at most 30 s between tries (`retry_first`, `retry_max`); a
`ChecksumError` (a file that does not match its manifest: corrupt, not away) is tried again at
the longest delay only. Each failed try logs one WARNING naming the topic and keeps the reads
failing, with the newest error; the first open that succeeds swaps the ledger in as any swap
does (listeners woken: readers go on by id). A newer pointer (or none) cancels the tries, as
does `close`. A replica never serves stale or partial data meanwhile: reads of the prefix fail
until the ledger opens. Failpoint `compaction.ledger.open` (source/failpoints.py) fails opens
in tests.

Pointer swaps (`update`: open in the executor, then `swap`) wake the listeners; readers go on
by id (a position the new ledger compacted away moves to the next survivor at the next
dispatch). A read takes one pointer for its whole call, so a swap while the executor reads
never pairs the old ledger's rows with the new horizon. Raw trims are passed on, but they
move nobody in the prefix: `valid_position` there answers from the compacted ledger, and
durable subscriptions reading this view skip `on_trimmed` (source/subscriptions/topic.py).

`CompactionFollower` keeps one topic's view on its current `CompactionPointer`
(keys.compaction of the topic whose ledgers are read: a shadow follows its source's, K10):
list-then-watch, each new pointer opened in an executor and swapped in whole, readers woken
to go on by id in the new one.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor

import pyarrow as pa

from shadowtopic import failpoints
from shadowtopic.compaction.ledger import CompactedLedger
from shadowtopic.compaction.opened import LedgerOpener, Unshared
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.entry_cache import EntryCache
from shadowtopic.ledger.storage import Storage
from shadowtopic.ledger.view import LedgerRange, LedgerView, ReadEntry, Trimmed, ViewListener
from shadowtopic.metadata import MetadataStore, keys
from shadowtopic.metadata.follow import KeyFollower
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

log = logging.getLogger(__name__)

RETRY_FIRST = 0.5   # seconds before a broken pointer's ledger is opened again, doubling ...
RETRY_MAX = 30.0    # ... to this (and a corrupt ledger's delay from the start)


def open_ledger(storage: Storage, manifest: mpb.CompactedManifest) -> CompactedLedger:
    """Open a pointer's compacted ledger (blocking: in the executor). Failpoint
    `compaction.ledger.open`: an injected error fails it as an unreachable store does."""
    try:
        failpoints.hit("compaction.ledger.open")
    except failpoints.FailpointError as exc:
        raise errors.DataLoss(f"the store failed to open it: {exc}") from None
    return CompactedLedger(storage, manifest)


class CompactedView:
    def __init__(self, raw: LedgerView, executor: Executor | None = None,
                 storage: Storage | None = None, name: TopicName | None = None,
                 retry_first: float = RETRY_FIRST, retry_max: float = RETRY_MAX,
                 ledgers: LedgerOpener | None = None):
        self.raw = raw
        self.executor = executor
        self.storage = storage  # where `update` opens compacted ledgers ...
        self.ledgers = ledgers  # ... through the broker's shared ones (compaction/opened.py)
        self.name = name or raw.ledgers_of  # the topic read, in logs
        self.retry_first, self.retry_max = retry_first, retry_max
        self._reopen: asyncio.Task | None = None  # opens a broken pointer again
        self._closed = False  # `close`d: nothing is tried again
        self.ledger: CompactedLedger | None = None
        self.horizon: MessageId | None = None
        self.broken: errors.ShadowTopicError | None = None  # the pointer's ledger is unreadable
        self.pointer: mpb.CompactionPointer | None = None
        self._listeners: list[ViewListener] = []
        self._updates = 0  # `update` calls started: an older one never swaps over a newer

    @property
    def entry_cache(self) -> EntryCache | None:
        return self.raw.entry_cache

    @property
    def ledgers_of(self) -> TopicName:
        return self.raw.ledgers_of

    # ---- the compacted ledger ---------------------------------------------------------------

    def swap(self, pointer: mpb.CompactionPointer | None, ledger: CompactedLedger | None,
             broken: errors.ShadowTopicError | None = None) -> None:
        """Serve `pointer` now (its opened ledger, or the error opening it gave). Listeners
        hear `on_entries`: readers go on by id in the new view (a position the new ledger
        compacted away moves to the next survivor at the next dispatch)."""
        # the replaced ledger is not closed here: a read of it may be running in the
        # executor; its files close when the last reference goes
        self.pointer, self.ledger, self.broken = pointer, ledger, broken
        self.horizon = MessageId(pointer.horizon.ledger_id, pointer.horizon.entry_id) \
            if pointer is not None else None
        for listener in list(self._listeners):
            listener.on_entries()

    async def update(self, pointer: mpb.CompactionPointer | None) -> None:
        """Open `pointer`'s compacted ledger (in the executor) and swap it in; a ledger that
        cannot be opened (a file missing or corrupt) is swapped in as broken: reads at or
        before its horizon raise that error (K17), and it is opened again in the background
        with backoff until it opens or another pointer comes (the module doc). The same
        pointer again changes nothing."""
        if pointer == self.pointer:
            return
        self._updates += 1
        mine = self._updates
        self._stop_reopen()  # a newer pointer: the older one is not tried again
        if pointer is None:
            self.swap(None, None)
            return
        opener = self._opener()  # (a view made for `swap`s only opens nothing)
        ledger, broken = None, None
        try:
            ledger = await opener.open(pointer.manifest)
        except errors.ShadowTopicError as exc:  # missing or corrupt: compacted reads fail
            log.error("%s: compacted ledger of job %s unreadable: %s", self.name,
                      pointer.job_id, exc)
            broken = exc
        if mine == self._updates:  # no newer pointer arrived while this one opened
            self.swap(pointer, ledger, broken)
            if broken is not None and not self._closed:
                self._reopen = asyncio.get_running_loop().create_task(
                    self._open_again(pointer, mine, broken))

    def _opener(self) -> LedgerOpener:
        """How compacted ledgers open: the broker's shared ones, or the view's own from its
        storage (a view made with neither serves `swap`s only)."""
        if self.ledgers is not None:
            return self.ledgers
        if self.storage is None:
            raise errors.Internal(f"{self.name}: a compacted view without storage cannot open "
                                  "a compaction pointer")
        return Unshared(self.storage, self.executor, open_ledger)

    def _delay(self, previous: float | None, exc: BaseException) -> float:
        if isinstance(exc, errors.ChecksumError):  # corrupt: not back soon, if ever
            return self.retry_max
        return self.retry_first if previous is None else min(previous * 2, self.retry_max)

    async def _open_again(self, pointer: mpb.CompactionPointer, mine: int,
                          first: BaseException) -> None:
        """Open the broken `pointer` again with backoff while it is the current one (see the
        module doc); the first success swaps it in."""
        delay = self._delay(None, first)
        while True:
            await asyncio.sleep(delay)
            if mine != self._updates or self.pointer is not pointer or self.broken is None:
                return  # a newer pointer (or a swap from elsewhere) is served
            try:
                ledger = await self._opener().open(pointer.manifest)
            except Exception as exc:  # noqa: BLE001 - tried again until the pointer changes
                if mine != self._updates or self.pointer is not pointer:
                    return
                delay = self._delay(delay, exc)
                log.warning("%s: compacted ledger of job %s still unreadable, trying again "
                            "in %.2fs: %s", self.name, pointer.job_id, delay, exc)
                if isinstance(exc, errors.ShadowTopicError):
                    self.broken = exc  # reads fail with the newest reason
                continue
            if mine == self._updates and self.pointer is pointer and self.broken is not None:
                log.info("%s: compacted ledger of job %s opened again", self.name,
                         pointer.job_id)
                self._reopen = None
                self.swap(pointer, ledger)
            return

    def _stop_reopen(self) -> None:
        task, self._reopen = self._reopen, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def close(self) -> None:
        """Stop opening a broken pointer again (the topic closes)."""
        self._closed = True
        task, self._reopen = self._reopen, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _in_prefix(self, position: MessageId, horizon: MessageId | None = None) -> bool:
        h = horizon if horizon is not None else self.horizon
        return h is not None and (position.ledger_id, position.entry_id) <= (h.ledger_id,
                                                                             h.entry_id)

    def _raw_after(self, horizon: MessageId) -> MessageId:
        """The first raw position after `horizon` (an entry, or where the next one goes)."""
        return self.raw.valid_position(MessageId(horizon.ledger_id, horizon.entry_id + 1))

    def raw_needed(self, position: MessageId) -> MessageId:
        """The first raw position a reader at `position` reads (retention keeps from there):
        past the horizon while the compacted ledger serves its prefix."""
        horizon = self.horizon
        if self.ledger is not None and horizon is not None and self._in_prefix(position, horizon):
            return MessageId(horizon.ledger_id, horizon.entry_id + 1)
        return position

    # ---- LedgerView -------------------------------------------------------------------------

    def ranges(self) -> list[LedgerRange]:
        return self.raw.ranges()

    def first_position(self) -> MessageId | None:
        ledger, horizon = self.ledger, self.horizon
        if horizon is None:
            return self.raw.first_position()
        if self.broken is not None or ledger is None:  # broken: no ledger with the horizon
            return MessageId(0, 0)  # where reads fail with the error
        if len(ledger):
            return MessageId(*ledger.id_at(0))
        nxt = self._raw_after(horizon)
        return nxt if nxt < self.raw.next_position() else None

    def last_confirmed(self) -> MessageId | None:
        """The newest id a compacted reader can read: the raw view's newest when it is past
        the horizon, else the last survivor (K9: not a compacted-away tombstone; a kept one is
        a survivor), else None.
        (Of a broken ledger: None; `last_readable` raises its error instead.)"""
        last = self.raw.last_confirmed()
        if self.horizon is None or (last is not None and not self._in_prefix(last)):
            return last
        if self.ledger is not None and len(self.ledger):
            return MessageId(*self.ledger.id_at(len(self.ledger) - 1))
        return None

    def last_readable(self) -> MessageId | None:
        """`last_confirmed`, raising the broken ledger's error when the answer would come
        from the compacted prefix (GetLastMessageId(read_compacted) fails loudly, K17)."""
        last = self.raw.last_confirmed()
        if self.broken is not None and (last is None or self._in_prefix(last)):
            raise self.broken
        return self.last_confirmed()

    def next_position(self) -> MessageId:
        return self.raw.next_position()

    def valid_position(self, position: MessageId) -> MessageId:
        ledger, horizon = self.ledger, self.horizon
        if horizon is None or not self._in_prefix(position, horizon):
            return self.raw.valid_position(position)
        if ledger is None:  # broken: reads there fail; the position stays
            return position
        i = ledger.find(position.ledger_id, position.entry_id)
        if i < len(ledger):
            return MessageId(*ledger.id_at(i))
        return self._raw_after(horizon)

    def entries_between(self, start: MessageId, end: MessageId) -> int:
        if self.horizon is None:
            return self.raw.entries_between(start, end)
        after = MessageId(self.horizon.ledger_id, self.horizon.entry_id + 1)
        n = 0
        if self.ledger is not None and start < after:
            n += self.ledger.count_between(start, min(end, after))
        if end > after:
            n += self.raw.entries_between(max(start, after), end)
        return n

    async def position_at_time(self, publish_ms: int) -> MessageId:
        ledger, horizon = self.ledger, self.horizon
        if ledger is not None and horizon is not None:
            i = ledger.first_published_at(publish_ms)
            if i < len(ledger):
                return MessageId(*ledger.id_at(i))
        found = await self.raw.position_at_time(publish_ms)
        ledger, horizon = self.ledger, self.horizon  # the pointer now, after the await
        if ledger is not None and horizon is not None and self._in_prefix(found, horizon):
            return self._raw_after(horizon)  # after every survivor: past the horizon
        return found  # (a broken prefix: there, where reads fail loudly)

    async def read_columns(self, start: MessageId, max_entries: int) -> pa.Table | None:
        """The compacted rows from `start` (within one file), or the raw ledgers' columns past
        the horizon; None at the end of the compacted prefix (`read` crosses to the tail)."""
        ledger, horizon, broken = self.ledger, self.horizon, self.broken
        if horizon is None or not self._in_prefix(start, horizon):
            return await self.raw.read_columns(start, max_entries)
        if broken is not None:
            raise broken
        if ledger is None:  # a horizon comes with its ledger or the error opening it
            raise errors.Internal(f"{self.name}: a compaction horizon without its ledger")
        index = ledger.find(start.ledger_id, start.entry_id)
        if index >= len(ledger):
            return None
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, ledger.read_columns, index, max_entries)

    async def read(self, start: MessageId, max_entries: int, max_bytes: int
                   ) -> list[ReadEntry]:
        # one pointer for the whole read: a swap while the executor reads must not pair the
        # old ledger's rows with the new horizon (the survivors between the two would be lost)
        ledger, horizon, broken = self.ledger, self.horizon, self.broken
        if horizon is None or not self._in_prefix(start, horizon):
            return await self.raw.read(start, max_entries, max_bytes)
        if broken is not None:
            raise broken
        if ledger is None:  # a horizon comes with its ledger or the error opening it
            raise errors.Internal(f"{self.name}: a compaction horizon without its ledger")
        out = await asyncio.get_running_loop().run_in_executor(
            self.executor, ledger.read, ledger.find(start.ledger_id, start.entry_id), max_entries,
            max_bytes)
        size = sum(len(e.raw) for e in out)
        if len(out) < max_entries and size < max_bytes and \
                (not out or ledger.find(out[-1].ledger_id, out[-1].entry_id + 1) >= len(ledger)):
            nxt = self._raw_after(horizon)  # the compacted prefix is done: the raw tail
            if nxt < self.raw.next_position():
                out += await self.raw.read(nxt, max_entries - len(out), max_bytes - size)
        return out

    @property
    def closed(self) -> errors.ShadowTopicError | None:
        return self.raw.closed

    def add_listener(self, listener: ViewListener) -> None:
        if not self._listeners:
            self.raw.add_listener(self)
        self._listeners.append(listener)

    def remove_listener(self, listener: ViewListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)
            if not self._listeners:
                self.raw.remove_listener(self)

    # ---- the raw view's signals, passed on ---------------------------------------------------

    def on_entries(self) -> None:
        for listener in list(self._listeners):
            listener.on_entries()

    def on_trimmed(self, trimmed: Trimmed) -> None:
        for listener in list(self._listeners):
            listener.on_trimmed(trimmed)

    def on_closed(self, reason: errors.ShadowTopicError) -> None:
        for listener in list(self._listeners):
            listener.on_closed(reason)


class CompactionFollower:
    """Keeps `view` on the current compaction pointer of `of` (see the module doc), with the
    one key follower (source/metadata/follow.py)."""

    def __init__(self, store: MetadataStore, storage: Storage, executor: Executor,
                 of: TopicName, raw: LedgerView, retry_delay: float = 0.5,
                 name: TopicName | None = None, ledgers: LedgerOpener | None = None):
        self.key = keys.compaction(of)
        self.view = CompactedView(raw, executor, storage, name, ledgers=ledgers)
        self.retry_delay = retry_delay
        self._follower = KeyFollower(store, self.key, self._apply, retry_delay)

    async def start(self, timeout: float = 10.0) -> CompactedView:
        """Read the pointer and follow it; the first read is retried while etcd is
        unavailable, for `timeout` seconds at most."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                await self._follower.start()
                return self.view
            except errors.MetadataUnavailable:
                if loop.time() + self.retry_delay >= deadline:
                    raise errors.MetadataUnavailable(
                        f"the compaction pointer {self.key} could not be read") from None
                await asyncio.sleep(self.retry_delay)

    async def refresh(self) -> None:
        """Read the pointer now and serve it if it is newer than the one held (its watch
        may be behind: a job that just finished is read here at once)."""
        await self._follower.refresh()

    async def _apply(self, value: bytes | None, revision: int) -> None:
        await self.view.update(mpb.CompactionPointer.FromString(value) if value else None)

    async def close(self) -> None:
        await self._follower.close()
        await self.view.close()
