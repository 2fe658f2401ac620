"""`Topic`: one topic this broker owns, everything the services need of it in one object.

    ledger     the topic's `ServedView` (source/ledger/view.py): what readers and
               subscriptions read; the `ManagedLedger` of a source, the view a feature opens
               for a topic of its kind (a shadow's `ShadowLedger`)
    writer     the `ManagedLedger` of a source topic (produce, roll, truncate, retention);
               None for a topic that reads another's ledgers (a shadow)
    ownership  the ownership key and value this broker holds the topic under, and its epoch
    policies   the effective policies (a partition follows its parent)
    counters   message and byte counters, rates
    producers  the producers attached to it (`max_producers` is enforced here)
    subscriptions  its durable subscriptions (source/subscriptions/), loaded with it
    compacted  how `read_compacted` readers see it, when the compaction feature is there
               (it sets this as the topic opens: compaction/feature.py)

The `TopicBuilder` (source/broker/builder.py) makes a Topic and everything that lives with
it, pushing each close onto the topic's `AsyncExitStack`; `close` unwinds it. The
`TopicManager` (source/broker/topics.py) loads, holds and drops topics; the services ask it
for a topic and then work on the object. Readers are held by the read engine
(source/read/engine.py), which follows a topic across reloads.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from typing import TypeVar

from shadowtopic.broker.rates import Publisher, TopicCounters
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import Policies
from shadowtopic.ledger.managed import LedgerConfig, ManagedLedger
from shadowtopic.ledger.view import CompactedReads, ServedView
from shadowtopic.subscriptions import TopicSubscriptions

T = TypeVar("T")


@dataclass(frozen=True)
class Ownership:
    """This broker's hold on a topic (source/broker/ownership.py): the etcd key and value
    every fenced write compares, and the fencing epoch."""
    key: str
    value: bytes
    epoch: int


class Topic:
    def __init__(self, name: TopicName, ledger: ServedView, policies: Policies,
                 ownership: Ownership, writer: ManagedLedger | None = None,
                 generation: int = 0):
        self.name = name
        #: which incarnation of the name this is (its info key's etcd create revision)
        self.generation = generation
        self.ledger = ledger
        self.writer = writer
        self.ownership = ownership
        self.policies = policies
        self.counters = TopicCounters()
        self.producers: set[Publisher] = set()
        self.subscriptions: TopicSubscriptions | None = None
        #: the topic's `read_compacted` view, opened on first use (set by the compaction
        #: feature; None: this broker does not serve compacted reads)
        self.compacted: Callable[[], Awaitable[CompactedReads]] | None = None
        self.stack = AsyncExitStack()  # what closes with the topic (TopicBuilder)
        self._close_reason: errors.ShadowTopicError | None = None

    @property
    def close_reason(self) -> errors.ShadowTopicError | None:
        """What the topic's consumers hear when it closes (None: it is closing on this
        broker, or its open failed)."""
        return self._close_reason

    def write_ledger(self) -> ManagedLedger:
        """The ledger this broker appends to (`Topics.writable` hands out only topics that
        have one); `NotAllowed` on a topic without (a read-only shadow)."""
        if self.writer is None:
            raise errors.NotAllowed(f"topic {self.name} is read-only: nothing is written to it "
                                    "here")
        return self.writer

    def attach_producer(self, pub: Publisher) -> None:
        """Register a producer, within the `max_producers` policy (0 = no limit)."""
        limit = self.policies.max_producers
        if limit and len(self.producers) >= limit:
            raise errors.TooManyProducers(
                f"{self.name} already has {len(self.producers)} producers "
                f"(max_producers {limit})")
        self.producers.add(pub)

    def detach_producer(self, pub: Publisher) -> None:
        self.producers.discard(pub)

    async def compacted_view(self) -> CompactedReads:
        """The topic as `read_compacted` readers see it."""
        if self.compacted is None:
            raise errors.NotAllowed(f"{self.name}: read_compacted is not served by this broker "
                                    "(it runs without the compaction feature)")
        return await self.compacted()

    def set_policies(self, policies: Policies) -> None:
        self.policies = policies
        if self.writer is not None:
            self.writer.config = ledger_config(policies, self.writer.config)

    async def close(self, reason: errors.ShadowTopicError | None = None) -> None:
        """Close everything that opened with the topic, in reverse order (consumers hear
        `reason`), last the view and the ownership."""
        self._close_reason = reason
        await self.stack.aclose()


def ledger_config(p: Policies, base: LedgerConfig) -> LedgerConfig:
    """`base` (the broker's settings the ledger opened with) with the rolls `p` (the
    effective policies) sets."""
    return replace(base, max_entries=effective(p.ledger_max_entries, "ledger_max_entries"),
                   max_bytes=effective(p.ledger_max_bytes, "ledger_max_bytes"),
                   max_age_s=effective(p.ledger_max_age_seconds, "ledger_max_age_seconds"))


def effective(value: T | None, name: str) -> T:
    """One value of the effective policies (`Policies.effective`, which sets every field:
    a topic's `policies` are those); `Internal` when it is unset, as only a bug makes it."""
    if value is None:
        raise errors.Internal(f"policy {name} is unset: not the effective policies")
    return value
