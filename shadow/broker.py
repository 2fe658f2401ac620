"""The shadow broker: a broker process (source/broker/server.py) with the shadow role.

    python -m shadow.broker --etcd HOST:PORT --storage-root <the source's storage root> ...

It takes the same flags as the source broker and registers with the role "shadow": the
source's replicators and the brokers' Lookup send shadow topics here. On top of what every
broker serves (Admin, Producer, Consumer; a produce to a shadow is refused), it

- loads shadow topics: ownership (lease + epoch, as for sources), a `ShadowLedger` over the
  source's ledgers in the shared storage root (it writes no ledger), and the same
  subscription engine the source broker runs, over that view;
- serves the Replication service (shadow/replication.py), the receiving end of the
  source's `ShadowReplicator`s.

Its storage root must be the source broker's (standalone passes the same one), so that
sealed ledgers and the open ledger's WAL are readable here.
"""
from __future__ import annotations


import grpc

from source.broker import server
from source.broker.topic import Topic
from source.broker.topics import ShadowLoader
from source.core.names import TopicName
from source.cursors.store import Fence
from source.pb.storage.v1 import metadata_pb2 as mpb
from source.pb.v1 import replication_pb2_grpc
from source.subscriptions import TopicSubscriptions

from shadow.ledger import ShadowLedger
from shadow.replication import ReplicationService

ROLE = "shadow"


class ShadowRole:
    """The `BrokerPlugin` that makes a broker a shadow broker."""

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
                    lambda: t.policies, t.counters, topics.cursor_flush_interval).load()
            except BaseException:
                await view.close()
                await broker.session.release(key, value)
                raise
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
