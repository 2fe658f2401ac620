"""The replicators of one loaded source topic: one `ShadowReplicator` per shadow.

`TopicReplicators` follows the source's shadow list in etcd (`keys.shadows` of the topic,
or of its parent for a partition: partition i replicates to partition i of each shadow;
list-then-watch with the one key follower, source/metadata/follow.py) and starts or stops
replicators as shadows are created and deleted while the topic is loaded. `Channels` keeps
one gRPC channel per shadow broker address for all replicators of a broker.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from shadowtopic.core.names import TopicName
from shadowtopic.ledger.view import LedgerView
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import MetadataStore
from shadowtopic.metadata.follow import KeyFollower
from shadowtopic.metadata.placement import RecentPicks
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.security.dial import PLAINTEXT, Dial
from shadowtopic.shadow.replicator import ShadowReplicator

log = logging.getLogger(__name__)


class Channels:
    """One channel per address, shared (closed with the broker)."""

    def __init__(self, dial: Callable[[], Dial] = lambda: PLAINTEXT) -> None:
        self._dial = dial  # how the broker dials (source/security/dial.py), asked when needed
        self._by_url: dict[str, grpc.aio.Channel] = {}

    def get(self, url: str) -> grpc.aio.Channel:
        ch = self._by_url.get(url)
        if ch is None:
            ch = self._by_url[url] = self._dial().aio_channel(url)
        return ch

    async def close(self) -> None:
        channels, self._by_url = list(self._by_url.values()), {}
        for ch in channels:
            await ch.close()


class TopicReplicators:
    def __init__(self, topic: TopicName, info: mpb.TopicInfo, view: LedgerView,
                 store: MetadataStore, cluster: str,
                 ownership: Callable[[], tuple[str, bytes, int]],
                 auto_reset: Callable[[], int], channels: Channels,
                 picks: RecentPicks | None = None):
        self.topic = topic
        self._partition = info.partition_index if info.partition_of else -1
        self._list_key = keys.shadows(TopicName.parse(info.partition_of)
                                      if info.partition_of else topic)
        self._make = lambda shadow: ShadowReplicator(
            topic, shadow, view, store, cluster, ownership, auto_reset, channels.get, picks)
        self.store = store
        self.replicators: dict[TopicName, ShadowReplicator] = {}
        self._follower = KeyFollower(store, self._list_key, self._on_list)
        self._task: asyncio.Task | None = None

    def start(self) -> TopicReplicators:
        """Follow the shadow list from now on; while etcd is unavailable the topic serves
        and its replicators start once the list is read."""
        self._task = asyncio.get_running_loop().create_task(
            self._follower.start_retrying(), name=f"shadow list of {self.topic}")
        return self

    async def _on_list(self, value: bytes | None, revision: int) -> None:
        await self._apply(value)

    async def _apply(self, value: bytes | None) -> None:
        names = mpb.ShadowList.FromString(value).shadows if value else ()
        wanted = set()
        for name in names:
            shadow = TopicName.parse(name)
            wanted.add(shadow.partition(self._partition) if self._partition >= 0 else shadow)
        for shadow in [s for s in self.replicators if s not in wanted]:
            await self.replicators.pop(shadow).stop()
            log.info("%s: replicator to %s stopped (shadow deleted)", self.topic, shadow)
        for shadow in sorted(wanted - set(self.replicators), key=str):
            self.replicators[shadow] = self._make(shadow).start()
            log.info("%s: replicating to %s", self.topic, shadow)

    def stats(self) -> dict[str, dict]:
        return {str(s): r.stats() for s, r in self.replicators.items()}

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._follower.close()
        for r in list(self.replicators.values()):
            await r.stop()
        self.replicators.clear()
