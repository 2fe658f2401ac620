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

The assignment is sticky: the ownership record the serving broker holds says who serves a
topic, and callers (Lookup, the source's shadow replicators) ask here only when no live
broker owns it - when it is first placed, or when its owner's lease expired (failover).
Every asker computes the answer from etcd alone, so they agree without talking to each
other.
"""
from __future__ import annotations

import hashlib
from collections import Counter

from source.core.names import TopicName
from source.metadata import keys
from source.metadata.base import MetadataStore
from source.pb.storage.v1 import metadata_pb2 as mpb


def rank(broker_id: str, topic: TopicName) -> bytes:
    """The rendezvous rank of `broker_id` for `topic` (the smallest wins a tie)."""
    return hashlib.blake2b(f"{broker_id}\n{topic}".encode(), digest_size=8).digest()


def least_loaded(brokers: list[mpb.BrokerInfo], topic: TopicName,
                 owned: Counter | None = None) -> mpb.BrokerInfo | None:
    """The broker with the fewest topics (reported, or owned now: the larger), then the
    fewest subscriptions, then the best rendezvous rank for `topic`; None for no brokers."""
    owned = owned or Counter()
    return min(brokers, default=None,
               key=lambda b: (max(b.topics, owned[b.broker_id]), b.subscriptions,
                              rank(b.broker_id, topic), b.broker_id))


async def pick_broker(store: MetadataStore, cluster: str, role: str,
                      topic: TopicName) -> mpb.BrokerInfo | None:
    """The live registered broker with `role` that should serve `topic` now that nobody owns
    it (see the module docstring); None when no broker has the role."""
    snap = await store.get_prefix(keys.brokers_prefix(cluster))
    brokers = [b for b in (mpb.BrokerInfo.FromString(kv.value) for kv in snap.items)
               if role in b.roles]
    if not brokers:
        return None
    owners = await store.get_prefix(keys.ownership_prefix(cluster))
    owned: Counter = Counter()
    for kv in owners.items:
        try:
            owned[mpb.Ownership.FromString(kv.value).broker_id] += 1
        except Exception:  # noqa: BLE001 - a damaged record counts for nobody
            continue
    return least_loaded(brokers, topic, owned)
