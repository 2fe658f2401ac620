"""TopicManager: topic metadata in etcd and the managed ledgers this broker has loaded.

A topic is `TopicInfo` under /topics/<path>/info plus its ledger list. A partitioned topic is a
parent info (partitions = N) and N partition topics `<t>-partition-<i>`, each a topic of its
own; the parent holds the policies every partition follows. Ledgers load lazily: the first
produce or read of a topic takes its ownership and opens (recovering) its managed ledger.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from source.core import errors
from source.core.names import TopicName
from source.core.policies import Policies, validate_partitions, validate_properties
from source.ledger.managed import LedgerConfig, ManagedLedger
from source.ledger.storage import Storage
from source.metadata import keys
from source.metadata.base import Compare, MetadataStore, MetadataUnavailable, Put
from source.pb.storage.v1 import metadata_pb2 as mpb
from source.broker.ownership import BrokerSession
from source.broker.rates import Publisher, TopicCounters

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
                 retention_interval: float = 60.0):
        self.store = store
        self.storage = storage
        self.session = session
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ledger-io")
        self._loaded: dict[TopicName, ManagedLedger] = {}
        self._loading: dict[TopicName, asyncio.Future] = {}
        self._closing: dict[TopicName, asyncio.Task] = {}
        self.counters: dict[TopicName, TopicCounters] = {}
        self.effective: dict[TopicName, Policies] = {}  # of loaded topics (produce limits)
        self.publishers: dict[TopicName, set[Publisher]] = {}
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
        return mpb.TopicInfo.FromString(kv.value)

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
        lists = {t: await self.store.get(keys.ledgers(t)) for t in names}
        # metadata first: a loaded ledger's next list write then fails and fences it, and
        # nothing can load the topic again; then close, then files (a crash in between
        # leaves orphan files, never metadata pointing at missing files)
        for t in names:
            await self.store.delete(keys.topic_prefix(t), prefix=True)
        for t in names:
            await self.unload(t)
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
            ml = self._loaded.get(t)
            if ml is not None:
                ml.config = _ledger_config(merged.effective())
                self.effective[t] = merged.effective()
        return merged.effective()

    # ---- loaded ledgers --------------------------------------------------------------------

    async def ledger(self, topic: TopicName) -> ManagedLedger:
        """The topic's managed ledger, taking ownership and recovering it on first use."""
        ml = self._loaded.get(topic)
        if ml is not None:
            return ml
        while topic in self._closing:  # a close of this topic is finishing: wait for it
            await asyncio.gather(self._closing[topic], return_exceptions=True)
            ml = self._loaded.get(topic)
            if ml is not None:
                return ml
        fut = self._loading.get(topic)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._loading[topic] = fut
            try:
                ml = await self._load(topic)
                self._loaded[topic] = ml
                fut.set_result(ml)
            except BaseException as exc:
                fut.set_exception(exc)
                fut.exception()  # mark retrieved: the caller below re-raises it
                raise
            finally:
                self._loading.pop(topic, None)
            return ml
        return await asyncio.shield(fut)

    @_meta
    async def _load(self, topic: TopicName) -> ManagedLedger:
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
                                          self.executor, _ledger_config(policies),
                                          lease_ok=self.session.lease_ok)
        except BaseException:
            await self.session.release(key, value)
            raise
        ml.on_sealed = lambda _info, t=topic: self._schedule_retention(t)
        ml.on_fenced = self._on_fenced
        self.effective[topic] = policies
        self.counters.setdefault(topic, TopicCounters())
        log.info("loaded %s (epoch %d, %d ledgers)", topic, epoch, len(ml.ledgers()))
        return ml

    def attach_producer(self, topic: TopicName, pub: Publisher) -> None:
        """Register a producer on a loaded topic, within the `max_producers` policy."""
        pubs = self.publishers.setdefault(topic, set())
        limit = self.effective[topic].max_producers if topic in self.effective else 0
        if limit and len(pubs) >= limit:
            raise errors.TooManyProducers(
                f"{topic} already has {len(pubs)} producers (max_producers {limit})")
        pubs.add(pub)

    def detach_producer(self, topic: TopicName, pub: Publisher) -> None:
        self.publishers.get(topic, set()).discard(pub)

    def loaded(self, topic: TopicName) -> ManagedLedger | None:
        return self._loaded.get(topic)

    def counters_for(self, topic: TopicName) -> TopicCounters:
        c = self.counters.get(topic)
        if c is None:
            c = self.counters[topic] = TopicCounters()
        return c

    async def unload(self, topic: TopicName) -> None:
        """Close this broker's ledger of `topic` and give up ownership. A load of the same
        topic meanwhile waits for the close to finish (`ledger()`)."""
        ml = self._loaded.pop(topic, None)
        if ml is not None:
            self._start_close(topic, ml)
        task = self._closing.get(topic)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    def _start_close(self, topic: TopicName, ml: ManagedLedger) -> None:
        async def close() -> None:
            try:
                await ml.close()
                await self.session.release(*ml.ownership)
            finally:
                self.counters.pop(topic, None)
                self.publishers.pop(topic, None)
                self.effective.pop(topic, None)
                self._closing.pop(topic, None)
        self._closing[topic] = asyncio.get_running_loop().create_task(close())

    def _on_fenced(self, ml: ManagedLedger) -> None:
        """A fenced ledger (lease lost, ownership taken) is dropped; the next request for
        the topic loads it afresh (taking ownership again if it can)."""
        if self._loaded.get(ml.topic) is ml:
            del self._loaded[ml.topic]
            self._start_close(ml.topic, ml)

    def fence_all(self) -> None:
        """The broker lease is gone: nothing may be acknowledged any more."""
        for topic, ml in list(self._loaded.items()):
            ml.fence(errors.Fenced(f"{topic}: broker lease lost"))

    async def close(self) -> None:
        for topic in list(self._loaded):
            await self.unload(topic)
        if self._retention_task:
            self._retention_task.cancel()
        self.executor.shutdown(wait=True)

    # ---- retention -------------------------------------------------------------------------

    def _schedule_retention(self, topic: TopicName) -> None:
        asyncio.get_running_loop().create_task(self._retain(topic))

    async def _retain(self, topic: TopicName) -> None:
        ml = self._loaded.get(topic)
        if ml is None:
            return
        try:
            p = await self.policies(topic)
            if p.retention_time_seconds >= 0 or p.retention_size_bytes >= 0:
                n, entries = await ml.apply_retention(p.retention_time_seconds,
                                                      p.retention_size_bytes)
                if n:
                    log.info("%s: retention deleted %d ledgers (%d entries)", topic, n, entries)
        except Exception as exc:  # noqa: BLE001 - retention is retried by the loop
            log.warning("%s: retention skipped: %s", topic, exc)

    async def _retention_loop(self) -> None:
        """Once a `retention_interval`: roll quiet ledgers past their age, apply retention."""
        while True:
            await asyncio.sleep(self._retention_interval)
            for topic, ml in list(self._loaded.items()):
                try:
                    await ml.roll_if_aged()
                    await self._retain(topic)
                except Exception as exc:  # noqa: BLE001 - one topic never stops the loop
                    log.warning("%s: maintenance failed: %s", topic, exc)


def _ledger_config(p: Policies) -> LedgerConfig:
    return LedgerConfig(max_entries=p.ledger_max_entries, max_bytes=p.ledger_max_bytes,
                        max_age_s=p.ledger_max_age_seconds)
