"""TopicManager: topic metadata in etcd and the `Topic` objects this broker owns.

A topic is `TopicInfo` under /topics/<path>/info plus its ledger list. A partitioned topic is a
parent info (partitions = N) and N partition topics `<t>-partition-<i>`, each a topic of its
own; the parent holds the policies every partition follows. Topics load lazily: the first
produce or read of a topic takes its ownership and opens (recovering) its managed ledger into
a `Topic` (source/broker/topic.py). Asking about a topic (stats, last id) never loads it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from source.core import errors
from source.core.names import TopicName
from source.core.policies import Policies, validate_partitions, validate_properties
from source.cursors.snapshot import SnapshotCursorStore
from source.cursors.store import Fence
from source.ledger.entry_cache import DEFAULT_BYTES, EntryCache
from source.ledger.managed import ManagedLedger
from source.ledger.storage import Storage
from source.metadata import keys
from source.metadata.base import Compare, MetadataStore, MetadataUnavailable, Put
from source.pb.storage.v1 import metadata_pb2 as mpb
from source.broker.ownership import BrokerSession
from source.broker.rates import TopicCounters
from source.broker.topic import Topic, ledger_config
from source.subscriptions import TopicSubscriptions

log = logging.getLogger(__name__)
SOURCE, SHADOW = mpb.TopicKind.SOURCE, mpb.TopicKind.SHADOW


def _meta(call):
    """Turn metadata-store outages into the broker's typed error."""
    async def wrapper(*args, **kwargs):
        try:
            return await call(*args, **kwargs)
        except MetadataUnavailable as exc:
            raise errors.MetadataUnavailable(f"metadata store unavailable: {exc}") from None
    wrapper.__name__ = call.__name__
    wrapper.__doc__ = call.__doc__
    return wrapper


class TopicManager:
    def __init__(self, store: MetadataStore, storage: Storage, session: BrokerSession,
                 retention_interval: float = 60.0, cursor_flush_interval: float = 1.0,
                 entry_cache_bytes: int = DEFAULT_BYTES):
        self.store = store
        self.storage = storage
        self.session = session
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ledger-io")
        self.cursors = SnapshotCursorStore(store, storage, self.executor)
        self.cursor_flush_interval = cursor_flush_interval
        # one memory budget for the entries of every topic (source/ledger/entry_cache.py)
        self.entry_cache = EntryCache(entry_cache_bytes)
        self._loaded: dict[TopicName, Topic] = {}
        self._loading: dict[TopicName, asyncio.Future] = {}
        self._closing: dict[TopicName, asyncio.Task] = {}
        self._retention_interval = retention_interval
        self._retention_task: asyncio.Task | None = None

    async def start(self) -> None:
        self._retention_task = asyncio.create_task(self._retention_loop())

    # ---- metadata --------------------------------------------------------------------------

    @_meta
    async def info(self, topic: TopicName) -> mpb.TopicInfo:
        kv = await self.store.get(keys.topic_info(topic))
        if kv is None:
            raise errors.TopicNotFound(f"topic {topic} does not exist")
        info = mpb.TopicInfo.FromString(kv.value)
        if info.kind == mpb.TopicKind.TOPIC_KIND_UNSPECIFIED:
            info.kind = SOURCE  # written before TopicKind had a zero value of its own
        return info

    @_meta
    async def has_subscriptions(self, topic: TopicName) -> bool:
        snap = await self.store.get_prefix(keys.subscriptions_prefix(topic))
        return bool(snap.items)

    @_meta
    async def owner(self, topic: TopicName) -> mpb.Ownership | None:
        """Who owns `topic` now (from etcd), or None."""
        return await self.session.owner_of(topic)

    async def policies(self, topic: TopicName) -> Policies:
        """Effective policies (a partition follows its parent)."""
        info = await self.info(topic)
        if info.partition_of:
            info = await self.info(TopicName.parse(info.partition_of))
        return Policies.from_pb(info.policies).effective()

    @_meta
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

    @_meta
    async def delete(self, topic: TopicName, force: bool = False) -> None:
        info = await self.info(topic)
        if info.partition_of:
            raise errors.NotAllowed(f"{topic} is a partition of {info.partition_of}; "
                                    "delete the partitioned topic")
        kv = await self.store.get(keys.shadows(topic))
        if kv is not None:
            shadows = list(mpb.ShadowList.FromString(kv.value).shadows)
            if shadows:
                raise errors.HasShadowTopics(
                    f"{topic} has shadow topics: {', '.join(shadows)}; delete them first")
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
        # leaves orphan files, never metadata pointing at missing files)
        for t in names:
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

    @_meta
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

    @_meta
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

    async def _load_and_keep(self, topic: TopicName) -> Topic:
        t = await self._load(topic)
        self._loaded[topic] = t
        return t

    def _load_done(self, topic: TopicName, task: asyncio.Task) -> None:
        self._loading.pop(topic, None)
        if not task.cancelled():
            task.exception()  # retrieved here: every waiter gets it through its shield

    async def view(self, topic: TopicName) -> ManagedLedger:
        """The topic's `LedgerView` (what the read engine resolves a topic to)."""
        return (await self.topic(topic)).ledger

    @_meta
    async def _load(self, topic: TopicName) -> Topic:
        info = await self.info(topic)
        if info.partitions:
            raise errors.InvalidArgument(
                f"{topic} is partitioned ({info.partitions} partitions): use "
                f"{topic}-partition-<i>")
        if info.kind == SHADOW:
            raise errors.NotAllowed(f"topic is a read-only shadow of {info.source}")
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
                t.counters, self.cursor_flush_interval).load()
        except BaseException:
            await ml.close()
            await self.session.release(key, value)
            raise
        ml.on_sealed = lambda _info, name=topic: self._schedule_retention(name)
        ml.on_fenced = lambda _ml, owned=t: self._on_fenced(owned)
        log.info("loaded %s (epoch %d, %d ledgers)", topic, epoch, len(ml.ledgers()))
        return t

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
        t = self._loaded.pop(topic, None)
        if t is not None:
            self._start_close(t, reason)
        task = self._closing.get(topic)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    def _start_close(self, t: Topic, reason: errors.ShadowTopicError | None = None) -> None:
        async def close() -> None:
            try:
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
            del self._loaded[t.name]
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
        self.executor.shutdown(wait=True)
        log.info("entry cache: %s", self.entry_cache.describe())

    # ---- retention -------------------------------------------------------------------------

    def _schedule_retention(self, topic: TopicName) -> None:
        asyncio.get_running_loop().create_task(self._retain(topic))

    async def _retain(self, topic: TopicName) -> None:
        t = self._loaded.get(topic)
        if t is None:
            return
        try:
            p = await self.policies(topic)
            if p.retention_time_seconds >= 0 or p.retention_size_bytes >= 0:
                n, entries = await t.ledger.apply_retention(
                    p.retention_time_seconds, p.retention_size_bytes,
                    t.subscriptions.oldest_needed() if t.subscriptions is not None else None)
                if n:
                    log.info("%s: retention deleted %d ledgers (%d entries)", topic, n, entries)
        except Exception as exc:  # noqa: BLE001 - retention is retried by the loop
            log.warning("%s: retention skipped: %s", topic, exc)

    async def _retention_loop(self) -> None:
        """Once a `retention_interval`: roll quiet ledgers past their age, apply retention."""
        while True:
            await asyncio.sleep(self._retention_interval)
            for topic, t in list(self._loaded.items()):
                try:
                    await t.ledger.roll_if_aged()
                    await self._retain(topic)
                except Exception as exc:  # noqa: BLE001 - one topic never stops the loop
                    log.warning("%s: maintenance failed: %s", topic, exc)

