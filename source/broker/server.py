"""The broker process: gRPC services over the topic manager, health, reflection, shutdown.

    python -m source.broker.server --etcd 127.0.0.1:2379 --data-dir ./data --port 6650

Health is SERVING only while the broker holds its etcd lease (NOT_SERVING while etcd is
unreachable; no crash loop). SIGTERM: health NOT_SERVING first, stop taking new calls, let
in-flight writes finish their fsync and acks, release ownership, exit.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import socket
import uuid
from dataclasses import dataclass
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from source.broker.admin_service import AdminService
from source.broker.consumer_service import ConsumerService
from source.broker.ownership import BrokerSession
from source.broker.producer_service import ProducerService
from source.broker.rpc import RejectMalformed
from source.broker.topics import ShadowLoader, TopicManager
from source.core.argtypes import size
from source.ledger.entry_cache import DEFAULT_BYTES
from source.ledger.storage import Storage
from source.metadata.etcd import EtcdStore
from source.pb.v1 import admin_pb2_grpc, consumer_pb2, producer_pb2

log = logging.getLogger("shadowtopic.broker")
MAX_MESSAGE = 64 << 20
SERVICE_NAMES = ["shadowtopic.v1.Admin", "shadowtopic.v1.Producer", "shadowtopic.v1.Consumer"]


@dataclass
class BrokerConfig:
    etcd: str = "127.0.0.1:2379"
    data_dir: str = "./data"
    storage_root: str | None = None      # pyarrow URI; default <data_dir>/storage
    host: str = "127.0.0.1"
    port: int = 6650
    cluster: str = "standalone"
    broker_id: str = ""                  # default: kept in <data_dir>/broker.id
    lease_ttl: int = 10
    roles: tuple[str, ...] = ("source",)
    cursor_flush_interval: float = 1.0   # seconds between cursor snapshots of a topic
    retention_interval: float = 60.0     # seconds between retention passes
    entry_cache_bytes: int = DEFAULT_BYTES  # entries held in memory, all topics together
    profile: str | None = None           # run under cProfile, its stats written here on exit

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"

    def resolve_broker_id(self) -> str:
        """A broker's id survives restarts on the same data dir, so a restarted broker takes
        back the topics its previous (dead) incarnation owned without waiting for the lease."""
        if not self.broker_id:
            path = os.path.join(self.data_dir, "broker.id")
            try:
                with open(path) as f:
                    self.broker_id = f.read().strip()
            except FileNotFoundError:
                os.makedirs(self.data_dir, exist_ok=True)
                self.broker_id = f"broker-{uuid.uuid4().hex[:12]}"
                with open(path, "w") as f:
                    f.write(self.broker_id + "\n")
        return self.broker_id


class BrokerPlugin(Protocol):
    """What another role adds to a broker (the shadow broker, shadow/broker.py): a loader
    for topics this broker serves besides sources, and gRPC services of its own."""

    def shadow_loader(self, broker: "Broker") -> ShadowLoader | None: ...

    def add_services(self, broker: "Broker", server: grpc.aio.Server) -> list[str]:
        """Register services; return their full names (health and reflection list them)."""


class Broker:
    def __init__(self, config: BrokerConfig, plugin: BrokerPlugin | None = None):
        self.config = config
        self.plugin = plugin
        config.resolve_broker_id()
        self.store = EtcdStore(config.etcd)
        root = config.storage_root or os.path.join(os.path.abspath(config.data_dir), "storage")
        if "://" not in root:
            os.makedirs(root, exist_ok=True)
        self.storage = Storage(root)
        self.session = BrokerSession(self.store, config.cluster, config.broker_id, config.url,
                                     list(config.roles), ttl=config.lease_ttl)
        self.topics = TopicManager(self.store, self.storage, self.session,
                                   retention_interval=config.retention_interval,
                                   cursor_flush_interval=config.cursor_flush_interval,
                                   entry_cache_bytes=config.entry_cache_bytes)
        if plugin is not None:
            self.topics.shadow_loader = plugin.shadow_loader(self)
        self.service_names = list(SERVICE_NAMES)
        self.session.on_lost = self.topics.fence_all
        self.health = health.aio.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self._health_task: asyncio.Task | None = None

    async def start(self) -> None:
        opts = [("grpc.max_send_message_length", MAX_MESSAGE),
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.so_reuseport", 0)]
        # a unary request that does not parse gets INVALID_ARGUMENT, not grpc's UNKNOWN
        self.server = grpc.aio.server(options=opts, interceptors=[RejectMalformed()])
        self.admin = AdminService(self.topics, self.session)
        admin_pb2_grpc.add_AdminServicer_to_server(self.admin, self.server)
        # Produce takes request bytes (stored as they came) and Connect sends pre-encoded
        # frames: both are registered with identity (de)serializers on those sides.
        self.producer = producer = ProducerService(self.topics)
        self.consumer = ConsumerService(self.topics)
        self.server.add_generic_rpc_handlers((
            grpc.method_handlers_generic_handler("shadowtopic.v1.Producer", {
                "Produce": grpc.stream_stream_rpc_method_handler(
                    producer.Produce, request_deserializer=None,
                    response_serializer=producer_pb2.ProduceReceipt.SerializeToString)}),
            grpc.method_handlers_generic_handler("shadowtopic.v1.Consumer", {
                "Connect": grpc.stream_stream_rpc_method_handler(
                    self.consumer.Connect,
                    request_deserializer=consumer_pb2.ClientMessage.FromString,
                    response_serializer=None)}),))
        if self.plugin is not None:
            self.service_names += self.plugin.add_services(self, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)
        bound = self.server.add_insecure_port(self.config.url)
        if bound == 0:
            raise OSError(f"cannot bind {self.config.url}")
        await self._set_health(False)
        await self.server.start()
        await self.session.start()
        await self.topics.start()
        self._health_task = asyncio.create_task(self._follow_health())
        log.info("broker %s listening on %s (etcd %s, storage %s)", self.config.broker_id,
                 self.config.url, self.config.etcd, self.storage.uri)

    async def _set_health(self, serving: bool) -> None:
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ["", *self.service_names]:
            await self.health.set(name, status)

    async def _follow_health(self) -> None:
        serving = None
        while True:
            now = self.session.healthy.is_set()
            if now != serving:
                serving = now
                await self._set_health(now)
                log.info("health: %s", "SERVING" if now else "NOT_SERVING")
            await asyncio.sleep(0.2)

    async def stop(self, grace: float = 10.0) -> None:
        if self._health_task:
            self._health_task.cancel()
        await self._set_health(False)
        if self.server is not None:
            stopping = asyncio.create_task(self.server.stop(grace))
            await asyncio.sleep(0)  # new calls are refused from here on
            self.producer.shutdown()
            self.consumer.shutdown()
            await stopping
        await self.topics.close()
        await self.admin.owners.close()
        await self.session.stop(revoke=True)
        await self.store.close()


async def serve(config: BrokerConfig, plugin: BrokerPlugin | None = None) -> None:
    broker = Broker(config, plugin)
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await broker.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    run(parse_config(argv, "shadowtopic broker", "run one (source) broker"))


def parse_config(argv: list[str] | None, prog: str, description: str) -> BrokerConfig:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--etcd", default=os.environ.get("SHADOWTOPIC_ETCD", "127.0.0.1:2379"))
    p.add_argument("--data-dir", default="./data")
    p.add_argument("--storage-root", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=6650)
    p.add_argument("--cluster", default="standalone")
    p.add_argument("--broker-id", default=None)
    p.add_argument("--lease-ttl", type=int, default=10)
    p.add_argument("--cursor-flush-interval", type=float, default=1.0,
                   help="seconds between cursor snapshots (what a crash can redeliver)")
    p.add_argument("--retention-interval", type=float, default=60.0)
    p.add_argument("--entry-cache-bytes", type=size, default=DEFAULT_BYTES, metavar="SIZE",
                   help="memory for entries, shared by all topics of this broker (open "
                        "ledgers' entries, WAL re-reads, encoded entries); past it the "
                        "least recently used are dropped and read back from the WAL or "
                        "Parquet when needed (e.g. 64M, 1G; default 256M)")
    p.add_argument("--profile", default=None, metavar="PATH",
                   help="run under cProfile and write its stats to PATH on exit (benchmarks)")
    a = p.parse_args(argv)
    if a.entry_cache_bytes < 0:
        p.error("--entry-cache-bytes must be 0 or more")
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = BrokerConfig(etcd=a.etcd, data_dir=a.data_dir, storage_root=a.storage_root,
                       host=a.host, port=a.port, cluster=a.cluster, lease_ttl=a.lease_ttl,
                       cursor_flush_interval=a.cursor_flush_interval,
                       retention_interval=a.retention_interval,
                       entry_cache_bytes=a.entry_cache_bytes, profile=a.profile)
    if a.broker_id:
        cfg.broker_id = a.broker_id
    return cfg


def run(cfg: BrokerConfig, plugin: BrokerPlugin | None = None) -> None:
    """Serve until SIGTERM / SIGINT."""
    # A broker holds millions of long-lived objects (100,000 subscriptions, their cursors and
    # consumers): with the default thresholds the cycle collector walks them all again and
    # again (acks of a broadcast ran 2.5x slower). Young collections every 100,000
    # allocations instead of 700; cycles are rare here and still collected.
    gc.set_threshold(100_000, 50, 1000)
    if cfg.profile:
        import cProfile
        with cProfile.Profile() as prof:
            asyncio.run(serve(cfg, plugin))
        prof.dump_stats(cfg.profile)
    else:
        asyncio.run(serve(cfg, plugin))


if __name__ == "__main__":
    main()
