"""The shadow broker: a broker process (source/broker/server.py) with the shadow role.

    python -m shadow.broker --etcd HOST:PORT --storage-root <the source's storage root> ...

It takes the same flags as the source broker and registers with the role "shadow": the
source's replicators and the brokers' Lookup send shadow topics here. On top of what every
broker serves (Admin, Producer, Consumer; a produce to a shadow is refused), it

- loads shadow topics: ownership (lease + epoch, as for sources), a `ShadowLedger` over the
  source's ledgers in the shared storage root (it writes no ledger), and the same
  subscription engine the source broker runs, over that view;
- serves the Replication service (shadow/replication.py), the receiving end of the
  source's `ShadowReplicator`s;
- publishes, for each shadow it serves, the oldest position its durable subscriptions
  still need (shadow/needs.py), which the source's retention keeps when its policy
  `retention_keeps_shadow_backlog` says so;
- follows each served shadow's info key (shadow/follow.py, list-then-watch): a shadow
  deleted through another broker (`topics delete-shadow-topic` removes its keys in one
  txn) is unloaded here too. Its consumers get `TopicNotFound`; its subscriptions close
  without a cursor flush, its cursor files go and its ownership is released; then one
  txn, only while the info key is still absent, removes what a cursor flush or subscribe
  in flight may have written under the shadow's prefix after the delete, and its need.

Its storage root must be the source broker's (standalone passes the same one), so that
sealed ledgers and the open ledger's WAL are readable here.
"""
from __future__ import annotations

import asyncio
import logging

import grpc

from source.broker import server
from source.broker.topic import Topic
from source.broker.topics import ShadowLoader, TopicManager
from source.core import errors
from source.core.names import TopicName
from source.cursors.store import Fence
from source.ledger.view import Trimmed
from source.metadata import keys
from source.metadata.base import Compare, Delete, MetadataStore
from source.pb.storage.v1 import metadata_pb2 as mpb
from source.pb.v1 import replication_pb2_grpc
from source.subscriptions import TopicSubscriptions

from shadow.follow import KeyFollower
from shadow.ledger import ShadowLedger
from shadow.needs import INTERVAL_S, NeedsPublisher, ShadowNeed
from shadow.replication import ReplicationService

log = logging.getLogger(__name__)

ROLE = "shadow"


class Served:
    """What a loaded shadow topic has on a shadow broker besides its Topic: its published
    need and the follower of its info key. A `ViewListener` of the topic's view: both stop
    when the view closes (unload, fencing)."""

    def __init__(self, role: "ShadowRole", topics: TopicManager, store: MetadataStore,
                 shadow: TopicName, source: TopicName, t: Topic):
        self.role = role
        self.topics = topics
        self.store = store
        self.shadow = shadow
        self.source = source
        self.topic = t
        self.seen = False       # the info key was there when the follower listed it
        self.deleted = False
        self.need: ShadowNeed | None = None
        self.follower = KeyFollower(store, keys.topic_info(shadow), self._on_info)

    # ---- the info key ----------------------------------------------------------------------

    def _on_info(self, value: bytes | None, revision: int) -> None:
        if value is not None:
            self.seen = True
        elif not self.deleted:
            self.deleted = True
            self.role.spawn(self.unload_deleted(), f"unload deleted {self.shadow}")

    async def unload_deleted(self) -> None:
        """The shadow was deleted (its info key is gone): unload it here."""
        t = self.topic
        here = self.topics.loaded(self.shadow) is t  # else: unloaded meanwhile (a delete
        gone = errors.TopicNotFound(f"topic {self.shadow} was deleted")  # handled here)
        self.stop_need()
        if here:
            log.info("%s was deleted: unloading it", self.shadow)
            try:
                if t.subscriptions is not None:  # consumers stop; cursors are not saved again
                    await t.subscriptions.close(gone, flush=False)
                await self.topics.cursors.purge(self.shadow)  # still owned: nobody else's
            except Exception as exc:  # noqa: BLE001 - the unload goes on
                log.warning("%s: closing after its deletion: %s", self.shadow, exc)
            await self.topics.unload(self.shadow, gone)  # releases the ownership
        try:
            # keys under the prefix of a topic without info are leftovers (what a cursor
            # flush or a subscribe in flight wrote after the delete; after the release no
            # fenced write of this broker can land), and so is its need
            await self.store.txn(
                [Compare(keys.topic_info(self.shadow), "version", "==", 0)],
                [Delete(keys.topic_prefix(self.shadow), prefix=True),
                 Delete(keys.shadow_needs(self.source, self.shadow))])
        except Exception as exc:  # noqa: BLE001 - best effort
            log.warning("%s: cleaning up after its deletion failed: %s", self.shadow, exc)

    # ---- the need --------------------------------------------------------------------------

    def start_need(self) -> None:
        if self.topic.subscriptions is not None:
            self.need = self.role.needs(self.topics).track(
                self.shadow, self.source, self.topic.ledger.ownership,
                self.topic.subscriptions)

    def stop_need(self) -> None:
        if self.need is not None and self.role.publisher is not None:
            self.role.publisher.untrack(self.need)
        self.need = None

    # ---- ViewListener ----------------------------------------------------------------------

    def on_entries(self) -> None:
        pass

    def on_trimmed(self, trimmed: Trimmed) -> None:
        pass

    def on_closed(self, reason: errors.ShadowTopicError) -> None:
        self.stop_need()
        self.role.spawn(self.follower.close(), f"stop following {self.shadow}")


class ShadowRole:
    """The `BrokerPlugin` that makes a broker a shadow broker."""

    def __init__(self) -> None:
        self.publisher: NeedsPublisher | None = None
        self._tasks: set[asyncio.Task] = set()

    def needs(self, topics: TopicManager) -> NeedsPublisher:
        if self.publisher is None:
            self.publisher = NeedsPublisher(
                topics.store, max(INTERVAL_S, 2 * topics.cursor_flush_interval))
        return self.publisher

    def spawn(self, coro, name: str) -> None:
        """Run `coro` in a task of its own (watch callbacks only enqueue work)."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", task.get_name(), exc_info=task.exception())

    def shadow_loader(self, broker: server.Broker) -> ShadowLoader:
        async def load(topic: TopicName, info: mpb.TopicInfo) -> Topic:
            topics = broker.topics
            policies = await topics.policies(topic)
            key, value, epoch = await broker.session.acquire(topic)
            try:
                view = await ShadowLedger.open(topic, TopicName.parse(info.source),
                                               broker.store, broker.storage, topics.executor,
                                               entry_cache=topics.entry_cache)
            except BaseException:
                await broker.session.release(key, value)
                raise
            view.ownership, view.epoch = (key, value), epoch
            t = Topic(topic, view, policies)
            try:
                t.subscriptions = await TopicSubscriptions(
                    topic, view, broker.store, topics.cursors, Fence(key, value),
                    lambda: t.policies, t.counters, topics.cursor_flush_interval).load(
                        lambda: t.compacted_view(broker.store, broker.storage, topics.executor))
            except BaseException:
                await t.close_compacted()
                await view.close()
                await broker.session.release(key, value)
                raise
            served = Served(self, topics, broker.store, topic, TopicName.parse(info.source), t)
            try:
                await served.follower.start()
                if not served.seen:
                    raise errors.TopicNotFound(f"topic {topic} was deleted")
            except BaseException:
                await served.follower.close()
                await t.subscriptions.close(flush=False)
                await t.close_compacted()
                await view.close()
                await broker.session.release(key, value)
                raise
            view.add_listener(served)
            served.start_need()
            return t
        return load

    def add_services(self, broker: server.Broker, grpc_server: grpc.aio.Server) -> list[str]:
        replication_pb2_grpc.add_ReplicationServicer_to_server(
            ReplicationService(broker.topics, broker.config.cluster), grpc_server)
        return ["shadowtopic.v1.Replication"]


def main(argv: list[str] | None = None) -> None:
    cfg = server.parse_config(argv, "shadowtopic shadow-broker",
                              "run a shadow broker (serves shadow topics; sources too)")
    cfg.roles = (ROLE,)
    server.run(cfg, ShadowRole())


if __name__ == "__main__":
    main()
