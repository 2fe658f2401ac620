"""ManagedLedger: a source topic's ledgers, written by the one broker that owns the topic.

It is composed of objects that each own their state, in modules of their own (each
documents how its part works); `ManagedLedger.__init__` wires them together, passing each
what it needs:

- `OwnedLedgerList` (source/ledger/ledger_list.py): the ledger list with its etcd revision;
  every change is one CAS (so a broker that lost the topic is fenced); retention and
  truncation take ledgers off it.
- `Tails` (source/ledger/tails.py): the unsealed ledgers' in-memory entries, by ledger id.
- `GroupCommitWriter` (source/ledger/writer.py): appends, the group-commit writer of each
  open ledger, ledger rolls (`LedgerConfig` says when). Hands rolled ledgers to the sealer.
- `Sealer` (source/ledger/sealing.py): sealing ledgers to Parquet, keeping those it cannot
  seal yet open (`retry_seals`), and recovering the open ledgers a previous owner left.
- the `WalSink` (source/ledger/wal_sink.py) the writer makes each group durable through:
  the local WAL with fsync, or the broker's `ObjectWal` (source/ledger/object_wal.py) when
  the WAL is on object storage; the sealer restores and releases such ledgers through
  `TopicWalObjects` (source/ledger/wal_restore.py).
- `DedupMap` (source/ledger/dedup.py): idempotent producing, the producers' stored
  sequence ids (`dedup`), checked by the writer, recovered by the sealer with the ledgers,
  snapshotted for each seal.

The parts see the ledger's fence through the `Fencing` protocol (source/ledger/ledger_list.py),
which `ManagedLedger` implements. This module holds the rest:

- lifecycle: `open` loads the topic (recovering what a previous owner left); `close` stops
  taking appends, finishes every queued write and seal; `fence` refuses appends once the
  topic's ownership is lost. On a full or read-only disk the topic still opens and serves
  reads; writes fail with `StorageFull` / `StorageReadOnly` until the disk takes them
  (source/ledger/writer.py, source/ledger/sealing.py).
- it is the source's `LedgerView` (source/ledger/view.py): reads by MessageId go through a
  `LedgerListReader` over the ledger list and the `Tails`; listeners hear of new entries
  (once per group commit), trimmed ledgers and closing.
- memory: unsealed ledgers' entries count against the broker's `EntryCache`, which drops
  the oldest past its budget (re-read from the WAL: source/ledger/entry_cache.py).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import pyarrow as pa

from shadowtopic.core import errors
from shadowtopic.core.message_id import EARLIEST, MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.dedup import DedupMap
from shadowtopic.ledger.entry_cache import EntryCache
from shadowtopic.ledger.ledger_list import OPEN, OwnedLedgerList
from shadowtopic.ledger.ledger_reader import LedgerListReader
from shadowtopic.ledger.object_wal import ObjectWal
from shadowtopic.ledger.open_ledger import LedgerConfig
from shadowtopic.ledger.seal_ahead import SealAheadMode
from shadowtopic.ledger.sealing import UNWRITABLE, Sealer
from shadowtopic.ledger.storage import Storage
from shadowtopic.ledger.tails import Tails
from shadowtopic.ledger.view import LedgerRange, ReadEntry, Trimmed, ViewListener
from shadowtopic.ledger.wal_restore import ObjectOpener, TopicWalObjects, opener
from shadowtopic.ledger.wal_sink import CommitPipeline, LocalSink, ObjectSink, WalSink
from shadowtopic.ledger.writer import GroupCommitWriter
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import MetadataStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

__all__ = ["LedgerConfig", "ManagedLedger"]

log = logging.getLogger(__name__)


class ManagedLedger:
    """A source topic's ledgers on the broker that owns the topic: its ledger list
    (`ledger_list`), unsealed entries (`tails`), writer, sealer and `dedup` map wired
    together, and its `LedgerView`.

    Open it with `ManagedLedger.open` (which recovers what a previous owner left).
    """

    def __init__(self, topic: TopicName, store: MetadataStore, storage: Storage,
                 ownership_key: str, ownership_value: bytes, epoch: int,
                 executor: Executor, config: LedgerConfig | None = None,
                 lease_ok: Callable[[], bool] = lambda: True,
                 entry_cache: EntryCache | None = None,
                 wal_objects: ObjectWal | None = None,
                 open_object: ObjectOpener | None = None,
                 seal_ahead: SealAheadMode = "after_roll",
                 ahead_executor: Executor | None = None):
        self.topic = topic
        self.ledgers_of = topic  # a source reads its own ledgers
        self.store = store
        self.storage = storage
        self.epoch = epoch
        self._own_key = ownership_key
        self._own_value = ownership_value
        self._fenced: errors.ShadowTopicError | None = None
        self._listeners: list[ViewListener] = []
        self.on_sealed: Callable[[mpb.LedgerInfo], None] | None = None
        self.on_fenced: Callable[[ManagedLedger], None] | None = None
        config = config or LedgerConfig()

        self.entry_cache = entry_cache if entry_cache is not None else EntryCache()
        self.ledger_list = OwnedLedgerList(topic, keys.ledgers(topic), store,
                                           (ownership_key, ownership_value), epoch, self)
        self.tails = Tails(self.entry_cache)
        self.reader = LedgerListReader(storage, executor,
                                       lambda: self.ledger_list.current.ledgers,
                                       self.tails.get, cache=self.entry_cache)
        self.dedup = DedupMap(config.dedup_idle_s)
        objects = TopicWalObjects(store, topic, open_object or opener(storage.s3), executor,
                                  wal_objects)
        self._sealer = Sealer(topic, storage, executor, self.ledger_list, self.tails,
                              self.reader, self.dedup, self, self._sealed, objects)
        sink: WalSink = LocalSink(executor)
        pipeline: CommitPipeline | None = None
        if wal_objects is not None:
            pipeline = ObjectSink(wal_objects, topic, (ownership_key, ownership_value),
                                  executor)
        self._writer = GroupCommitWriter(topic, store, storage, executor, config,
                                         self.ledger_list, self.tails, self.dedup,
                                         self._sealer, self, lease_ok, self._notify, sink,
                                         pipeline, seal_ahead, ahead_executor)

    @property
    def config(self) -> LedgerConfig:
        """When ledgers roll; may be replaced (policies), the next append goes by it."""
        return self._writer.config

    @config.setter
    def config(self, config: LedgerConfig) -> None:
        self._writer.config = config

    # ---- lifecycle -------------------------------------------------------------------------

    @classmethod
    async def open(cls, *args: Any, **kwargs: Any) -> ManagedLedger:
        """Construct (same arguments as the constructor) and load: recover and seal every
        ledger a previous owner left OPEN, then start a new ledger."""
        ml = cls(*args, **kwargs)
        await ml._load()
        return ml

    async def _load(self) -> None:
        """Read the ledger list, recover and seal every OPEN ledger, sweep orphan files, then
        start this owner's first ledger."""
        await self.ledger_list.load()
        # idempotent producing: the producers' sequences as of the newest seal, then those
        # of every ledger still OPEN, replayed from its WAL (source/ledger/dedup.py)
        self.dedup.load(self.ledger_list.current.dedup)
        await self._sealer.recover_open()
        await self._sealer.sweep()
        try:
            await self._writer.start()
        except UNWRITABLE as exc:  # served read-only: the first append tries again
            log.warning("%s: opened without an open ledger (reads only until the disk takes "
                        "writes): %s", self.topic, exc)

    async def close(self) -> None:
        """Stop taking appends, finish every queued write and seal; the WAL stays for the
        next owner (who seals the open ledger)."""
        if self._fenced is None:
            self._fenced = errors.TopicNotOwned(f"{self.topic} is closing on this broker")
        reason = self._fenced
        await self._writer.close(reason)
        self.tails.drop_all()  # what is left is read from the WALs, if at all
        self.reader.forget_wals()
        self._notify_closed(reason)

    @property
    def fenced(self) -> errors.ShadowTopicError | None:
        """Why this ledger takes no more appends (closed, or ownership lost), or None."""
        return self._fenced

    def fence(self, err: errors.ShadowTopicError) -> None:
        """Refuse further appends (ownership lost); the owner of this object drops it."""
        if self._fenced is None:
            self._fenced = err
            log.warning("%s fenced: %s", self.topic, err)
            self._notify_closed(err)
            if self.on_fenced is not None:
                self.on_fenced(self)

    @property
    def ownership(self) -> tuple[str, bytes]:
        """(ownership key, value) this ledger writes under."""
        return self._own_key, self._own_value

    # ---- writes (source/ledger/writer.py, source/ledger/sealing.py) ------------------------

    async def append(self, raws: list[bytes], request: bytes, size: int) -> tuple[int, int]:
        """Append a batch durably; return (ledger_id, first_entry_id) after the fsync.

        `request` is the ProduceRequest the raws came in (written to the WAL as it is).
        Order is kept across ledger switches.
        """
        lid, first, _dup = await self._writer.append_batch(raws, request, size)
        return lid, first

    async def append_batch(self, raws: list[bytes], request: bytes, size: int,
                           sequence: tuple[str, int] | None = None) -> tuple[int, int, bool]:
        """`append`, for a batch that may be sequenced: `sequence` = (producer name, sequence
        id of its first message). Returns (ledger_id, first_entry_id, duplicate): a
        duplicate was not stored again, the ids are its original's ((0, 0): unknown)."""
        return await self._writer.append_batch(raws, request, size, sequence)

    async def roll(self) -> mpb.LedgerInfo | None:
        """Seal the current ledger now (RollLedger); returns the sealed ledger's info, or the
        newest sealed ledger when the current one is empty."""
        return await self._writer.roll()

    async def roll_if_aged(self) -> bool:
        """Roll a quiet topic's open ledger once it is older than `max_age_s`."""
        return await self._writer.roll_if_aged()

    async def retry_seals(self) -> None:
        """Seal, in order, the ledgers a full or read-only disk (or a failing object store or
        etcd) kept open; raises what the first that still cannot be sealed raises."""
        await self._sealer.retry_seals()

    def _sealed(self, info: mpb.LedgerInfo) -> None:
        if self.on_sealed is not None:
            self.on_sealed(info)

    # ---- retention and truncation (source/ledger/ledger_list.py) ---------------------------

    async def apply_retention(self, time_s: int, size_bytes: int,
                              keep_from: MessageId | None = None) -> tuple[int, int]:
        """Delete the sealed ledgers retention picks (source/ledger/retention.py): the oldest
        beyond the time / size limits (-1 = no limit), never from the ledger of `keep_from`
        (the first entry a durable subscription has not acknowledged) on.

        Returns (ledgers deleted, entries deleted).
        """
        return self._trimmed(await self.ledger_list.remove_retained(
            time_s, size_bytes, keep_from, self._size))

    async def truncate(self) -> tuple[int, int]:
        """Seal the current ledger and delete every sealed ledger (cursors move to the end)."""
        await self.roll()
        return self._trimmed(await self.ledger_list.remove_sealed())

    def _trimmed(self, victims: list[mpb.LedgerInfo]) -> tuple[int, int]:
        """Ledgers left the list: delete their files, then listeners hear of the trim."""
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
        """A ledger's size: live for an unsealed ledger, else as the list records it."""
        mem = self.tails.get(info.ledger_id)
        return mem.size if mem is not None else info.size_bytes

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
        pos = self._writer.next_position()
        if pos is not None:
            return pos
        # no open ledger (loaded on an unwritable disk): after the last one
        ledgers = self.ledger_list.current.ledgers
        last = ledgers[-1] if ledgers else None
        return MessageId(last.ledger_id, self.reader.count(last)) if last else EARLIEST

    def valid_position(self, position: MessageId) -> MessageId:
        return self.reader.valid_position(position, self.next_position())

    def entries_between(self, start: MessageId, end: MessageId) -> int:
        return self.reader.entries_between(start, end)

    async def position_at_time(self, publish_ms: int) -> MessageId:
        return await self.reader.position_at_time(publish_ms) or self.next_position()

    async def read(self, start: MessageId, max_entries: int, max_bytes: int) -> list[ReadEntry]:
        return await self.reader.read(start, max_entries, max_bytes)

    async def read_columns(self, start: MessageId, max_entries: int) -> pa.Table | None:
        return await self.reader.read_columns(start, max_entries)

    def _notify(self) -> None:
        """New entries are readable (called by the writer once per group commit)."""
        for listener in list(self._listeners):
            listener.on_entries()

    def _notify_closed(self, reason: errors.ShadowTopicError) -> None:
        """The ledger takes no more appends (`reason`): listeners hear of it."""
        for listener in list(self._listeners):
            listener.on_closed(reason)

    # ---- stats -----------------------------------------------------------------------------

    def ledgers(self) -> list[mpb.LedgerInfo]:
        """The ledger list, with the live entry counts of unsealed ledgers filled in."""
        out = []
        for info in self.ledger_list.current.ledgers:
            mem = self.tails.get(info.ledger_id)
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
        return self.ledger_list.current.entries_deleted

    @property
    def current_ledger(self) -> tuple[int, int, int]:
        """(ledger id, entries, bytes) of the ledger taking appends ((0, 0, 0): none, the
        topic loaded on a disk that took no writes)."""
        return self._writer.current_ledger
