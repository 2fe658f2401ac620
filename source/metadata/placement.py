"""Placement: which registered broker serves a topic nobody owns yet.

Brokers register under `keys.brokers_prefix(cluster)` with their roles (source, shadow, ...).
Every asker computes the same answer from that list alone, so the source broker's replicator
and any broker answering a lookup agree without talking to each other.
"""
from __future__ import annotations

import zlib

from source.core.names import TopicName
from source.metadata import keys
from source.metadata.base import MetadataStore
from source.pb.storage.v1 import metadata_pb2 as mpb


async def pick_broker(store: MetadataStore, cluster: str, role: str,
                      topic: TopicName) -> mpb.BrokerInfo | None:
    """A registered broker with `role` for `topic`, the same for every asker (by a hash of
    the topic's name without its partition suffix, so a topic's partitions go together)."""
    snap = await store.get_prefix(keys.brokers_prefix(cluster))
    brokers = sorted((b for b in (mpb.BrokerInfo.FromString(kv.value) for kv in snap.items)
                      if role in b.roles), key=lambda b: b.broker_id)
    if not brokers:
        return None
    base = str(topic).split("-partition-")[0]
    return brokers[zlib.crc32(base.encode()) % len(brokers)]
