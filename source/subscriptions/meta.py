"""Subscription metadata in etcd, written in batches.

    /shadowtopic/topics/<topic-path>/subscriptions/<name>   SubscriptionMeta
        (proto/shadowtopic/pb/storage/v1/metadata.proto: name, type, created_ms, initial_position,
        read_compacted)

A subscription exists once its meta key does: its cursor (source/cursors/) starts at
`initial_position` until the cursor store holds a newer state. Creates and deletes that
arrive in the same event-loop turn (a client subscribing 10,000 subscriptions in one stream
message) go out as one etcd transaction per `TXN_OPS` keys, each fenced on the owner's
ownership value, never one round trip per subscription.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.cursors.store import Fence
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import Delete, MetadataStore, Put
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

TXN_OPS = 100  # keys per transaction (etcd's default --max-txn-ops is 128)

_TYPES = {"Exclusive": mpb.SubscriptionType.EXCLUSIVE, "Shared": mpb.SubscriptionType.SHARED,
          "Failover": mpb.SubscriptionType.FAILOVER,
          "Key_Shared": mpb.SubscriptionType.KEY_SHARED}
_NAMES = {v: k for k, v in _TYPES.items()}


@dataclass(frozen=True)
class SubscriptionMeta:
    name: str
    type: str
    created_ms: int
    initial_position: MessageId
    read_compacted: bool = False

    def encode(self) -> bytes:
        kind = _TYPES.get(self.type, mpb.SubscriptionType.SUBSCRIPTION_TYPE_UNSPECIFIED)
        return mpb.SubscriptionMeta(
            name=self.name, type=kind, created_ms=self.created_ms,
            initial_position=self.initial_position.to_pb(),
            read_compacted=self.read_compacted).SerializeToString()

    @classmethod
    def decode(cls, data: bytes) -> SubscriptionMeta:
        pb = mpb.SubscriptionMeta.FromString(data)
        pos = pb.initial_position
        return cls(pb.name, _NAMES.get(pb.type, "Exclusive"), pb.created_ms,
                   MessageId(pos.ledger_id, pos.entry_id), pb.read_compacted)


class MetaWriter:
    """Batches subscription meta puts and deletes of one topic into fenced transactions."""

    def __init__(self, metadata: MetadataStore, topic: TopicName, fence: Fence):
        self.metadata = metadata
        self.topic = topic
        self.fence = fence
        self.transactions = 0
        self._pending: list[tuple[str, bytes | None, asyncio.Future]] = []
        self._task: asyncio.Task | None = None

    async def load(self) -> dict[str, SubscriptionMeta]:
        snap = await self.metadata.get_prefix(keys.subscriptions_prefix(self.topic))
        out = {}
        for kv in snap.items:
            meta = SubscriptionMeta.decode(kv.value)
            out[meta.name] = meta
        return out

    async def get(self, name: str) -> SubscriptionMeta | None:
        kv = await self.metadata.get(keys.subscription(self.topic, name))
        return None if kv is None else SubscriptionMeta.decode(kv.value)

    async def put(self, meta: SubscriptionMeta) -> None:
        await self._submit(keys.subscription(self.topic, meta.name), meta.encode())

    async def delete(self, name: str) -> None:
        await self._submit(keys.subscription(self.topic, name), None)

    async def _submit(self, key: str, value: bytes | None) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((key, value, fut))
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        await asyncio.shield(fut)

    async def _run(self) -> None:
        try:
            await asyncio.sleep(0)  # let the rest of this turn's creates join the batch
            while self._pending:
                batch, self._pending = self._pending[:TXN_OPS], self._pending[TXN_OPS:]
                ops = [Put(k, v) if v is not None else Delete(k) for k, v, _ in batch]
                try:
                    res = await self.metadata.txn(self.fence.compares(), ops)
                    self.transactions += 1
                    error = None if res.succeeded else errors.Fenced(
                        f"ownership of {self.topic} moved: subscriptions not changed")
                except errors.ShadowTopicError as exc:  # etcd unavailable: every waiter hears it
                    error = exc
                except Exception as exc:  # noqa: BLE001 - every waiter hears it
                    error = errors.Internal(f"writing subscriptions of {self.topic}: {exc}")
                for _k, _v, fut in batch:
                    if not fut.done():
                        if error is None:
                            fut.set_result(None)
                        else:
                            fut.set_exception(error)
        finally:
            self._task = None
