"""ManagedLedger: a source topic's ledgers, written by the one broker that owns the topic.

Its parts are in modules of their own, each documenting how its part works; they share the
state `ManagedLedger.__init__` sets up (the ledger list, the open ledger, the unsealed
ledgers' entries):

- source/ledger/writer.py: the write path: appends, the group-commit writer of each open
  ledger, ledger rolls (`LedgerConfig` says when).
- source/ledger/sealing.py: sealing ledgers to Parquet, and recovering the open ledgers a
  previous owner left when the topic is opened.
- source/ledger/ledger_list.py: changes of the ledger list in etcd (one CAS each, so a
  broker that lost the topic is fenced), retention and truncation.
- source/ledger/dedup.py: idempotent producing, the producers' stored sequence ids
  (`dedup`), checked by the writer, recovered with the ledgers, snapshotted at each seal.

This module ties them together:

- lifecycle: `open` loads the topic (recovering what a previous owner left); `close` stops
  taking appends, finishes every queued write and seal; `fence` refuses appends once the
  topic's ownership is lost. On a full or read-only disk the topic still opens and serves
  reads; writes fail with `StorageFull` / `StorageReadOnly` until the disk takes them
  (source/ledger/writer.py, source/ledger/sealing.py).
- it is the source's `LedgerView` (source/ledger/view.py): reads by MessageId go through a
  `LedgerListReader` over this ledger list and the in-memory entries of unsealed ledgers;
  listeners hear of new entries (once per group commit), trimmed ledgers and closing.
- memory: unsealed ledgers' entries count against the broker's `EntryCache`, which drops
  the oldest past its budget (re-read from the WAL: source/ledger/entry_cache.py).
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from concurrent.futures import Executor
from typing import Callable

from shadowtopic.core import errors
from shadowtopic.core.message_id import EARLIEST, MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.dedup import DedupMap
from shadowtopic.ledger.entry_cache import EntryCache, TailEntries
from shadowtopic.ledger.ledger_list import OPEN, LedgerListUpdates
from shadowtopic.ledger.ledger_reader import LedgerListReader
from shadowtopic.ledger.sealing import Sealing
from shadowtopic.ledger.storage import Storage
from shadowtopic.ledger.view import LedgerRange, ReadEntry, ViewListener
from shadowtopic.ledger.writer import LedgerConfig, OpenLedger, WritePath
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import MetadataStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

__all__ = ["LedgerConfig", "ManagedLedger"]

log = logging.getLogger(__name__)


class ManagedLedger(WritePath, Sealing, LedgerListUpdates):
    """A source topic's ledgers on the broker that owns the topic: its write path
    (`WritePath`), sealing and recovery (`Sealing`) and ledger-list changes
    (`LedgerListUpdates`) over the state set up here, and its `LedgerView`.

    Open it with `ManagedLedger.open` (which recovers what a previous owner left).
    """

    def __init__(self, topic: TopicName, store: MetadataStore, storage: Storage,
                 ownership_key: str, ownership_value: bytes, epoch: int,
                 executor: Executor, config: LedgerConfig | None = None,
                 lease_ok: Callable[[], bool] = lambda: True,
                 entry_cache: EntryCache | None = None):
        self.topic = topic
        self.ledgers_of = topic  # a source reads its own ledgers
        self._lease_ok = lease_ok  # False once this broker's lease may have expired
        self.store = store
        self.storage = storage
        self.epoch = epoch
        self.config = config or LedgerConfig()
        self._own_key = ownership_key
        self._own_value = ownership_value
        self._executor = executor

        # the ledger list, as last read or written (source/ledger/ledger_list.py)
        self._list_key = keys.ledgers(topic)
        self._list = mpb.LedgerList()
        self._list_rev = 0
        self._list_lock = asyncio.Lock()

        # reads: the unsealed ledgers' entries, the reader over the list, the listeners
        self.entry_cache = entry_cache if entry_cache is not None else EntryCache()
        self._mem: dict[int, TailEntries] = {}       # unsealed ledgers, by id
        self.reader = LedgerListReader(storage, executor, lambda: self._list.ledgers,
                                       self._mem.get, cache=self.entry_cache)
        self._listeners: list[ViewListener] = []

        # the write path (source/ledger/writer.py)
        self._current: OpenLedger | None = None
        self._draining: list[OpenLedger] = []  # rolled ledgers whose writer has not ended
        self._roll_task: asyncio.Task | None = None
        self._blocked: deque[tuple] = deque()  # appends waiting for a ledger switch, in order
        self._seal_tasks: set[asyncio.Task] = set()
        self._fenced: errors.ShadowTopicError | None = None
        # idempotent producing (source/ledger/dedup.py): producers' stored sequence ids, and
        # each rolled ledger's snapshot of them until its seal writes it
        self.dedup = DedupMap(self.config.dedup_idle_s)
        self._dedup_snaps: dict[int, mpb.DedupSnapshot] = {}
        # ledgers a full or read-only disk kept from sealing: id -> (wal_rel, frames, count)
        self._unsealed: dict[int, tuple] = {}
        self._retry_lock = asyncio.Lock()

        self.on_sealed: Callable[[mpb.LedgerInfo], None] | None = None
        self.on_fenced: Callable[["ManagedLedger"], None] | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    @classmethod
    async def open(cls, *args, **kwargs) -> "ManagedLedger":
        """Construct (same arguments as the constructor) and load: recover and seal every
        ledger a previous owner left OPEN, then start a new ledger."""
        ml = cls(*args, **kwargs)
        await ml._load()
        return ml

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
        if cur is None:  # no open ledger (loaded on an unwritable disk): after the last one
            last = self._list.ledgers[-1] if self._list.ledgers else None
            return MessageId(last.ledger_id, self.reader.count(last)) if last else EARLIEST
        return MessageId(cur.ledger_id, len(cur.entries))

    def valid_position(self, position: MessageId) -> MessageId:
        return self.reader.valid_position(position, self.next_position())

    def entries_between(self, start: MessageId, end: MessageId) -> int:
        return self.reader.entries_between(start, end)

    async def position_at_time(self, publish_ms: int) -> MessageId:
        return await self.reader.position_at_time(publish_ms) or self.next_position()

    async def read(self, start: MessageId, max_entries: int, max_bytes: int) -> list[ReadEntry]:
        return await self.reader.read(start, max_entries, max_bytes)

    def _notify(self) -> None:
        """New entries are readable (called by the writer once per group commit)."""
        for listener in list(self._listeners):
            listener.on_entries()

    def _notify_closed(self) -> None:
        for listener in list(self._listeners):
            listener.on_closed(self._fenced)

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
        """(ledger id, entries, bytes) of the ledger taking appends ((0, 0, 0): none, the
        topic loaded on a disk that took no writes)."""
        cur = self._current
        if cur is None:
            return 0, 0, 0
        return cur.ledger_id, len(cur.entries), cur.entries.size
