"""`Topic`: one topic this broker owns, everything the services need of it in one object.

    ledger     the ManagedLedger: the writer, and the topic's `LedgerView` for readers
    policies   the effective policies (a partition follows its parent)
    counters   message and byte counters, rates
    producers  the producers attached to it (`max_producers` is enforced here)
    subscriptions  its durable subscriptions (source/subscriptions/), loaded with it
    replicators    a source's shadow replicators (source/replication/), one per shadow

The `TopicManager` (source/broker/topics.py) loads, holds and drops these; the services ask
it for a topic and then work on the object, never on the manager's internals. Readers are
held by the read engine (source/read/engine.py), which follows a topic across reloads.
"""
from __future__ import annotations

from source.broker.rates import Publisher, TopicCounters
from source.core import errors
from source.core.names import TopicName
from source.core.policies import Policies
from source.ledger.managed import LedgerConfig, ManagedLedger
from source.replication.shadows import TopicReplicators
from source.subscriptions import TopicSubscriptions


class Topic:
    def __init__(self, name: TopicName, ledger: ManagedLedger, policies: Policies):
        self.name = name
        self.ledger = ledger
        self.policies = policies
        self.counters = TopicCounters()
        self.producers: set[Publisher] = set()
        self.subscriptions: TopicSubscriptions | None = None
        self.replicators: TopicReplicators | None = None  # a source's, one per shadow

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

    def set_policies(self, policies: Policies) -> None:
        self.policies = policies
        self.ledger.config = ledger_config(policies)


def ledger_config(p: Policies) -> LedgerConfig:
    return LedgerConfig(max_entries=p.ledger_max_entries, max_bytes=p.ledger_max_bytes,
                        max_age_s=p.ledger_max_age_seconds)
