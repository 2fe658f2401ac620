"""`Topic`: one topic this broker owns, everything the services need of it in one object.

    ledger     the ManagedLedger: the writer, and the topic's `LedgerView` for readers
    policies   the effective policies (a partition follows its parent)
    counters   message and byte counters, rates
    producers  the producers attached to it (`max_producers` is enforced here)
    subscriptions  its durable subscriptions (source/subscriptions/), loaded with it
    replicators    a source's shadow replicators (source/replication/), one per shadow
    compacted      the `read_compacted` view (source/ledger/compacted_view.py), made on first
                   use: it follows the compaction pointer of the topic whose ledgers it reads
                   (a shadow's source)

The `TopicManager` (source/broker/topics.py) loads, holds and drops these; the services ask
it for a topic and then work on the object, never on the manager's internals. Readers are
held by the read engine (source/read/engine.py), which follows a topic across reloads.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import Executor

from source.broker.rates import Publisher, TopicCounters
from source.core import errors
from source.core.names import TopicName
from source.core.policies import Policies
from source.ledger.compacted_view import CompactedView, CompactionFollower
from source.ledger.managed import LedgerConfig, ManagedLedger
from source.ledger.storage import Storage
from source.metadata import MetadataStore
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
        self._compacted: asyncio.Task | None = None  # -> CompactionFollower, once started

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

    async def compacted_view(self, store: MetadataStore, storage: Storage,
                             executor: Executor) -> CompactedView:
        """The topic as `read_compacted` readers see it (following its pointer from now)."""
        if self._compacted is None:
            of = getattr(self.ledger, "source", None) or self.name  # a shadow reads its source's
            follower = CompactionFollower(store, storage, executor, of, self.ledger)

            async def start() -> CompactionFollower:
                await follower.start()
                return follower
            self._compacted = asyncio.get_running_loop().create_task(start())
        try:
            return (await asyncio.shield(self._compacted)).view
        except BaseException:
            if self._compacted.done():
                self._compacted = None  # the next reader tries again
            raise

    async def close_compacted(self) -> None:
        task, self._compacted = self._compacted, None
        if task is not None:
            if not task.done():
                task.cancel()
            follower = (await asyncio.gather(task, return_exceptions=True))[0]
            if isinstance(follower, CompactionFollower):
                await follower.close()

    def set_policies(self, policies: Policies) -> None:
        self.policies = policies
        self.ledger.config = ledger_config(policies)


def ledger_config(p: Policies) -> LedgerConfig:
    return LedgerConfig(max_entries=p.ledger_max_entries, max_bytes=p.ledger_max_bytes,
                        max_age_s=p.ledger_max_age_seconds)
