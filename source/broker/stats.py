"""Topic stats for the Admin service, from wherever the truth is, never loading a topic:

- a topic this broker owns: its `Topic` object (live counts, rates, producers);
- a topic another live broker owns: that broker, asked over gRPC (`OwnerChannels`);
- a topic nobody owns (or whose owner does not answer): etcd's ledger list, with the
  entries of a dead owner's open ledgers counted from their WALs (what recovery will keep).
"""
from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from dataclasses import dataclass, field

import grpc

from shadowtopic.broker.authorize import forwarded_for
from shadowtopic.broker.topic import Topic
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import wal as walmod
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import MetadataStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import admin_pb2 as apb
from shadowtopic.pb.v1 import admin_pb2_grpc
from shadowtopic.security.dial import PLAINTEXT, Dial

SEALED = mpb.LedgerState.SEALED


def ledger_stats(info: mpb.LedgerInfo) -> apb.LedgerStats:
    return apb.LedgerStats(ledger_id=info.ledger_id, entries=info.entries, size=info.size_bytes,
                           state=mpb.LedgerState.Name(info.state),
                           path=info.path or info.wal_path, created_time=info.created_ms,
                           sealed_time=info.sealed_ms)


@dataclass
class Ledgers:
    """A topic's ledgers with every entry count filled in, and the list's counters."""
    infos: list[mpb.LedgerInfo] = field(default_factory=list)
    entries_deleted: int = 0
    epoch: int = 0

    @property
    def entries(self) -> int:
        return sum(i.entries for i in self.infos)

    @property
    def size(self) -> int:
        return sum(i.size_bytes for i in self.infos)

    def last(self) -> MessageId | None:
        for info in reversed(self.infos):
            if info.entries:
                return MessageId(info.ledger_id, info.entries - 1)
        return None

    def current(self) -> tuple[int, int]:
        info = self.infos[-1] if self.infos and self.infos[-1].state != SEALED else None
        return (info.entries, info.size_bytes) if info is not None else (0, 0)


def of_topic(t: Topic) -> Ledgers:
    return Ledgers(t.ledger.ledgers(), t.ledger.entries_deleted, t.ownership.epoch)


async def stored(store: MetadataStore, storage: Storage, executor: Executor,
                 topic: TopicName) -> Ledgers:
    """What etcd and storage say of a topic nobody serves: its list, and for each open
    ledger of a dead owner the entries its WAL holds."""
    kv = await store.get(keys.ledgers(topic))
    lst = mpb.LedgerList.FromString(kv.value) if kv is not None else mpb.LedgerList()
    loop = asyncio.get_running_loop()
    infos = []
    for info in lst.ledgers:
        if info.state != SEALED and info.wal_path:
            info = mpb.LedgerInfo.FromString(info.SerializeToString())
            n, size = await loop.run_in_executor(executor, _wal_count,
                                                 storage.wal_path(info.wal_path))
            info.entries, info.size_bytes = n, size
        infos.append(info)
    return Ledgers(infos, lst.entries_deleted, lst.writer_epoch)


def _wal_count(path: str) -> tuple[int, int]:
    try:
        entries = walmod.recover(path, truncate=False).entries
    except (FileNotFoundError, ValueError):  # not created yet / not a WAL: holds nothing
        return 0, 0
    return len(entries), entries.size


_SUMMED = ("msg_rate_in", "msg_throughput_in", "msg_rate_out", "msg_throughput_out",
           "storage_size", "backlog_size", "msg_in_counter", "bytes_in_counter",
           "msg_out_counter", "bytes_out_counter")


def add_up(total: apb.TopicStats, part: apb.TopicStats) -> None:
    """Add one partition's stats to a topic's."""
    for name in _SUMMED:
        setattr(total, name, getattr(total, name) + getattr(part, name))
    total.topic_epoch = max(total.topic_epoch, part.topic_epoch)
    total.owner_broker = part.owner_broker or total.owner_broker
    total.publishers.extend(part.publishers)
    total.backlog_quota_exceeded |= part.backlog_quota_exceeded
    for name, sub in part.subscriptions.items():
        # the topic is over its backlog quota when some subscription is (its slowest)
        total.backlog_quota_exceeded |= sub.backlog_quota_exceeded
        into = total.subscriptions[name]
        if not into.type:
            into.CopyFrom(sub)
            continue
        for f in ("msg_backlog", "backlog_size", "msg_rate_out", "msg_throughput_out",
                  "msg_rate_redeliver", "unacked_messages", "skipped_entries",
                  "individually_acked_ranges", "msg_out_counter", "msg_redeliver_counter",
                  "msg_expired", "msg_evicted"):
            setattr(into, f, getattr(into, f) + getattr(sub, f))
        into.last_active = max(into.last_active, sub.last_active)
        into.backlog_quota_exceeded |= sub.backlog_quota_exceeded
        into.consumers.extend(sub.consumers)
    for name, rep in part.shadow_replication.items():  # partition i -> shadow partition i
        total.shadow_replication[name].CopyFrom(rep)


def subscription_stats(d: dict) -> apb.SubscriptionStats:
    """A subscription's numbers (TopicSubscriptions.stats) as the protobuf message."""
    d = dict(d)
    consumers = [apb.ConsumerStats(**c) for c in d.pop("consumers")]
    return apb.SubscriptionStats(consumers=consumers, **d)


FORWARDED = "x-shadowtopic-forwarded"


def forwarded(context: grpc.aio.ServicerContext) -> bool:
    """Did another broker forward this call here (so it must not be forwarded again)?"""
    return any(k == FORWARDED for k, _ in context.invocation_metadata() or ())


class OwnerChannels:
    """Admin stubs to other brokers, one channel per broker URL, reused."""

    def __init__(self, dial: Dial = PLAINTEXT) -> None:
        self._dial = dial
        self._channels: dict[str, grpc.aio.Channel] = {}

    def admin(self, url: str) -> admin_pb2_grpc.AdminStub:
        ch = self._channels.get(url)
        if ch is None:
            ch = self._channels[url] = self._dial.aio_channel(url)
        return admin_pb2_grpc.AdminStub(ch)

    async def forward(self, url: str, method: str, request, timeout: float = 5.0):
        """Admin `method` answered by the broker at `url` (marked as forwarded, with the
        caller's role: source/broker/authenticate.py, original principal); None when
        that broker cannot be reached or does not answer in `timeout` (a dead or paused
        owner whose lease has not run out yet: the caller answers from etcd). Other errors
        come back typed."""
        try:
            return await getattr(self.admin(url), method)(
                request, timeout=timeout, metadata=((FORWARDED, "1"), *forwarded_for()))
        except grpc.RpcError as exc:
            err = errors.from_rpc_error(exc)
            if isinstance(err, (errors.ServiceUnavailable, errors.Timeout)):
                return None
            raise err from None

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
