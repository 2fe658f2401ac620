"""TopicManager: topic metadata in etcd and the `Topic` objects this broker owns.

A topic is `TopicInfo` under /topics/<path>/info plus its ledger list. A partitioned topic is a
parent info (partitions = N) and N partition topics `<t>-partition-<i>`, each a topic of its
own; the parent holds the policies every partition follows. Topics load lazily: the first
produce or read of a topic takes its ownership and opens (recovering) its managed ledger into
a `Topic` (source/broker/topic.py). Asking about a topic (stats, last id) never loads it.

Shadow topics (kind SHADOW; created and deleted in source/broker/shadow_admin.py) never get
a ManagedLedger here: that would write a ledger list, and a shadow's ledgers are its
source's. A broker that serves shadows passes a `shadow_loader`, which turns a shadow into a
`Topic` over a view of its source's ledgers; without one (a source broker) loading a shadow
is refused. Writes (`writable`: produce, roll, truncate) are refused for shadows either way,
before anything loads.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Awaitable, Callable

from source.core import errors
from source.core.message_id import MessageId
from source.core.names import TopicName
from source.core.policies import Policies, validate_partitions, validate_properties
from source.cursors.snapshot import SnapshotCursorStore
from source.cursors.store import Fence
from source.ledger import retention
from source.ledger.entry_cache import DEFAULT_BYTES, EntryCache
from source.ledger.managed import ManagedLedger
from source.ledger.view import LedgerView
from source.ledger.storage import Storage
from source.metadata import keys
from source.metadata.base import (Compare, Delete, KeyValue, MetadataStore,
                                  MetadataUnavailable, Put)
from source.metadata.topic_info import SHADOW, SOURCE, effective_policies, read_info
from source.pb.storage.v1 import metadata_pb2 as mpb
from source.broker.ownership import BrokerSession
from source.broker.rates import TopicCounters
from source.broker.topic import Topic, ledger_config
from source.replication.shadows import Channels, TopicReplicators
from source.subscriptions import TopicSubscriptions

log = logging.getLogger(__name__)

#: (shadow topic, its TopicInfo) -> the owned `Topic` serving it. The Topic behaves as one
#: `_load` makes: its ledger is a LedgerView with `close()`, `fence(exc)`, `ownership` (the
#: ownership key and value to release) and `config`; the loader takes ownership itself.
ShadowLoader = Callable[[TopicName, mpb.TopicInfo], Awaitable[Topic]]


def metadata_errors(call):
    """Turn metadata-store outages into the broker's typed error."""
    async def wrapper(*args, **kwargs):
        try:
            return await call(*args, **kwargs)
        except MetadataUnavailable as exc:
            raise errors.MetadataUnavailable(f"metadata store unavailable: {exc}") from None
    wrapper.__name__ = call.__name__
    wrapper.__doc__ = call.__doc__
    return wrapper


def read_only(topic: TopicName | str, source: str) -> errors.NotAllowed:
    """What a write to a shadow (produce, roll, truncate) gets."""
    return errors.NotAllowed(f"topic {topic} is a read-only shadow of {source}")


def _refuse_shadows(topic: TopicName, kv: KeyValue | None) -> None:
    shadows = list(mpb.ShadowList.FromString(kv.value).shadows) if kv is not None else []
    if shadows:
        raise errors.HasShadowTopics(
            f"{topic} has shadow topics: {', '.join(shadows)}; delete them first")


class TopicManager:
    def __init__(self, store: MetadataStore, storage: Storage, session: BrokerSession,
                 retention_interval: float = 60.0, cursor_flush_interval: float = 1.0,
                 entry_cache_bytes: int = DEFAULT_BYTES,
                 shadow_loader: ShadowLoader | None = None):
        self.store = store
        self.storage = storage
        self.session = session
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ledger-io")
        self.cursors = SnapshotCursorStore(store, storage, self.executor)
        self.cursor_flush_interval = cursor_flush_interval
        # one memory budget for the entries of every topic (source/ledger/entry_cache.py)
        self.entry_cache = EntryCache(entry_cache_bytes)
        self._loaded: dict[TopicName, Topic] = {}
        self.shadow_loader = shadow_loader
        self.channels = Channels()  # to the brokers of this broker's sources' shadows
        self._shadow_sources: dict[TopicName, str] = {}  # loaded shadows -> their sources
        self._loading: dict[TopicName, asyncio.Future] = {}
        self._closing: dict[TopicName, asyncio.Task] = {}
        self._retention_interval = retention_interval
        #: topics whose compaction request is being filed (sealed, not yet in etcd):
        #: retention keeps their ledgers meanwhile
        self.compaction_filing: set[TopicName] = set()
        #: called after each retention pass of an owned source topic (compaction_admin.py)
        self.after_retention: Callable[[TopicName, Topic], Awaitable[None]] | None = None
        self._retention_task: asyncio.Task | None = None

    async def start(self) -> None:
        self._retention_task = asyncio.create_task(self._retention_loop())

    # ---- metadata --------------------------------------------------------------------------

    @metadata_errors
    async def info(self, topic: TopicName) -> mpb.TopicInfo:
        return await read_info(self.store, topic)

    @metadata_errors
    async def has_subscriptions(self, topic: TopicName) -> bool:
        snap = await self.store.get_prefix(keys.subscriptions_prefix(topic))
        return bool(snap.items)

    @metadata_errors
    async def owner(self, topic: TopicName) -> mpb.Ownership | None:
        """Who owns `topic` now (from etcd), or None."""
        return await self.session.owner_of(topic)

    @metadata_errors
    async def policies(self, topic: TopicName) -> Policies:
        """Effective policies (a partition follows its parent)."""
        return await effective_policies(self.store, topic)

    @metadata_errors
    async def create(self, topic: TopicName, partitions: int, policies: Policies,
                     properties: dict[str, str]) -> mpb.TopicInfo:
        topic.check_creatable()
        validate_partitions(partitions)
        validate_properties(properties)
        policies.validate()
        now = int(time.time() * 1000)
        info = mpb.TopicInfo(name=str(topic), kind=SOURCE, properties=properties,
                             policies=policies.to_pb(), partitions=partitions,
                             partition_index=-1, created_ms=now)
        names = [topic] + [topic.partition(i) for i in range(partitions)]
        compares = [Compare(keys.topic_info(t), "version", "==", 0) for t in names]
        ops = [Put(keys.topic_info(topic), info.SerializeToString())]
        if partitions == 0:
            ops.append(Put(keys.ledgers(topic), mpb.LedgerList().SerializeToString()))
        for i in range(partitions):
            part = topic.partition(i)
            pinfo = mpb.TopicInfo(name=str(part), kind=SOURCE, partition_of=str(topic),
                                  partition_index=i, created_ms=now)
            ops += [Put(keys.topic_info(part), pinfo.SerializeToString()),
                    Put(keys.ledgers(part), mpb.LedgerList().SerializeToString())]
        res = await self.store.txn(compares, ops)
        if not res.succeeded:
            raise errors.TopicAlreadyExists(f"topic {topic} already exists")
        return info

    @metadata_errors
    async def delete(self, topic: TopicName, force: bool = False) -> None:
        """Delete a topic (every partition of a partitioned one). A shadow is deleted as
        `ShadowAdmin.delete` does it; a source with shadows is refused (`HasShadowTopics`)."""
        info = await self.info(topic)
        if info.partition_of:
            raise errors.NotAllowed(f"{topic} is a partition of {info.partition_of}; "
                                    "delete the partitioned topic")
        if info.kind == SHADOW:
            from source.broker.shadow_admin import ShadowAdmin  # it imports this module
            return await ShadowAdmin(self).delete(topic, force)
        shadows_kv = await self.store.get(keys.shadows(topic))
        _refuse_shadows(topic, shadows_kv)
        names = [topic] + [topic.partition(i) for i in range(info.partitions)]
        connected = sum(t.subscriptions.connected() for t in map(self._loaded.get, names)
                        if t is not None and t.subscriptions is not None)
        if connected and not force:
            raise errors.NotAllowed(f"{topic} has {connected} connected consumers; "
                                    "use force to disconnect them and delete")
        lists = {t: await self.store.get(keys.ledgers(t)) for t in names}
        gone = errors.TopicNotFound(f"topic {topic} was deleted")
        for t in map(self._loaded.get, names):  # consumers stop; cursors are not saved again
            if t is not None and t.subscriptions is not None:
                await t.subscriptions.close(gone, flush=False)
        # metadata first: a loaded ledger's next list write then fails and fences it, and
        # nothing can load the topic again; then close, then files (a crash in between
        # leaves orphan files, never metadata pointing at missing files). The first delete
        # holds only while the shadow list is as read: a shadow created meanwhile stops it.
        res = await self.store.txn(
            [Compare(keys.shadows(topic), "mod_revision", "==",
                     shadows_kv.mod_revision if shadows_kv is not None else 0)],
            [Delete(keys.topic_prefix(topic), prefix=True)])
        if not res.succeeded:
            for t in names:  # their consumers were closed above: load afresh when asked
                await self.unload(t)
            _refuse_shadows(topic, await self.store.get(keys.shadows(topic)))
            raise errors.ServiceUnavailable(f"{topic} changed while it was deleted; try again")
        for t in names[1:]:
            await self.store.delete(keys.topic_prefix(t), prefix=True)
        for t in names:
            await self.unload(t, gone)
            await self.cursors.purge(t)
            kv = lists[t]
            for led in (mpb.LedgerList.FromString(kv.value).ledgers if kv else ()):
                if led.path:
                    self.storage.delete(led.path)
                if led.wal_path:
                    self.storage.delete_wal(led.wal_path)

    @metadata_errors
    async def list(self, namespace: str | None) -> list[mpb.TopicInfo]:
        snap = await self.store.get_prefix(keys.topics_prefix(namespace))
        out = []
        for kv in snap.items:
            if keys.topic_from_info_key(kv.key) is None:
                continue
            info = mpb.TopicInfo.FromString(kv.value)
            if not info.partition_of:
                out.append(info)
        return sorted(out, key=lambda i: i.name)

    @metadata_errors
    async def set_policies(self, topic: TopicName, update: Policies) -> Policies:
        update.validate()
        while True:
            kv = await self.store.get(keys.topic_info(topic))
            if kv is None:
                raise errors.TopicNotFound(f"topic {topic} does not exist")
            info = mpb.TopicInfo.FromString(kv.value)
            if info.partition_of:
                raise errors.NotAllowed(f"{topic} is a partition: set policies on "
                                        f"{info.partition_of}")
            merged = Policies.from_pb(info.policies).merged(update)
            info.policies.CopyFrom(merged.to_pb())
            if await self.store.cas(kv.key, info.SerializeToString(), kv.mod_revision):
                break
        names = [topic] + [topic.partition(i) for i in range(info.partitions)]
        for t in names:
            loaded = self._loaded.get(t)
            if loaded is not None:
                loaded.set_policies(merged.effective())
        return merged.effective()

    # ---- owned topics ----------------------------------------------------------------------

    async def topic(self, topic: TopicName) -> Topic:
        """The owned topic, taking ownership and recovering its ledger on first use."""
        t = self._loaded.get(topic)
        if t is not None:
            return t
        while topic in self._closing:  # a close of this topic is finishing: wait for it
            await asyncio.gather(self._closing[topic], return_exceptions=True)
            t = self._loaded.get(topic)
            if t is not None:
                return t
        task = self._loading.get(topic)
        if task is None:
            # the load runs in a task of its own: a caller that is cancelled while waiting
            # (its stream ended) neither stops it nor hands its cancellation to the others
            task = asyncio.get_running_loop().create_task(self._load_and_keep(topic))
            self._loading[topic] = task
            task.add_done_callback(lambda done, name=topic: self._load_done(name, done))
        return await asyncio.shield(task)

    async def writable(self, topic: TopicName) -> Topic:
        """The owned topic for a write (produce, roll, truncate): a shadow is refused
        (`NotAllowed`, read-only) before anything of it loads."""
        t = self._loaded.get(topic)
        if t is None:
            info = await self.info(topic)
            if info.kind == SHADOW:
                raise read_only(topic, info.source)
            t = await self.topic(topic)
        source = self._shadow_sources.get(topic)
        if source is not None:
            raise read_only(topic, source)
        return t

    async def _load_and_keep(self, topic: TopicName) -> Topic:
        t, source = await self._load(topic)
        self._loaded[topic] = t
        if source is not None:
            self._shadow_sources[topic] = source
        return t

    def _forget(self, topic: TopicName) -> Topic | None:
        self._shadow_sources.pop(topic, None)
        return self._loaded.pop(topic, None)

    def _load_done(self, topic: TopicName, task: asyncio.Task) -> None:
        self._loading.pop(topic, None)
        if not task.cancelled():
            task.exception()  # retrieved here: every waiter gets it through its shield

    async def view(self, topic: TopicName) -> ManagedLedger:
        """The topic's `LedgerView` (what the read engine resolves a topic to)."""
        return (await self.topic(topic)).ledger

    @metadata_errors
    async def compaction_pointer(self, topic: TopicName) -> mpb.CompactionPointer | None:
        """The compaction pointer `topic` is read by (a shadow's: its source's), or None."""
        info = await self.info(topic)
        of = TopicName.parse(info.source) if info.kind == SHADOW else topic
        kv = await self.store.get(keys.compaction(of))
        return mpb.CompactionPointer.FromString(kv.value) if kv is not None else None

    async def compacted_view(self, topic: TopicName) -> LedgerView:
        """The topic's view for `read_compacted` readers (source/ledger/compacted_view.py)."""
        t = await self.topic(topic)
        return await t.compacted_view(self.store, self.storage, self.executor)

    @metadata_errors
    async def _load(self, topic: TopicName) -> tuple[Topic, str | None]:
        """(the Topic, its source when it is a shadow)."""
        info = await self.info(topic)
        if info.partitions:
            raise errors.InvalidArgument(
                f"{topic} is partitioned ({info.partitions} partitions): use "
                f"{topic}-partition-<i>")
        if info.kind == SHADOW:
            if self.shadow_loader is None:
                raise errors.NotAllowed(
                    f"topic {topic} is a shadow of {info.source}: shadow topics are served "
                    "by a shadow broker, not by this source broker")
            return await self.shadow_loader(topic, info), info.source
        policies = await self.policies(topic)
        key, value, epoch = await self.session.acquire(topic)
        try:
            ml = await ManagedLedger.open(topic, self.store, self.storage, key, value, epoch,
                                          self.executor, ledger_config(policies),
                                          lease_ok=self.session.lease_ok,
                                          entry_cache=self.entry_cache)
        except BaseException:
            await self.session.release(key, value)
            raise
        t = Topic(topic, ml, policies)
        try:
            t.subscriptions = await TopicSubscriptions(
                topic, ml, self.store, self.cursors, Fence(key, value), lambda: t.policies,
                t.counters, self.cursor_flush_interval).load(
                    lambda: t.compacted_view(self.store, self.storage, self.executor))
        except BaseException:
            await t.close_compacted()
            await ml.close()
            await self.session.release(key, value)
            raise
        ml.on_sealed = lambda _info, name=topic: self._schedule_retention(name)
        ml.on_fenced = lambda _ml, owned=t: self._on_fenced(owned)
        t.replicators = TopicReplicators(
            topic, info, ml, self.store, self.session.cluster, lambda: (key, value, epoch),
            lambda: t.policies.replicator_auto_reset_backlog_entries or 0,
            self.channels).start()
        log.info("loaded %s (epoch %d, %d ledgers)", topic, epoch, len(ml.ledgers()))
        return t, None

    def loaded(self, topic: TopicName) -> Topic | None:
        return self._loaded.get(topic)

    def counters_for(self, topic: TopicName) -> TopicCounters:
        """The delivery counters of an owned topic (a throwaway set once it is unloaded)."""
        t = self._loaded.get(topic)
        return t.counters if t is not None else TopicCounters()

    async def unload(self, topic: TopicName, reason: errors.ShadowTopicError | None = None
                     ) -> None:
        """Close this broker's ledger of `topic` and give up ownership (its consumers hear
        `reason`). A load of the same topic meanwhile waits for the close to finish."""
        t = self._forget(topic)
        if t is not None:
            self._start_close(t, reason)
        task = self._closing.get(topic)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    def _start_close(self, t: Topic, reason: errors.ShadowTopicError | None = None) -> None:
        async def close() -> None:
            try:
                if t.replicators is not None:
                    await t.replicators.close()
                await t.close_compacted()
                if t.subscriptions is not None:
                    await t.subscriptions.close(reason)
                await t.ledger.close()
                await self.session.release(*t.ledger.ownership)
            finally:
                self._closing.pop(t.name, None)
        self._closing[t.name] = asyncio.get_running_loop().create_task(close())

    def _on_fenced(self, t: Topic) -> None:
        """A fenced topic (lease lost, ownership taken) is dropped; the next request for it
        loads it afresh (taking ownership again if it can)."""
        if self._loaded.get(t.name) is t:
            self._forget(t.name)
            self._start_close(t)

    def fence_all(self) -> None:
        """The broker lease is gone: nothing may be acknowledged any more."""
        for name, t in list(self._loaded.items()):
            t.ledger.fence(errors.Fenced(f"{name}: broker lease lost"))

    async def close(self) -> None:
        for topic in list(self._loaded):
            await self.unload(topic)
        if self._retention_task:
            self._retention_task.cancel()
        await self.channels.close()
        self.executor.shutdown(wait=True)
        log.info("entry cache: %s", self.entry_cache.describe())

    # ---- retention -------------------------------------------------------------------------

    def _schedule_retention(self, topic: TopicName) -> None:  # source topics only
        asyncio.get_running_loop().create_task(self._retain(topic))

    async def _retain(self, topic: TopicName) -> None:
        t = self._loaded.get(topic)
        if t is None:
            return
        try:
            p = await self.policies(topic)
            if p.retention_time_seconds >= 0 or p.retention_size_bytes >= 0:
                keep = t.subscriptions.oldest_needed() if t.subscriptions is not None else None
                if p.retention_keeps_shadow_backlog:  # a failed read skips this pass
                    keep = retention.earliest(keep, await self._shadow_needs(topic))
                keep = retention.earliest(keep, await self._compaction_needs(topic, p))
                n, entries = await t.ledger.apply_retention(
                    p.retention_time_seconds, p.retention_size_bytes, keep)
                if n:
                    log.info("%s: retention deleted %d ledgers (%d entries)", topic, n, entries)
        except Exception as exc:  # noqa: BLE001 - retention is retried by the loop
            log.warning("%s: retention skipped: %s", topic, exc)
        if self.after_retention is not None:  # the compaction threshold trigger
            await self.after_retention(topic, t)

    async def _compaction_needs(self, topic: TopicName, p: Policies) -> MessageId | None:
        """What compaction has not read yet (as Pulsar's compaction cursor holds it): the
        messages after the compaction horizon, of a topic that is compacted (it has a
        pointer) or is about to be (a request waits, or a threshold policy); else None."""
        kv = await self.store.get(keys.compaction(topic))
        if kv is None:
            if p.compaction_threshold_bytes or topic in self.compaction_filing:
                return MessageId(0, 0)
            requested = await self.store.get(
                keys.compaction_request(self.session.cluster, topic))
            return MessageId(0, 0) if requested else None
        h = mpb.CompactionPointer.FromString(kv.value).horizon
        return MessageId(h.ledger_id, h.entry_id + 1)

    async def _shadow_needs(self, topic: TopicName) -> MessageId | None:
        """The earliest position the durable subscriptions of `topic`'s shadows still need
        (source/ledger/retention.py): every need under `keys.shadow_needs_prefix` in one
        read, counted for the shadows the source lists now (of a partition: partition i of
        each shadow of its parent). A deleted shadow's need is ignored and removed."""
        snap = await self.store.get_prefix(keys.shadow_needs_prefix(topic))
        if not snap.items:
            return None
        parent = topic.partitioned_parent
        kv = await self.store.get(keys.shadows(parent or topic))
        listed = mpb.ShadowList.FromString(kv.value).shadows if kv is not None else ()
        current = {TopicName.parse(s).partition(topic.partition_index) if parent is not None
                   else TopicName.parse(s) for s in listed}
        needs = [(keys.shadow_from_needs_key(topic, item.key), item) for item in snap.items]
        for shadow, item in needs:
            if shadow is not None and shadow not in current:
                try:  # left by a deleted shadow: removed, unless the shadow exists again
                    await self.store.txn(
                        [Compare(item.key, "mod_revision", "==", item.mod_revision),
                         Compare(keys.topic_info(shadow), "version", "==", 0)],
                        [Delete(item.key)])
                except MetadataUnavailable as exc:
                    log.info("%s: need of deleted shadow %s not removed: %s", topic, shadow,
                             exc)
        return retention.shadow_keep_from(((s, item.value) for s, item in needs), current)

    async def _retention_loop(self) -> None:
        """Once a `retention_interval`: roll quiet ledgers past their age, apply retention."""
        while True:
            await asyncio.sleep(self._retention_interval)
            for topic, t in list(self._loaded.items()):
                if topic in self._shadow_sources:
                    continue  # a shadow's ledgers are its source's
                try:
                    await t.ledger.roll_if_aged()
                    await self._retain(topic)
                except Exception as exc:  # noqa: BLE001 - one topic never stops the loop
                    log.warning("%s: maintenance failed: %s", topic, exc)
