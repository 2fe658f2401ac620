"""The broker process: gRPC services over the topic manager, health, reflection, shutdown.

    python -m shadowtopic.broker --etcd 127.0.0.1:2379 --data-dir ./data --port 6650
        [--features shadow,compaction]     (default: every installed feature)

Health is SERVING only while the broker holds its etcd lease (NOT_SERVING while etcd is
unreachable; no crash loop). The Producer service's health also needs a data disk that takes
writes: the broker probes it every `disk.PROBE_INTERVAL` seconds (write and fsync a small
file; source/ledger/disk.py) and hears of every real write that found it full or read-only;
while it is, Producer says NOT_SERVING (produce fails with `StorageFull` /
`StorageReadOnly`) and every other service, the overall status ("") included, stays SERVING:
reads, consumers and stats go on. Once the disk takes writes again Producer says SERVING
and the ledgers it kept from sealing are sealed. SIGTERM: health NOT_SERVING first, stop
taking new calls, let in-flight writes finish their fsync and acks, release ownership, exit.

Memory held for clients is capped (`--client-memory-bytes`), consumer streams that do not
read are cut, and dead or half-open connections are closed (keepalive, handshake timeout):
source/broker/memory.py.

HTTP (source/observability/http.py) on --metrics-port (default --port + 1000): `/metrics`
(source/broker/metrics.py, the features' series, gRPC request series), `/healthz` (alive)
and `/readyz`: 200 only once started, while the etcd lease is held and while the data disk
takes writes (the same inputs as gRPC health), else 503 with the reasons on one line.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import sys
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector

from shadowtopic.broker import feature
from shadowtopic.broker.admin_service import AdminService
from shadowtopic.broker.authenticate import Authenticate
from shadowtopic.broker.authorize import Authorizer
from shadowtopic.broker.config import BrokerConfig, lock_data_dir, parse_config
from shadowtopic.broker.consumer_service import ConsumerService
from shadowtopic.broker.feature import BrokerFeature
from shadowtopic.broker.maintenance import Maintenance
from shadowtopic.broker.memory import ClientMemory, server_options
from shadowtopic.broker.metrics import BrokerCollector
from shadowtopic.broker.ownership import BrokerSession, topics_load
from shadowtopic.broker.producer_service import ProducerService
from shadowtopic.broker.rpc import RejectMalformed
from shadowtopic.broker.shedding import Shedder
from shadowtopic.broker.storage_service import add_storage_service
from shadowtopic.broker.tables_service import add_tables_service
from shadowtopic.broker.topic import Topic
from shadowtopic.broker.topics import TopicManager
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import disk, object_store
from shadowtopic.ledger.object_wal import ObjectWal
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import tenants
from shadowtopic.metadata.etcd import EtcdStore
from shadowtopic.observability.http import OFF, HttpEndpoint, default_port
from shadowtopic.observability.rpc_metrics import RpcMetrics
from shadowtopic.pb.v1 import admin_pb2_grpc, producer_pb2

log = logging.getLogger("shadowtopic.broker")
MAX_MESSAGE = 64 << 20
PRODUCER = "shadowtopic.v1.Producer"  # NOT_SERVING also while the disk takes no writes
SERVICE_NAMES = ["shadowtopic.v1.Admin", PRODUCER, "shadowtopic.v1.Consumer"]


class Broker:
    """One broker process: the core (source topics, reads, subscriptions, admin) and the
    features it is assembled with (source/broker/feature.py). It is the `BrokerHost` its
    features bind to."""

    def __init__(self, config: BrokerConfig, features: list[BrokerFeature] | None = None):
        self.config = config
        _resolve_broker_id(config)
        self.features = list(features or ())
        self.store = EtcdStore(config.etcd, options=config.etcd_options)
        root = config.storage_root or os.path.join(os.path.abspath(config.data_dir), "storage")
        wal_dir = config.wal_dir
        if wal_dir is None and "://" in root and not root.startswith("file://"):
            wal_dir = os.path.abspath(config.data_dir)  # an object store: WALs stay local
        for d in ([] if "://" in root else [root]) + ([wal_dir] if wal_dir else []):
            try:
                os.makedirs(d, exist_ok=True)
            except OSError as exc:  # a read-only or full disk: serve what is there
                log.warning("cannot create the directory %s: %s", d, exc)
        self.storage = Storage(root, wal_dir, config.s3)
        self.storage.disk.on_change = self._disk_changed
        self.session = BrokerSession(self.store, config.cluster, config.broker_id, config.url,
                                     list(config.roles), ttl=config.lease_ttl)
        self.wal_objects = self._object_wal(config)
        self.session.wal_objects = self.wal_objects is not None
        self.topics = TopicManager(self.store, self.storage, self.session,
                                   cursor_flush_interval=config.cursor_flush_interval,
                                   entry_cache_bytes=config.entry_cache_bytes,
                                   dedup_idle_seconds=config.dedup_idle_seconds,
                                   features=self.features, wal_objects=self.wal_objects)
        self.maintenance = Maintenance(self.topics, self.features, config.retention_interval,
                                       self.wal_objects, config.wal_gc_grace_seconds)
        # who may do what (source/broker/authorize.py), followed from etcd when it is on
        self.authz = Authorizer(self.store, frozenset(config.auth.superuser_roles),
                                config.auth.authorization, self._source_of)
        self.memory = ClientMemory(config.client_memory_bytes, config.client_stall_seconds)
        for f in self.features:
            f.bind(self)
        # source topics shed by load: only among brokers with the WAL on object storage
        # (any of them can take another's open ledgers: source/broker/shedding.py)
        self.shedder = (Shedder(self, "source", config.load_shedding_interval,
                                victims=self._sources, peer=lambda b: b.wal_objects)
                        if "source" in config.roles and self.wal_objects is not None else None)
        self.service_names = list(SERVICE_NAMES)
        self.session.on_lost = self.topics.fence_all
        self.session.load = lambda: topics_load(self.topics.loaded_topics())  # in etcd
        self.health = health.aio.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self._health_task: asyncio.Task | None = None
        self._probe_task: asyncio.Task | None = None
        self._resuming: set[asyncio.Task] = set()
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.rpc_metrics = RpcMetrics(self.registry)
        self.registry.register(BrokerCollector(self))
        self.http: HttpEndpoint | None = None
        self._started = False
        self._stopping = False

    def _object_wal(self, config: BrokerConfig) -> ObjectWal | None:
        """The WAL on object storage (`--wal`), or None for the local WAL."""
        if not config.wal:
            return None
        fs, base = object_store.open_root(config.wal, config.s3)
        return ObjectWal(fs, base, config.wal, self.store, config.broker_id,
                         ThreadPoolExecutor(max_workers=4, thread_name_prefix="wal-objects"),
                         window_s=config.wal_window_ms / 1000,
                         max_flushes=config.wal_flushes)

    def not_ready(self) -> list[str]:
        """Why `/readyz` says 503 ([]: ready)."""
        reasons = []
        if self._stopping:
            reasons.append("shutting down")
        elif not self._started:
            reasons.append("starting")
        if not self.session.healthy.is_set():
            reasons.append(f"etcd {self.config.etcd} unreachable (no broker lease)")
        if not self.storage.disk.writable:
            err = self.storage.disk.error
            reasons.append(f"storage not writable ({PRODUCER} NOT_SERVING; reads go on): "
                           f"{err.message if err is not None else 'unknown'}")
        return reasons

    async def _start_http(self) -> None:
        port = self.config.metrics_port
        if port == OFF:
            return
        self.http = HttpEndpoint(self.registry, self.not_ready, self.config.host,
                                 default_port(self.config.port) if port is None else port,
                                 fallback=port is None)
        await self.http.start()
        self.session.metrics_url = self.http.url

    async def start(self) -> None:
        opts = [("grpc.max_send_message_length", MAX_MESSAGE),
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.so_reuseport", 0),
                *server_options(self.config.handshake_timeout, self.config.keepalive_interval)]
        # a unary request that does not parse gets INVALID_ARGUMENT, not grpc's UNKNOWN
        # authenticated before anything else (source/broker/authenticate.py)
        auth = self.config.auth
        self.server = grpc.aio.server(options=opts, interceptors=[
            self.rpc_metrics,
            Authenticate(auth.authenticator(), self.authz, frozenset(auth.proxy_roles)),
            RejectMalformed()])
        self.admin = AdminService(self.topics, self.session, self.features,
                                  dial=self.config.dial(), auto_namespaces=not auth.authorization)
        admin_pb2_grpc.add_AdminServicer_to_server(self.admin, self.server)
        # Produce takes request bytes (stored as they came) and Connect sends pre-encoded
        # frames: both are registered with identity (de)serializers on those sides.
        self.producer = producer = ProducerService(self.topics, self.memory, self.authz)
        self.consumer = ConsumerService(self.topics, self.memory, self.authz)
        self.server.add_generic_rpc_handlers((
            grpc.method_handlers_generic_handler("shadowtopic.v1.Producer", {
                "Produce": grpc.stream_stream_rpc_method_handler(
                    producer.Produce, request_deserializer=None,
                    response_serializer=producer_pb2.ProduceReceipt.SerializeToString)}),
            grpc.method_handlers_generic_handler("shadowtopic.v1.Consumer", {
                "Connect": grpc.stream_stream_rpc_method_handler(
                    self.consumer.Connect,
                    request_deserializer=None,  # parsed in slices (consumer_service.py)
                    response_serializer=None)}),))
        # Storage.ReadEntries: a ledger's entries for brokers that cannot open its WAL
        self.service_names += add_storage_service(self.server, self.topics, self.memory)
        # Tables.ReadArrow: a topic's messages as Arrow record batches
        self.service_names += add_tables_service(self.server, self.topics, self.memory)
        for f in self.features:
            self.service_names += f.add_services(self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if self.config.grpc_reflection:
            reflection.enable_server_reflection(
                [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME],
                self.server)
        bound = (self.server.add_secure_port(self.config.url,
                                             self.config.tls.server_credentials())
                 if self.config.tls.enabled else self.server.add_insecure_port(self.config.url))
        if bound == 0:
            raise OSError(f"cannot bind {self.config.url}")
        await self._set_health(False)
        await asyncio.to_thread(object_store.check_root, self.storage.fs, self.storage.base,
                                self.storage.uri)  # an unreachable bucket: RootUnavailable
        if self.wal_objects is not None:
            await asyncio.to_thread(object_store.check_root, self.wal_objects.fs,
                                    self.wal_objects.base, self.wal_objects.uri_prefix)
        await self.storage.disk.probe()  # before anything is served: health tells the truth
        await self._start_http()  # a taken --metrics-port stops the start before gRPC serves
        await self.server.start()
        self.memory.start()
        await self.session.start()
        self.authz.start()  # follows the grants (when authorization is on)
        await self._create_defaults()
        self.topics.start()  # follows the namespaces' policies
        self.maintenance.start()
        for f in self.features:
            await f.start()
        if self.shedder is not None:
            self.shedder.start()
        self._health_task = asyncio.create_task(self._follow_health())
        self._probe_task = asyncio.create_task(self._probe_disk())
        self._started = True
        log.info("broker %s listening on %s (etcd %s, storage %s)", self.config.broker_id,
                 self.config.url, self.config.etcd, self.storage.uri)
        if self.http is not None:
            log.info("metrics on %s (health: /healthz, /readyz)", self.http.url)

    def _sources(self) -> list[Topic]:
        """The source topics loaded here: what load shedding may give up."""
        return [t for t in self.topics.loaded_topics() if t.writer is not None]

    async def _source_of(self, shadow: TopicName) -> TopicName | None:
        """The source of `shadow` (None: no such topic, or not a shadow)."""
        try:
            info = await self.topics.info(shadow)
        except errors.TopicNotFound:
            return None
        return TopicName.parse(info.source) if info.source else None

    async def _create_defaults(self) -> None:
        """`public/default`, once per cluster (source/metadata/tenants.py)."""
        try:
            await tenants.create_defaults(self.store)
        except errors.MetadataUnavailable as exc:  # the next broker to start does it
            log.warning("cannot create public/default now: %s", exc)

    def _disk_error(self) -> str:
        """Why the data disk takes no writes (its last error)."""
        err = self.storage.disk.error
        return err.message if err is not None else "not writable"

    async def _set_health(self, serving: bool, writable: bool = True) -> None:
        """Every service SERVING while `serving`; Producer only while `writable` too."""
        for name in ["", *self.service_names]:
            ok = serving and (writable or name != PRODUCER)
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING if ok
                                  else health_pb2.HealthCheckResponse.NOT_SERVING)

    async def _follow_health(self) -> None:
        state = None
        while True:
            now = (self.session.healthy.is_set(), self.storage.disk.writable)
            if now != state:
                state = now
                await self._set_health(*now)
                log.info("health: %s%s", "SERVING" if now[0] else "NOT_SERVING",
                         "" if now[1] else f" ({PRODUCER} NOT_SERVING: {self._disk_error()})")
            await asyncio.sleep(0.2)

    async def _probe_disk(self) -> None:
        """Probe the data disk every PROBE_INTERVAL seconds (health follows it)."""
        while True:
            await asyncio.sleep(disk.PROBE_INTERVAL)
            try:
                await self.storage.disk.probe()
            except Exception as exc:  # noqa: BLE001 - the next probe tries again
                log.warning("disk probe failed: %s", exc)

    def _disk_changed(self, err: errors.ShadowTopicError | None) -> None:
        """The disk takes writes again: seal what it kept from sealing, topic by topic."""
        if err is None:
            task = asyncio.get_running_loop().create_task(self._resume_writes())
            self._resuming.add(task)
            task.add_done_callback(self._resuming.discard)

    async def _resume_writes(self) -> None:
        for t in self.topics.loaded_topics():
            if t.writer is None:
                continue
            try:
                await t.writer.retry_seals()
            except Exception as exc:  # noqa: BLE001 - maintenance retries it
                log.warning("%s: sealing the ledgers kept open failed: %s", t.name, exc)

    async def stop(self, grace: float = 10.0) -> None:
        self._stopping = True
        for task in (self._health_task, self._probe_task, *self._resuming):
            if task is not None:
                task.cancel()
        await self._set_health(False)
        if self.server is not None:
            stopping = asyncio.create_task(self.server.stop(grace))
            await asyncio.sleep(0)  # new calls are refused from here on
            self.producer.shutdown()
            self.consumer.shutdown()
            await stopping
        await self.memory.close()
        if self.shedder is not None:
            await self.shedder.close()
        await self.maintenance.close()
        await self.authz.close()
        await self.topics.close()
        if self.wal_objects is not None:
            await self.wal_objects.close()
        for f in self.features:
            await f.close()
        await self.admin.owners.close()
        await self.session.stop(revoke=True)
        await self.store.close()
        if self.http is not None:
            await self.http.close()


async def serve(config: BrokerConfig, features: list[BrokerFeature]) -> None:
    broker = Broker(config, features)
    await check_etcd_access(broker.store)
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await broker.stop()


async def check_etcd_access(store: EtcdStore) -> None:
    """etcd refusing the broker's etcd user or password stops the start (`run` prints one
    `error:` line); etcd not answering yet does not (the lease is retried until it does)."""
    try:
        await store.check_access()
    except errors.MetadataUnavailable as exc:
        log.warning("etcd does not answer yet (%s); retrying", exc)


def _resolve_broker_id(config: BrokerConfig) -> None:
    """The broker's id from its data dir; when the disk cannot keep a new one (read-only,
    full), a fresh id for this run (the broker then waits out a dead incarnation's lease)."""
    try:
        config.resolve_broker_id()  # on OSError, the new id it made stays for this run
    except OSError as exc:
        log.warning("cannot keep broker id %s in %s: %s", config.broker_id, config.data_dir,
                    exc)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    run(parse_config(argv, "shadowtopic broker", "run one (source) broker"))


def run(cfg: BrokerConfig) -> None:
    """Assemble the broker with the features `cfg` names (every installed one by default)
    and serve until SIGTERM / SIGINT. The data dir is held (config.lock_data_dir) first: a
    second broker on it exits at once, naming the first."""
    lock_data_dir(cfg)  # held until this process exits
    features = feature.load(list(cfg.features) if cfg.features is not None else None)
    # A broker holds millions of long-lived objects (100,000 subscriptions, their cursors and
    # consumers): with the default thresholds the cycle collector walks them all again and
    # again (acks of a broadcast ran 2.5x slower). Young collections every 100,000
    # allocations instead of 700; cycles are rare here and still collected.
    gc.set_threshold(100_000, 50, 1000)
    try:
        if cfg.profile:
            import cProfile
            with cProfile.Profile() as prof:
                asyncio.run(serve(cfg, features))
            prof.dump_stats(cfg.profile)
        else:
            asyncio.run(serve(cfg, features))
    except (object_store.RootUnavailable, errors.MetadataUnauthenticated) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
