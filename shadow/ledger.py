"""ShadowLedger: a shadow topic's read-only `LedgerView` over its source's ledgers.

A shadow owns no ledger (PIP-180): it reads the source's ledgers where they are, with the
source's ids, and writes nothing, anywhere (no ledger list, no file, no etcd key).

Following. The source's ledger list (`keys.ledgers(source)`) is followed by a
`KeyFollower` (source/metadata/follow.py): listed, then watched from the listed revision, applied
only when its mod revision is higher than the one held, listed again after a compacted
revision or an outage. When the source's list drops ledgers (retention, truncate), the
shadow drops them too and tells its listeners `on_trimmed`, as the source's
`ManagedLedger` does, so cursors move past them and count what they skipped (C8).

Reads go through a `LedgerListReader` over the storage root the source writes to: sealed
ledgers from their Parquet files, an unsealed ledger's confirmed range through a tail
reader (shadow/tail.py): the source's WAL when this broker's WAL root holds it (a POSIX
root shared with the source), else, from the first WAL not found where its list record
says (and still unsealed in the list read again), `Storage.ReadEntries` of the source's
owner, whose url the replication receiver gives (`source_url`).

What is confirmed. A sealed ledger holds the entries its list record says. An unsealed
ledger's count comes from two places:
- `on_replicated(last)`: the replicator receiver passes the last id the source confirmed
  (acknowledged after its fsync); ids only move forward, an older or resent id changes
  nothing (R5);
- the WAL itself, once the ledger takes no more entries: when a later ledger holds entries
  (replicated, or sealed in the list), the source's writer of this one has finished (a new
  ledger's writer starts after the old one's last fsync), so every frame of its WAL is
  durable and is what its sealed file will hold; the shadow counts them in a background
  task (the WAL's frame headers, or the entries the owner still returns).
The view ends at the *frontier*: the first unsealed ledger whose count may still grow or
is not known yet. Ledgers after it stay hidden (even sealed ones) until it is settled, so
a reader at the end of what it knows of a ledger is never moved past entries it has not
learned of yet (`valid_position` skips only ends that are final). `next_position` is the
frontier's next id and never moves back; listeners hear `on_entries` once per advance.

A read that finds a WAL or a Parquet file gone (the source sealed or deleted that ledger
and the watch has not told us yet) reads the list again and retries once.

Seams: the shadow's compacted view (compaction/view.py) wraps this view and
follows `keys.compaction(source)` (its `ledgers_of` says whose pointer: K10);
replicated payloads (sent while this shadow reads its tail from the source's owner: it
then acks `want_raw`) are read from the broker's `TailCache` first (shadow/tail.py).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import TypeVar

import pyarrow as pa
from google.protobuf.message import DecodeError

from shadowtopic.core import errors
from shadowtopic.core.errors import ShadowTopicError
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.entry_cache import EntryCache
from shadowtopic.ledger.ledger_reader import LedgerListReader
from shadowtopic.ledger.storage import Storage
from shadowtopic.ledger.view import LedgerRange, ReadEntry, Trimmed, ViewListener
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import MetadataStore, MetadataUnavailable
from shadowtopic.metadata.follow import KeyFollower
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.security.dial import PLAINTEXT, Dial
from shadowtopic.shadow.tail import FileTail, RemoteTail, TailReader, wal_entries

log = logging.getLogger(__name__)
T = TypeVar("T")
SEALED, OPEN = mpb.LedgerState.SEALED, mpb.LedgerState.OPEN
MAX_RETRY_S = 5.0

__all__ = ["ShadowLedger", "wal_entries"]


class ShadowLedger:
    def __init__(self, topic: TopicName, source: TopicName, store: MetadataStore,
                 storage: Storage, executor: Executor, entry_cache: EntryCache | None = None,
                 retry_delay: float = 0.5, dial: Dial = PLAINTEXT):
        self.topic = topic      # the shadow
        self.source = source    # whose ledgers it reads
        self.store = store
        self.storage = storage
        self._executor = executor
        self._retry_delay = retry_delay
        #: the source owner's url (shadow/replication.py sets it from the source's ownership)
        self._source_url: str | None = None
        #: set when something this shadow waits for arrives (the source's owner url): the
        #: count of an unsealed ledger that failed for want of it goes on at once
        self._nudge = asyncio.Event()
        self._remote = False                         # the tail comes from the owner
        self._list = mpb.LedgerList()                # the source's list, as followed
        self._visible: list[mpb.LedgerInfo] = []     # its ledgers up to the frontier
        self._frontier: int | None = None            # first unsealed ledger not settled
        self._hi = 0                  # newest ledger known to hold entries
        self._sealed_hi = 0           # ... among the list's sealed ledgers
        self._replicated: MessageId | None = None    # newest id on_replicated was given
        self._counts: dict[int, int] = {}   # unsealed ledgers: entries confirmed (replicated)
        self._final: dict[int, int] = {}    # unsealed ledgers taking no more: entries (WAL)
        self._to_scan: list[mpb.LedgerInfo] = []
        self._next = MessageId(0, 0)                 # never moves back
        self._newest: MessageId | None = None        # newest readable id listeners heard of
        self.reader = LedgerListReader(storage, executor, lambda: self._visible,
                                       confirmed=self._confirmed, cache=entry_cache,
                                       unsealed=_Unsealed(self))
        self.file_tail = FileTail(self.reader, storage, executor)
        self.remote_tail = RemoteTail(source, lambda: self.source_url, dial)
        self.entry_cache = self.reader.cache  # the read engine charges encodings here too
        self._listeners: list[ViewListener] = []
        self._closed: errors.ShadowTopicError | None = None
        self._follower = KeyFollower(store, keys.ledgers(source), self._on_list, retry_delay)
        self._scan_task: asyncio.Task | None = None

    @property
    def ledgers_of(self) -> TopicName:
        """The topic whose ledgers this view reads (`LedgerView`): the source."""
        return self.source

    # ---- lifecycle -------------------------------------------------------------------------

    @classmethod
    async def open(cls, *args, **kwargs) -> ShadowLedger:
        sl = cls(*args, **kwargs)
        await sl.start()
        return sl

    async def start(self) -> None:
        """List the source's ledgers and follow them. Ids given to `on_replicated` before
        (or while) it starts are kept and apply once the list is there."""
        try:
            await self._follower.start()
        except MetadataUnavailable as exc:
            raise errors.MetadataUnavailable(
                f"{self.topic}: cannot read the ledgers of {self.source}: {exc}") from None
        except DecodeError as exc:
            raise errors.DataLoss(
                f"{self.topic}: the ledger list of {self.source} does not parse: {exc}") from None

    async def close(self, reason: errors.ShadowTopicError | None = None) -> None:
        """Stop following; listeners hear `on_closed` (the topic may be loaded again)."""
        if self._closed is not None:
            return
        self._closed = reason or errors.TopicNotOwned(f"{self.topic} is closing on this broker")
        await self._follower.close()
        task, self._scan_task = self._scan_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.reader.forget_wals()
        await self.remote_tail.close()
        for listener in list(self._listeners):
            listener.on_closed(self._closed)

    @property
    def source_url(self) -> str | None:
        """The source's owner, where the unsealed tail is read when no WAL is shared (given
        by the replication receiver, shadow/replication.py)."""
        return self._source_url

    @source_url.setter
    def source_url(self, url: str | None) -> None:
        if url != self._source_url:
            self._source_url = url
            self._nudge.set()

    def fence(self, reason: errors.ShadowTopicError) -> None:
        """This broker lost the topic (its lease): stop serving it."""
        if self._closed is None:
            asyncio.get_running_loop().create_task(self.close(reason))

    # ---- what the replicator tells ---------------------------------------------------------

    def on_replicated(self, last: MessageId) -> None:
        """The source confirmed every entry up to `last` (inclusive). Older or repeated
        ids change nothing; listeners hear of new entries once per advance."""
        if self._closed is not None:
            return
        last = MessageId(last.ledger_id, last.entry_id)  # no partition inside a topic
        if self._replicated is not None and last <= self._replicated:
            return
        self._replicated = last
        lid, n = last.ledger_id, last.entry_id + 1
        if self._counts.get(lid, 0) < n:
            self._counts[lid] = n
        if lid == self._frontier and self._hi <= lid:
            # the common case: more of the ledger at the frontier (no ledger to settle)
            self._hi = lid
            self._advance_to(MessageId(lid, n))
            self._heard(MessageId(lid, n - 1))
        else:
            self._changed()

    async def lists_ledger(self, ledger_id: int) -> bool:
        """Whether the source's ledger list holds `ledger_id` (the list is read again when
        the one followed here does not: its watch may not have told of a new ledger yet)."""
        ledgers = self._list.ledgers
        if ledgers and ledgers[-1].ledger_id == ledger_id:
            return True  # the newest ledger: what nearly every batch names
        if any(info.ledger_id == ledger_id for info in ledgers):
            return True
        await self._follower.refresh()
        return any(info.ledger_id == ledger_id for info in self._list.ledgers)

    @property
    def replicated(self) -> MessageId | None:
        """The newest id the replicator confirmed (None: none yet)."""
        return self._replicated

    # ---- following the source's ledger list ------------------------------------------------

    def _on_list(self, value: bytes | None, revision: int) -> None:
        new = mpb.LedgerList.FromString(value) if value is not None else mpb.LedgerList()
        for info in new.ledgers:
            if info.state == mpb.LedgerState.LEDGER_STATE_UNSPECIFIED:
                info.state = OPEN  # written before LedgerState had a zero value of its own
        ids = {info.ledger_id for info in new.ledgers}
        was = {info.ledger_id: info for info in self._list.ledgers}
        gone = [info for info in self._list.ledgers if info.ledger_id not in ids]
        trimmed = []
        for info in gone:
            n = info.entries if info.state == SEALED else self._known(info.ledger_id)
            if n:
                trimmed.append(LedgerRange(info.ledger_id, n, info.state == SEALED,
                                           info.size_bytes))
            self.reader.forget(info.ledger_id)
            self._counts.pop(info.ledger_id, None)
            self._final.pop(info.ledger_id, None)
        for info in new.ledgers:
            old = was.get(info.ledger_id)
            if info.state == SEALED and old is not None and old.state != SEALED:
                known = self._final.pop(info.ledger_id, None)
                if known is not None and known != info.entries:
                    log.warning("%s: ledger %d sealed with %d entries, its WAL held %d",
                                self.topic, info.ledger_id, info.entries, known)
                self._counts.pop(info.ledger_id, None)
                self.reader.forget_wal(info.ledger_id)
        if new.ledgers:  # forget what was counted of ledgers older than the whole list
            first = new.ledgers[0].ledger_id
            for d in (self._counts, self._final):
                for lid in [lid for lid in d if lid < first and lid not in ids]:
                    del d[lid]
        self._list = new
        self._sealed_hi = max((i.ledger_id for i in new.ledgers
                               if i.state == SEALED and i.entries), default=0)
        self._changed(Trimmed(tuple(trimmed)) if trimmed else None)

    def _known(self, lid: int) -> int:
        """Entries of an unsealed ledger this shadow knows of (settled or replicated)."""
        return self._final.get(lid, self._counts.get(lid, 0))

    # ---- the frontier ----------------------------------------------------------------------

    def _confirmed(self, info: mpb.LedgerInfo) -> int:
        """Readable entries of an unsealed ledger (LedgerListReader's `confirmed`)."""
        return self._confirmed_id(info.ledger_id)

    def _confirmed_id(self, lid: int) -> int:
        n = self._final.get(lid)
        if n is not None:
            return n
        return self._counts.get(lid, 0) if lid == self._frontier else 0

    def _recompute(self) -> None:
        rep = self._replicated.ledger_id if self._replicated is not None else 0
        self._hi = hi = max(rep, self._sealed_hi)
        visible: list[mpb.LedgerInfo] = []
        frontier = None
        to_scan = []
        for info in self._list.ledgers:
            visible.append(info)
            if info.state == SEALED or info.ledger_id in self._final:
                continue
            frontier = info.ledger_id
            if info.ledger_id < hi:
                to_scan.append(info)  # a later ledger holds entries: this one is complete
            break
        self._visible, self._frontier, self._to_scan = visible, frontier, to_scan
        if frontier is not None:
            self._advance_to(MessageId(frontier, self._confirmed_id(frontier)))
        elif visible:
            last = visible[-1]
            self._advance_to(MessageId(last.ledger_id, self.reader.count(last)))

    def _advance_to(self, position: MessageId) -> None:
        if position > self._next:
            self._next = position

    def _heard(self, last: MessageId | None) -> None:
        """Tell listeners of new entries when `last` (the newest readable id) is newer
        than any they heard of: once per advance, never for a move without entries."""
        if last is not None and (self._newest is None or last > self._newest):
            self._newest = last
            for listener in list(self._listeners):
                listener.on_entries()

    def _changed(self, trimmed: Trimmed | None = None) -> None:
        """The list, a replicated id or a settled count changed: recompute the view, tell
        listeners (trimmed ledgers first, then new entries), settle what needs it."""
        if self._closed is not None:
            return
        self._recompute()
        if trimmed is not None:
            for listener in list(self._listeners):
                listener.on_trimmed(trimmed)
        self._heard(self.reader.last_confirmed())
        if self._to_scan and self._scan_task is None:
            self._scan_task = asyncio.get_running_loop().create_task(
                self._settle(), name=f"shadow-settle {self.topic}")

    async def _settle(self) -> None:
        """Count the entries of unsealed ledgers that take no more (their WAL is final)."""
        delay = self._retry_delay
        try:
            while self._closed is None and self._to_scan:
                info = self._to_scan[0]
                lid = info.ledger_id
                self._nudge.clear()  # from here on, what arrives cuts the wait below
                try:
                    n = await self.on_tail(info, self._count_entries(info))
                except ShadowTopicError as exc:
                    # sealed and removed (or dropped) meanwhile: the list will say so; or
                    # the source's owner is away or moving: it is asked again
                    log.info("%s: entries of ledger %d: %s; reading the list again",
                             self.topic, lid, exc)
                    if not await self._follower.refresh():
                        try:  # the owner's url arriving ends the wait (a new shadow's
                            # first batch brings it: the count must not wait a backoff)
                            await asyncio.wait_for(self._nudge.wait(), delay)
                        except TimeoutError:
                            pass
                        delay = min(delay * 2, MAX_RETRY_S)
                    self._changed()
                    continue
                delay = self._retry_delay
                live = next((i for i in self._list.ledgers if i.ledger_id == lid), None)
                if self._closed is None and live is not None and live.state != SEALED \
                        and lid not in self._final:
                    known = self._counts.get(lid, 0)
                    if n < known:
                        log.warning("%s: WAL of ledger %d holds %d entries, %d were "
                                    "confirmed", self.topic, lid, n, known)
                    self._final[lid] = max(n, known)
                self._changed()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the next change starts it again
            log.exception("%s: counting unsealed ledgers failed", self.topic)
        finally:
            if asyncio.current_task() is self._scan_task:
                self._scan_task = None

    # ---- the tail: the source's WAL here, or its owner (shadow/tail.py) --------------------

    def _count_entries(self, info: mpb.LedgerInfo) -> Callable[[TailReader], Awaitable[int]]:
        """What counts the entries of `info` (unsealed, taking no more) on a tail, from the
        count known when it runs."""
        return lambda tail: tail.entries(info, self._counts.get(info.ledger_id, 0))

    async def on_tail(self, info: mpb.LedgerInfo,
                      call: Callable[[TailReader], Awaitable[T]]) -> T:
        """`call` on the WAL here; when the ledger's WAL is not under this broker's WAL root
        while the source's list (read again) still holds the ledger unsealed, on the source's
        owner from now on. (The unsealed reads of the ledger reader come here: `_Unsealed`.)"""
        if not self._remote:
            try:
                return await call(self.file_tail)
            except errors.DataLoss:
                if self.file_tail.reachable(info) or not await self._unsealed_here(info):
                    raise
                self._remote = True
                log.info("%s: the WAL of ledger %d of %s is not under %s: reading unsealed "
                         "entries from the source's owner", self.topic, info.ledger_id,
                         self.source, self.storage.wal_base)
        return await call(self.remote_tail)

    async def _unsealed_here(self, info: mpb.LedgerInfo) -> bool:
        """Whether the source's list, read again, holds the ledger and not sealed."""
        await self._follower.refresh()
        live = next((i for i in self._list.ledgers if i.ledger_id == info.ledger_id), None)
        return live is not None and live.state != SEALED

    # ---- LedgerView ------------------------------------------------------------------------

    @property
    def closed(self) -> errors.ShadowTopicError | None:
        return self._closed

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
        return self._next

    def valid_position(self, position: MessageId) -> MessageId:
        return self.reader.valid_position(position, self._next)

    def entries_between(self, start: MessageId, end: MessageId) -> int:
        return self.reader.entries_between(start, end)

    async def position_at_time(self, publish_ms: int) -> MessageId:
        found = await self._retrying(lambda: self.reader.position_at_time(publish_ms))
        return found or self._next

    async def read(self, start: MessageId, max_entries: int, max_bytes: int) -> list[ReadEntry]:
        return await self._retrying(lambda: self.reader.read(start, max_entries, max_bytes))

    async def read_columns(self, start: MessageId, max_entries: int) -> pa.Table | None:
        return await self._retrying(lambda: self.reader.read_columns(start, max_entries))

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call`; when a file it needs is gone (the source sealed or deleted the ledger
        and the watch has not said so yet), read the list again and call once more."""
        revision = self._follower.revision
        try:
            return await call()
        except errors.DataLoss:
            await self._follower.refresh()
            if self._follower.revision == revision:
                raise  # the list did not move: the file is really missing
        return await call()

    # ---- stats -----------------------------------------------------------------------------

    @property
    def remote(self) -> bool:
        """Whether unsealed entries come from the source's owner (not a shared WAL)."""
        return self._remote

    def ledgers(self) -> list[mpb.LedgerInfo]:
        """The source's ledgers as this shadow follows them (the source's ids: the data is
        shared), unsealed ones with the entries readable here filled in."""
        out = []
        for info in self._list.ledgers:
            if info.state != SEALED:
                info = mpb.LedgerInfo(ledger_id=info.ledger_id, state=info.state,
                                      wal_path=info.wal_path, created_ms=info.created_ms,
                                      entries=self._confirmed_id(info.ledger_id))
            out.append(info)
        return out

    def source_ledger_ids(self) -> list[int]:
        return [info.ledger_id for info in self._list.ledgers]

    @property
    def entries_deleted(self) -> int:
        """Entries the source's retention / truncation removed."""
        return self._list.entries_deleted

    @property
    def list_revision(self) -> int:
        """Mod revision of the source's ledger list this shadow holds."""
        return self._follower.revision

    def number_of_entries(self) -> int:
        return sum(r.entries for r in self.reader.ranges())

    def storage_size(self) -> int:
        return sum(r.size_bytes for r in self.reader.ranges())


class _Unsealed:
    """The reader's `UnsealedReads` (source/ledger/ledger_reader.py): the shadow's tail."""

    def __init__(self, ledger: ShadowLedger):
        self._ledger = ledger

    async def read(self, info: mpb.LedgerInfo, first: int, count: int,
                   max_bytes: int) -> list[ReadEntry]:
        return await self._ledger.on_tail(
            info, lambda tail: tail.read(info, first, count, max_bytes))

    async def publish_times(self, info: mpb.LedgerInfo, count: int) -> list[int]:
        return await self._ledger.on_tail(info, lambda tail: tail.publish_times(info, count))
