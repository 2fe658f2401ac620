"""Placement: which registered broker serves a topic nobody owns yet.

Brokers register under `keys.brokers_prefix(cluster)` with their roles (source, shadow, ...)
and their load (`BrokerInfo.topics`, `.subscriptions`, rewritten every few seconds). A topic
(each partition of a partitioned topic separately) goes to the least loaded live broker with
the role: fewest topics served, then fewest subscriptions, and among brokers equal on both
the one the topic's name ranks first (rendezvous hashing: a hash of broker id and topic, so
the partitions of a shadow placed in the same instant, before any of them is owned, spread
over the tied brokers instead of all going to the smallest id). "Topics
served" is the larger of the broker's reported count and the ownership records it holds now
(`keys.ownership_prefix(cluster)`, leased by their owner), so a topic placed a moment ago
counts before the broker's next load report.

Picks made at once (the replicators of a source's new shadows, or of a partitioned
shadow's partitions, all start together) cannot see each other's ownership records yet:
a process that places many topics passes one `RecentPicks`, which serializes its picks and
counts each one as owned by the picked broker until that broker's ownership record is there
(or for PENDING_S at most), so they spread exactly; a topic picked again before it is owned
gets the same broker while that broker lives.

A source topic nobody owns stays on the source broker a lookup reached (it takes the
topic when the client comes), unless both keep their WAL on object storage (`--wal`: any
of them can take over a topic's open ledgers) and another such live source broker serves
at least two topics fewer (`pick_source`): then the lookup names that one, so source
topics spread over source brokers as they are first used and when their owner died,
without a redirect for every small difference.

The assignment is sticky: the ownership record the serving broker holds says who serves a
topic, and callers (Lookup, the source's shadow replicators) ask here only when no live
broker owns it - when it is first placed, or when its owner's lease expired (failover).
Every asker computes the answer from etcd alone, so they agree without talking to each
other.
"""
from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter

from shadowtopic.core.names import TopicName
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import KeyValue, MetadataStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

PENDING_S = 5.0  # a pick counts as owned this long at most (its broker takes it sooner)


def rank(broker_id: str, topic: TopicName) -> bytes:
    """The rendezvous rank of `broker_id` for `topic` (the smallest wins a tie)."""
    return hashlib.blake2b(f"{broker_id}\n{topic}".encode(), digest_size=8).digest()


def least_loaded(brokers: list[mpb.BrokerInfo], topic: TopicName,
                 owned: Counter[str] | None = None) -> mpb.BrokerInfo | None:
    """The broker with the fewest topics (reported, or owned now: the larger), then the
    fewest subscriptions, then the best rendezvous rank for `topic`; None for no brokers."""
    owned = owned or Counter()
    return min(brokers, default=None,
               key=lambda b: (max(b.topics, owned[b.broker_id]), b.subscriptions,
                              rank(b.broker_id, topic), b.broker_id))


class RecentPicks:
    """This process's picks whose ownership records are not there yet (see the module
    docstring): topic -> (broker id, when), for PENDING_S at most."""

    def __init__(self, pending_s: float = PENDING_S):
        self.pending_s = pending_s
        self.lock = asyncio.Lock()
        self._picks: dict[TopicName, tuple[str, float]] = {}

    def __len__(self) -> int:
        return len(self._picks)

    def pending(self, owned_keys: set[str], cluster: str) -> dict[TopicName, str]:
        """The picks not owned yet and not expired (the others are forgotten)."""
        now = time.monotonic()
        for topic, (_, at) in list(self._picks.items()):
            if now - at > self.pending_s or keys.ownership(cluster, topic) in owned_keys:
                del self._picks[topic]
        return {topic: broker_id for topic, (broker_id, _) in self._picks.items()}

    def add(self, topic: TopicName, broker_id: str) -> None:
        """A pick; picking the same broker again keeps the first pick's time (asking again
        and again must not keep a pick that never became ownership alive)."""
        held = self._picks.get(topic)
        if held is None or held[0] != broker_id:
            self._picks[topic] = (broker_id, time.monotonic())


async def pick_broker(store: MetadataStore, cluster: str, role: str, topic: TopicName,
                      recent: RecentPicks | None = None) -> mpb.BrokerInfo | None:
    """The live registered broker with `role` that should serve `topic` now that nobody owns
    it (see the module docstring); None when no broker has the role. With `recent`, this
    process's other picks not owned yet count too, and this one is added to them."""
    if recent is None:
        return await _pick(store, cluster, role, topic, None)
    async with recent.lock:
        picked = await _pick(store, cluster, role, topic, recent)
        if picked is not None:
            recent.add(topic, picked.broker_id)
        return picked


def registered(items: list[KeyValue], role: str) -> list[mpb.BrokerInfo]:
    """The registrations (of `keys.brokers_prefix`) of brokers with `role`; a record that
    does not parse counts for nobody."""
    out = []
    for kv in items:
        try:
            info = mpb.BrokerInfo.FromString(kv.value)
        except Exception:  # noqa: BLE001 - a damaged record counts for nobody
            continue
        if role in info.roles:
            out.append(info)
    return out


async def pick_source(store: MetadataStore, cluster: str, topic: TopicName, me: str,
                      margin: int = 2, leaving: bool = False) -> mpb.BrokerInfo | None:
    """Where a source topic nobody owns goes when broker `me` was asked: the least loaded
    live source broker with the WAL on object storage (as `pick_broker`; any such broker can
    take over the topic's open ledgers) when it serves at least `margin` topics fewer than
    `me`; None (serve it here: no redirect) otherwise, and when `me` is not registered.
    `leaving`: `me` just gave the topic up (load shedding): the least loaded other one,
    whatever the margin (None when there is none)."""
    snap = await store.get_prefix(keys.brokers_prefix(cluster))
    brokers = [b for b in registered(snap.items, "source") if b.wal_objects]
    mine = next((b for b in brokers if b.broker_id == me), None)
    if mine is None or len(brokers) < 2:
        return None
    owned = owned_by_broker((await store.get_prefix(keys.ownership_prefix(cluster))).items)
    if leaving:
        return least_loaded([b for b in brokers if b.broker_id != me], topic, owned)
    best = least_loaded(brokers, topic, owned)
    if best is None or best.broker_id == me:
        return None
    load = max(mine.topics, owned[me]) - max(best.topics, owned[best.broker_id])
    return best if load >= margin else None


def owned_by_broker(owners: list[KeyValue]) -> Counter[str]:
    """broker id -> how many ownership records (of `keys.ownership_prefix`) it holds."""
    owned: Counter[str] = Counter()
    for kv in owners:
        try:
            owned[mpb.Ownership.FromString(kv.value).broker_id] += 1
        except Exception:  # noqa: BLE001 - a damaged record counts for nobody
            continue
    return owned


async def _pick(store: MetadataStore, cluster: str, role: str, topic: TopicName,
                recent: RecentPicks | None) -> mpb.BrokerInfo | None:
    snap = await store.get_prefix(keys.brokers_prefix(cluster))
    brokers = registered(snap.items, role)
    if not brokers:
        return None
    owners = await store.get_prefix(keys.ownership_prefix(cluster))
    owned = owned_by_broker(owners.items)
    if recent is not None:
        pending = recent.pending({kv.key for kv in owners.items}, cluster)
        again = pending.pop(topic, None)
        if again is not None:  # picked a moment ago: the same broker while it lives
            same = next((b for b in brokers if b.broker_id == again), None)
            if same is not None:
                return same
        owned.update(pending.values())
    return least_loaded(brokers, topic, owned)
