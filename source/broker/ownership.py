"""Broker registration and topic ownership through one etcd lease plus a fencing epoch.

The broker holds one lease (kept alive every ttl/4) under which it registers itself and
every topic it owns. It trusts that lease only until `sent + 0.8 * ttl` of the last
successful keepalive (its own monotonic clock, not etcd's word): past that it fences every
topic itself, so a broker cut off from etcd stops acknowledging before etcd can hand its
topics to another broker. Taking a topic = creating its ownership key under that lease, only if
absent, with a fresh epoch from the topic's epoch counter. Every ledger-list write compares
the ownership value, so when the lease lapses (a paused or partitioned broker) and another
broker takes the topic, the old owner's writes fail and it fences itself (etcd locks alone
are not safe; Jepsen etcd 3.4.3).

The registration (`BrokerInfo`) also carries the broker's load: `load()` (set by the broker:
topics loaded, their subscriptions) is read after each keepalive, and the registration is
rewritten under the same lease when it changed, at most every `load_interval` seconds
(`shadowtopic brokers list` shows it; placement reads it).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence, Sized
from typing import Protocol

from shadowtopic.broker.held import HeldTopics
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import (
    Compare,
    Delete,
    LeaseNotFound,
    MetadataStore,
    MetadataUnavailable,
    Put,
)
from shadowtopic.metadata.placement import RecentPicks, pick_broker, pick_source
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

log = logging.getLogger(__name__)


class _Subscriptions(Protocol):
    @property
    def subs(self) -> Sized: ...


class LoadedTopic(Protocol):
    """What `topics_load` reads of a loaded topic (source/broker/topic.py's `Topic`)."""

    @property
    def subscriptions(self) -> _Subscriptions | None: ...


def topics_load(topics: Sequence[LoadedTopic]) -> tuple[int, int]:
    """(topics, subscriptions) of a broker's loaded topics: its load in `BrokerInfo`."""
    subscriptions = 0
    for t in topics:
        subs = t.subscriptions  # None until its durable subscriptions loaded
        if subs is not None:
            subscriptions += len(subs.subs)
    return len(topics), subscriptions


class BrokerSession:
    """This broker's lease, its registration and its owned topics."""

    def __init__(self, store: MetadataStore, cluster: str, broker_id: str, url: str,
                 roles: list[str], ttl: int = 10):
        self.store = store
        self.cluster = cluster
        self.broker_id = broker_id
        self.url = url
        self.roles = roles
        self.ttl = ttl
        self.lease = 0
        self.valid_until = 0.0          # monotonic deadline of trust in the lease
        self.on_lost: Callable[[], None] | None = None
        self._task: asyncio.Task | None = None
        self.healthy = asyncio.Event()
        self.metrics_url = ""           # registered with the broker (its HTTP endpoint)
        self.wal_objects = False        # its WAL is on object storage (registered too)
        #: topics this broker placed (lookups, shadow replicators) not owned yet
        self.picks = RecentPicks()
        #: topics it gave up lately (load shedding): not taken back for a while
        self.held = HeldTopics()
        #: () -> (topics loaded, their subscriptions); None: registered without a load
        self.load: Callable[[], tuple[int, int]] | None = None
        self.load_interval = 5.0
        self._info: mpb.BrokerInfo | None = None
        self._load_written: tuple[int, int] | None = None
        self._load_at = 0.0             # monotonic time of the last write of the load

    async def start(self) -> None:
        """Grant the lease and register; retries until etcd answers (no crash loop)."""
        self._task = asyncio.create_task(self._keepalive(), name="broker-lease")

    def lease_ok(self) -> bool:
        return self.lease != 0 and time.monotonic() < self.valid_until

    def _lost(self, why: str) -> None:
        log.warning("broker lease %s: every owned topic is fenced", why)
        self.lease = 0
        self.valid_until = 0.0
        self.healthy.clear()
        if self.on_lost:
            self.on_lost()

    async def _register(self) -> None:
        sent = time.monotonic()
        self.lease = await self.store.grant_lease(self.ttl)
        self.valid_until = sent + self.ttl * 0.8
        info = mpb.BrokerInfo(broker_id=self.broker_id, url=self.url, roles=self.roles,
                              started_ms=int(time.time() * 1000), metrics_url=self.metrics_url,
                              wal_objects=self.wal_objects)
        load = self._measure()
        if load is not None:
            info.topics, info.subscriptions = load
            info.load_ms = int(time.time() * 1000)
        try:
            await self.store.put(keys.broker(self.cluster, self.broker_id),
                                 info.SerializeToString(), lease=self.lease)
        except BaseException:
            self.lease = 0  # not registered: grant and register again (this lease expires)
            raise
        self._info = info
        self._load_written, self._load_at = load, time.monotonic()

    def _measure(self) -> tuple[int, int] | None:
        if self.load is None:
            return None
        try:
            return self.load()
        except Exception:  # noqa: BLE001 - a load that cannot be measured stays unwritten
            log.exception("measuring the broker's load failed")
            return None

    async def _write_load(self) -> None:
        """Rewrite the registration when the load changed (at most every load_interval)."""
        if (self.load is None or self._info is None
                or time.monotonic() - self._load_at < self.load_interval):
            return
        now = self._measure()
        if now is None or now == self._load_written:
            return
        info = mpb.BrokerInfo()
        info.CopyFrom(self._info)
        info.topics, info.subscriptions = now
        info.load_ms = int(time.time() * 1000)
        await self.store.put(keys.broker(self.cluster, self.broker_id),
                             info.SerializeToString(), lease=self.lease)
        self._info = info
        self._load_written, self._load_at = now, time.monotonic()

    async def _keepalive(self) -> None:
        while True:
            try:
                if not self.lease:
                    await self._register()
                    self.healthy.set()
                    log.info("broker %s registered (lease %x)", self.broker_id, self.lease)
                else:
                    sent = time.monotonic()
                    await self.store.refresh_lease(self.lease)
                    self.valid_until = sent + self.ttl * 0.8
                    self.healthy.set()
                    await self._write_load()
            except LeaseNotFound:
                self._lost("lost")
                continue
            except MetadataUnavailable:
                self.healthy.clear()
                if self.lease and not self.lease_ok():
                    self._lost("unconfirmed past its deadline")
            except Exception:  # noqa: BLE001 - keep the keepalive alive whatever happens
                log.exception("lease keepalive failed")
                self.healthy.clear()
            await asyncio.sleep(min(self.ttl / 4, max(0.05, self.valid_until - time.monotonic()))
                                if self.lease else self.ttl / 4)

    async def wait_ready(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self.healthy.wait(), timeout)

    async def stop(self, revoke: bool = True) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if revoke and self.lease:
            try:
                await self.store.revoke_lease(self.lease)
            except Exception:  # noqa: BLE001 - best effort on shutdown
                pass
            self.lease = 0

    async def acquire(self, topic: TopicName) -> tuple[str, bytes, int]:
        """Own `topic`: (ownership key, ownership value, epoch). Raises TopicNotOwned naming
        the owner when another broker holds it."""
        if not self.healthy.is_set() or not self.lease:
            raise errors.ServiceUnavailable("broker is not connected to the metadata store")
        key = keys.ownership(self.cluster, topic)
        epoch = await self.store.next_id(keys.epoch_counter(topic))
        value = mpb.Ownership(broker_id=self.broker_id, broker_url=self.url, epoch=epoch,
                              acquired_ms=int(time.time() * 1000)).SerializeToString()
        res = await self.store.txn([Compare(key, "version", "==", 0)],
                                   [Put(key, value, lease=self.lease)])
        if res.succeeded:
            return key, value, epoch
        kv = await self.store.get(key)
        if kv is not None:
            owner = mpb.Ownership.FromString(kv.value)
            if owner.broker_id == self.broker_id:
                # ours: reloaded after close, or held by a dead incarnation of this broker
                # (same id = same data dir; that process is gone). Take it with a new epoch.
                res = await self.store.txn([Compare(key, "mod_revision", "==", kv.mod_revision)],
                                           [Put(key, value, lease=self.lease)])
                if res.succeeded:
                    return key, value, epoch
            raise errors.TopicNotOwned(
                f"{topic} is owned by broker {owner.broker_id} at {owner.broker_url}")
        raise errors.TopicNotOwned(f"{topic}: ownership changed while acquiring; retry")

    async def release(self, key: str, value: bytes) -> None:
        try:
            await self.store.txn([Compare(key, "value", "==", value)], [Delete(key)])
        except MetadataUnavailable:
            pass

    async def owner_of(self, topic: TopicName) -> mpb.Ownership | None:
        kv = await self.store.get(keys.ownership(self.cluster, topic))
        return mpb.Ownership.FromString(kv.value) if kv else None

    async def serving(self, topic: TopicName, role: str) -> mpb.BrokerInfo | None:
        """Where `topic` goes when nobody owns it: a shadow to the least loaded shadow
        broker (`pick_broker`), a source topic to this broker unless (both with the WAL on
        object storage) another source broker serves clearly fewer topics (`pick_source`),
        another topic to this broker when it
        has `role`, else to a registered broker with it; None when there is none."""
        if role in self.roles and role != "shadow":
            elsewhere = (await pick_source(self.store, self.cluster, topic, self.broker_id,
                                           leaving=self.held.refuses(topic))
                         if role == "source" and self.wal_objects else None)
            return elsewhere or mpb.BrokerInfo(broker_id=self.broker_id, url=self.url,
                                               roles=self.roles)
        picked = await pick_broker(self.store, self.cluster, role, topic, self.picks)
        if picked is None and role in self.roles:  # not registered yet: serve it here
            return mpb.BrokerInfo(broker_id=self.broker_id, url=self.url, roles=self.roles)
        return picked
