"""The compaction worker: one long-lived process with one warm SparkSession.

    python -m shadowtopic.compaction.worker --etcd HOST:PORT --port N [--spark-master local[*]]
                                [--spark-conf key=value ...] [--grace SECONDS]
                                [--max-concurrent-jobs N] [--keep-warm SECONDS]
                                [--config FILE] [--log-format json] [--spark-log PATH]
                                [--storage-root URI [--iceberg-catalog-uri URL]
                                 [--iceberg-catalog-property KEY=VALUE ...]]

It reaches etcd as `--etcd-user` (the `compaction` user of docs/SECURITY.md, "etcd"), with
TLS to etcd when given `--etcd-ca-file` (source/metadata/etcd_options.py); etcd refusing that
user or its password stops it at start with one `error:` line (exit 1).

Its flags are the keys of the config file's [worker] section (source/config_file.py); its
log lines are set up by source/logs.py, and Spark's own logging goes to `--spark-log`
(default <data-dir>/logs/spark.log) at `--spark-log-level` (WARN) (compaction/session.py).

It runs the jobs of its cluster's compaction requests (compaction/jobs.py: claim, plan,
Spark, commit, collect; a job that loses Spark workers runs again, `JOB_ATTEMPTS` times).
gRPC health (on --host:--port) says SERVING once Spark is up (its Python
workers warmed by a job over no files, run again every `--keep-warm` seconds while no job
runs: Spark stops a Python worker idle for a minute) and etcd answers, and follows Spark
from then on:
when Spark's JVM exits, health says NOT_SERVING and the worker exits (status 1) for its
supervisor to start a new one (the standalone does); a job it was running is not FAILED but
left to its request, which the next worker reruns (F15). HTTP on --metrics-port (default
--port + 1000; source/observability/http.py): `/metrics` (the job series of
compaction/metrics.py), `/healthz`, and `/readyz` (ready while SERVING and etcd answers).

Given `--storage-root` (the brokers' storage root; the standalone gives it), it also keeps
every source topic's Iceberg tables, the compacted state and the log, in the catalog of
`--iceberg-catalog-uri` (default: SQLite, `<data-dir>/iceberg-catalog.db`; `off`: no
tables), following etcd (compaction/tables.py, docs/TABLES.md). Without it there are no
tables: the worker cannot know where the brokers' ledgers are.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector

from shadowtopic import config_file, logs
from shadowtopic.compaction import spark_job
from shadowtopic.compaction.jobs import WARM_EVERY, Worker, spark_gateway
from shadowtopic.compaction.metrics import CompactionMetrics, WorkerReadiness
from shadowtopic.compaction.session import build_session
from shadowtopic.ledger import object_store
from shadowtopic.metadata import EtcdStore, MetadataUnavailable, etcd_options
from shadowtopic.metadata.base import MetadataUnauthenticated
from shadowtopic.observability.http import OFF, HttpEndpoint, default_port
from shadowtopic.security import tls
from shadowtopic.tables import CATALOG_FILE, sqlite_uri
from shadowtopic.tables import add_arguments as add_catalog_arguments
from shadowtopic.tables import options_from as catalog_options_from

log = logging.getLogger("shadowtopic.compaction.worker")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="shadowtopic compaction-worker",
                                description="run the compaction worker (one warm SparkSession)")
    p.add_argument("--etcd", default=os.environ.get("SHADOWTOPIC_ETCD", "127.0.0.1:2379"))
    etcd_options.add_arguments(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=6660, help="gRPC health port")
    p.add_argument("--data-dir", default="./data", help="Spark's local scratch space")
    p.add_argument("--cluster", default="standalone",
                   help="compact the topics of this cluster's brokers")
    p.add_argument("--worker-id", default=None)
    p.add_argument("--spark-master", default="local[*]")
    p.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--grace", type=float, default=60.0,
                   help="seconds a replaced compacted ledger stays for its readers")
    p.add_argument("--lease-ttl", type=int, default=10)
    p.add_argument("--relist", type=float, default=5.0)
    p.add_argument("--max-concurrent-jobs", type=int, default=1, metavar="N",
                   help="compactions run at once, each of its own topic (default 1); with a "
                        "Spark cluster of many cores, several small jobs share its cores")
    p.add_argument("--keep-warm", type=float, default=WARM_EVERY, metavar="SECONDS",
                   help="while no job runs, run a Spark job over no files this often: Spark "
                        "stops a Python worker idle for a minute and the next compaction "
                        f"pays for starting new ones (default {WARM_EVERY:g}; 0: off)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="HTTP port of /metrics, /healthz and /readyz on --host (default: "
                        "--port + 1000, or a free port when that one is taken; 0: any free "
                        "port; -1: off)")
    p.add_argument("--storage-root", default=None, metavar="URI",
                   help="the brokers' storage root: keep the Iceberg tables of the topics "
                        "whose ledgers are there (it is their warehouse); default: no tables")
    add_catalog_arguments(p, f"sqlite:///<data-dir>/{CATALOG_FILE}; 'off': no tables")
    object_store.add_arguments(p)
    tls.add_arguments(p)
    p.add_argument("--spark-log", default=None, metavar="PATH",
                   help="Spark's own log (log4j, its JVM's and Python workers' output; "
                        "default <data-dir>/logs/spark.log; '-': this worker's output)")
    p.add_argument("--spark-log-level", type=str.upper, default="WARN",
                   choices=["ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF"],
                   help="Spark's log level (default WARN)")
    logs.add_arguments(p)
    config_file.add_arguments(p)
    a = config_file.parse(p, "worker", argv)
    for item in a.spark_conf:
        if "=" not in item:
            p.error(f"--spark-conf {item!r}: expected KEY=VALUE")
    if a.keep_warm < 0:
        p.error(f"--keep-warm must be 0 (off) or more seconds, got {a.keep_warm:g}")
    if a.max_concurrent_jobs < 1:
        p.error(f"--max-concurrent-jobs must be at least 1, got {a.max_concurrent_jobs}")
    a.s3 = object_store.options_from(p, a)
    a.tls = tls.options_from(p, a)
    a.etcd_options = etcd_options.options_from(p, a)
    a.catalog = catalog_options_from(
        p, a, sqlite_uri(os.path.join(a.data_dir, CATALOG_FILE)),
        warehouse=a.storage_root if a.storage_root is None or "://" in a.storage_root
        else os.path.abspath(a.storage_root))
    return a


async def serve(a: argparse.Namespace) -> None:
    # Spark's JVM is launched (a fork that runs Python in the child) before gRPC has threads:
    # forked beside gRPC's threads, it once exited before it answered
    conf = dict(item.split("=", 1) for item in a.spark_conf)
    conf.setdefault("spark.local.dir", os.path.join(os.path.abspath(a.data_dir), "spark"))
    spark_log = a.spark_log or os.path.join(os.path.abspath(a.data_dir), "logs", "spark.log")
    spark = await asyncio.to_thread(start_spark, a.spark_master, conf,
                                    log_path=None if spark_log == "-" else spark_log,
                                    log_level=a.spark_log_level)
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    tls_options: tls.TlsOptions = a.tls
    url = f"{a.host}:{a.port}"
    bound = (server.add_secure_port(url, tls_options.server_credentials())
             if tls_options.enabled else server.add_insecure_port(url))
    if bound == 0:
        stop_spark(spark)
        raise OSError(f"cannot bind {a.host}:{a.port}")
    await servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.start()
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    metrics = CompactionMetrics(a.cluster, registry)
    readiness = WorkerReadiness()
    http = None
    if a.metrics_port != OFF:
        http = HttpEndpoint(registry, readiness.not_ready, a.host,
                            default_port(a.port) if a.metrics_port is None else a.metrics_port,
                            fallback=a.metrics_port is None)
        await http.start()
        log.info("metrics on %s (health: /healthz, /readyz)", http.url)
    await asyncio.to_thread(spark_job.warm_up, spark)
    store = EtcdStore(a.etcd, options=a.etcd_options)
    worker = Worker(store, spark, a.cluster, a.worker_id or f"{socket.gethostname()}:{a.port}",
                    grace=a.grace, lease_ttl=a.lease_ttl, relist=a.relist, metrics=metrics,
                    s3=a.s3, scratch_dir=a.data_dir, tables=table_keeper(a, store),
                    max_concurrent_jobs=a.max_concurrent_jobs,
                    warm_every=a.keep_warm or None)
    while True:
        try:
            await worker.start()
            break
        except MetadataUnavailable:
            await asyncio.sleep(0.5)
        except MetadataUnauthenticated:  # main prints it: Spark goes first
            stop_spark(spark)
            raise
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    readiness.worker = worker
    log.info("compaction worker %s ready (spark %s, etcd %s, health %s:%d)", worker.worker_id,
             a.spark_master, a.etcd, a.host, a.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    waits = [loop.create_task(stop.wait()), loop.create_task(worker.lost.wait()),
             loop.create_task(follow_spark(worker))]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in waits:
        task.cancel()
    await servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    readiness.stopping = True
    await worker.close()
    await server.stop(2)
    if http is not None:
        await http.close()
    await store.close()
    try:
        stop_spark(spark)
    except Exception as exc:  # noqa: BLE001 - a JVM that is gone cannot be stopped
        log.info("stopping Spark: %s", exc)
    if worker.lost.is_set():
        raise SystemExit(1)  # for the supervisor to start a worker with a new JVM


def table_keeper(a: argparse.Namespace, store: EtcdStore):
    """The Iceberg tables' keeper (compaction/tables.py), or None when they are off: no
    `--storage-root`, or `--iceberg-catalog-uri off`. pyiceberg is imported only then."""
    if a.storage_root is None or not a.catalog.enabled:
        log.info("Iceberg tables off (%s)", "--iceberg-catalog-uri off" if a.storage_root
                 else "no --storage-root")
        return None
    from shadowtopic.compaction.tables import TableKeeper
    from shadowtopic.ledger.storage import Storage
    local = "://" not in a.storage_root or a.storage_root.startswith("file://")
    storage = Storage(a.storage_root, None if local else os.path.abspath(a.data_dir), a.s3)
    return TableKeeper(store, a.catalog, storage, a.storage_root, a.grace, a.s3)


async def follow_spark(worker: Worker, interval: float = 1.0) -> None:
    """Health follows Spark: the JVM gone, the worker is lost (F15)."""
    while worker.spark_alive():
        await asyncio.sleep(interval)
    log.error("Spark's JVM exited: this worker runs no more jobs; exiting for the supervisor "
              "to start a new one")
    worker.lost.set()


def start_spark(master: str, conf: dict[str, str], attempts: int = 2, **logging_to):
    """`build_session`, started once more when Spark's JVM exits before it answers
    (JAVA_GATEWAY_EXITED: a JVM that did not come up; seen in loaded test runs)."""
    for attempt in range(1, attempts + 1):
        try:
            return build_session(master, conf, **logging_to)
        except Exception as exc:  # noqa: BLE001 - pyspark's error condition tells which
            if attempt == attempts or _condition(exc) != "JAVA_GATEWAY_EXITED":
                raise
            log.warning("Spark's JVM exited while starting (%s); starting it again", exc)


def _condition(exc: Exception) -> str | None:
    """A pyspark error's condition (None for any other error)."""
    from pyspark.errors import PySparkException
    if not isinstance(exc, PySparkException):
        return None
    # pyspark 4 names it getCondition; 3.5 has getErrorClass only (deprecated in 4)
    get = getattr(exc, "getCondition", None) or exc.getErrorClass
    return get()


def stop_spark(spark) -> None:
    """Stop the session and its JVM now (the JVM would otherwise exit only when it notices
    this process is gone)."""
    gateway = spark_gateway()
    proc = getattr(gateway, "proc", None)  # a gateway that launched no JVM has none
    spark.stop()
    if gateway is not None:
        gateway.shutdown()
    if proc is not None:
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: kill it
            proc.kill()


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    logs.setup_from(a)
    try:
        asyncio.run(serve(a))
    except MetadataUnauthenticated as exc:  # a wrong etcd user or password
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
