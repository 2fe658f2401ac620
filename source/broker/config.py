"""A broker's configuration: `BrokerConfig` and the command line that fills it.

Both broker entry points (`python -m shadowtopic.broker`, `python -m
shadowtopic.shadow.broker`) take the same flags; `--features` names the features the
process is assembled with (source/broker/feature.py). Every flag is also a key of the
config file's section ([broker] or [shadow]) and an environment variable
(source/config_file.py); `--log-format` and `--log-level` set up logging (source/logs.py).
`--etcd-user`, `--etcd-password-file`, `--etcd-ca-file`, `--etcd-cert-file` and
`--etcd-key-file` say how it reaches etcd (etcd's auth, TLS: source/metadata/etcd_options.py).
A broker process holds its data dir (`<data-dir>/broker.lock`, source/dirlock.py): a second
broker on it is refused at once.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from shadowtopic import config_file, dirlock, logs
from shadowtopic.broker import memory
from shadowtopic.core.argtypes import size
from shadowtopic.ledger import object_store
from shadowtopic.ledger.dedup import DEFAULT_IDLE_S as DEDUP_IDLE_S
from shadowtopic.ledger.entry_cache import DEFAULT_BYTES
from shadowtopic.metadata import etcd_options
from shadowtopic.metadata.etcd_options import EtcdOptions
from shadowtopic.security import authentication, tls
from shadowtopic.security.dial import Dial, token_source


@dataclass
class BrokerConfig:
    etcd: str = "127.0.0.1:2379"
    # etcd's user and TLS to etcd (source/metadata/etcd_options.py); anonymous by default
    etcd_options: EtcdOptions = field(default_factory=EtcdOptions)
    data_dir: str = "./data"
    storage_root: str | None = None      # pyarrow URI; default <data_dir>/storage
    # open ledgers' WALs: <wal_dir>/wal/...; None: the root when local, else <data_dir>
    wal_dir: str | None = None
    s3: object_store.S3Options = field(default_factory=object_store.S3Options)
    # the WAL on object storage (source/ledger/object_wal.py): s3://BUCKET/PREFIX; None: the
    # local WAL (fsync). Its flush window and how old an object nothing names must be before
    # the sweep deletes it.
    wal: str | None = None
    wal_window_ms: float = 5.0
    wal_flushes: int = 4
    wal_gc_grace_seconds: float = 600.0
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
    features: tuple[str, ...] | None = None  # broker features by name (None: all installed)
    # memory held for clients, all together, and the connection limits (broker/memory.py)
    client_memory_bytes: int = memory.DEFAULT_BYTES
    client_stall_seconds: float = memory.DEFAULT_STALL_SECONDS
    handshake_timeout: float = memory.DEFAULT_HANDSHAKE_SECONDS
    keepalive_interval: float = memory.DEFAULT_KEEPALIVE_SECONDS
    # the HTTP endpoint (/metrics, /healthz, /readyz: source/observability/http.py):
    # None = port + 1000 (a free port when that one is taken), 0 = any free port, -1 = off
    metrics_port: int | None = None
    metrics_per_subscription: bool = False  # per-subscription series (many series)
    # idempotent producing: a producer idle this long is forgotten (source/ledger/dedup.py)
    dedup_idle_seconds: float = DEDUP_IDLE_S
    # a broker serving clearly more shadows (or, with the WAL on object storage, source
    # topics) than another gives one up this often (source/broker/shedding.py); 0: never
    load_shedding_interval: float = 0.0
    # TLS on its gRPC port and to other brokers (source/security/tls.py); off by default
    tls: tls.TlsOptions = field(default_factory=tls.TlsOptions)
    # who may call (source/security/authentication.py); off by default
    auth: authentication.AuthOptions = field(default_factory=authentication.AuthOptions)
    grpc_reflection: bool = False  # serve gRPC reflection (lists every service)

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"

    def dial(self) -> Dial:
        """How this broker dials other brokers: as it serves (TLS, its certificate), with
        its client token when it has one."""
        d = self.tls.dial()
        if self.auth.client_token_file:
            d = replace(d, token=token_source(Path(self.auth.client_token_file)))
        return d

    def resolve_broker_id(self) -> str:
        """A broker's id survives restarts on the same data dir, so a restarted broker takes
        back the topics its previous (dead) incarnation owned without waiting for the lease.
        A new id is written whole or not at all (a temp file, fsynced, renamed): a full disk
        never leaves an empty `broker.id` behind; an empty one counts as none. Raises
        `OSError` when a new id cannot be kept (the caller runs with it for this run)."""
        if not self.broker_id:
            path = os.path.join(self.data_dir, "broker.id")
            try:
                with open(path) as f:
                    self.broker_id = f.read().strip()
            except FileNotFoundError:
                pass
            if not self.broker_id:
                self.broker_id = f"broker-{uuid.uuid4().hex[:12]}"
                os.makedirs(self.data_dir, exist_ok=True)
                tmp = path + ".tmp"
                try:
                    with open(tmp, "w") as f:
                        f.write(self.broker_id + "\n")
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(tmp, path)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
        return self.broker_id


def parse_config(argv: list[str] | None, prog: str, description: str,
                 section: str = "broker") -> BrokerConfig:
    """The flags over the config file's `section` and the environment (config_file.py);
    sets up logging."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--etcd", default=os.environ.get("SHADOWTOPIC_ETCD", "127.0.0.1:2379"))
    etcd_options.add_arguments(p)
    p.add_argument("--data-dir", default="./data")
    p.add_argument("--storage-root", default=None, metavar="URI",
                   help="where ledgers and cursors live: a path, or an object store such as "
                        "s3://BUCKET/PREFIX (see --s3-endpoint); default <data-dir>/storage")
    p.add_argument("--wal-dir", default=None, metavar="DIR",
                   help="local directory holding open ledgers' write-ahead logs (under "
                        "DIR/wal/) until they are sealed into the storage root; default: the "
                        "storage root when it is a local path, else --data-dir")
    p.add_argument("--wal", default=None, metavar="URI",
                   help="keep open ledgers' write-ahead log on object storage, e.g. "
                        "s3://BUCKET/PREFIX (see --s3-endpoint): a produce is acknowledged "
                        "once its flush window's object is written and committed in etcd, so "
                        "losing this machine loses nothing acknowledged; default: the local "
                        "WAL (--wal-dir, fsync)")
    p.add_argument("--wal-window-ms", type=float, default=5.0, metavar="MS",
                   help="with --wal: how long a flush window gathers every topic's batches "
                        "into one object and one etcd transaction (default 5)")
    p.add_argument("--wal-flushes", type=int, default=4, metavar="N",
                   help="with --wal: flush windows written and committed at once (default 4; "
                        "1 for an object store that serves one PUT at a time)")
    p.add_argument("--wal-gc-grace-seconds", type=float, default=600.0, metavar="S",
                   help="with --wal: a WAL object no commit names is deleted once this old "
                        "(default 600; longer than any write-to-commit delay)")
    object_store.add_arguments(p)
    tls.add_arguments(p)
    authentication.add_arguments(p)
    p.add_argument("--grpc-reflection", action="store_true",
                   help="serve gRPC reflection (it lists every service to whoever asks)")
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
    p.add_argument("--client-memory-bytes", type=size, default=memory.DEFAULT_BYTES,
                   metavar="SIZE",
                   help="memory held for clients, all together (produce requests read and "
                        "not yet done, frames queued for consumer streams); at the cap new "
                        "produce requests and subscribes are refused with "
                        "RESOURCE_EXHAUSTED BrokerMemoryFull (default 1G)")
    p.add_argument("--client-stall-seconds", type=float,
                   default=memory.DEFAULT_STALL_SECONDS, metavar="SECONDS",
                   help="a consumer stream that takes none of its queued frames for this "
                        "long is cut (default 30)")
    p.add_argument("--handshake-timeout", type=float,
                   default=memory.DEFAULT_HANDSHAKE_SECONDS, metavar="SECONDS",
                   help="a connection that has not sent its HTTP/2 preface within this "
                        "long (a half-open one) is closed (default 10)")
    p.add_argument("--keepalive-interval", type=float,
                   default=memory.DEFAULT_KEEPALIVE_SECONDS, metavar="SECONDS",
                   help="ping every connection this often; one that does not answer "
                        "within 10 s is closed (default 30)")
    p.add_argument("--dedup-idle-seconds", type=float, default=DEDUP_IDLE_S, metavar="SECONDS",
                   help="idempotent producing: a producer that stored nothing on a topic for "
                        "this long is forgotten there, and a batch it sends after that is "
                        "new (Pulsar's brokerDeduplicationProducerInactivityTimeoutMinutes; "
                        "default 21600: 6 h)")
    p.add_argument("--load-shedding-interval", type=float, default=0.0, metavar="SECONDS",
                   help="a shadow broker that owns 2 or more topics more than the least "
                        "loaded live shadow broker gives up one shadow this often, so a "
                        "shadow broker that joins takes its share; a source broker with "
                        "--wal does the same with source topics among the source brokers "
                        "with --wal (default 0: never)")
    p.add_argument("--features", default=None, metavar="NAMES",
                   help="comma-separated broker features to run (default: every installed "
                        "one: shadow, compaction); '' runs the broker core alone. Every "
                        "broker of a cluster runs the same features")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="HTTP port of /metrics, /healthz and /readyz on --host (default: "
                        "--port + 1000, or a free port when that one is taken; 0: any free "
                        "port; -1: off). The URL is logged and kept in the broker's etcd "
                        "registration")
    p.add_argument("--metrics-per-subscription", action="store_true",
                   help="also export per-subscription series (one set per subscription: "
                        "off by default, as 100,000 subscriptions make 100,000 series each)")
    p.add_argument("--profile", default=None, metavar="PATH",
                   help="run under cProfile and write its stats to PATH on exit (benchmarks)")
    logs.add_arguments(p)
    config_file.add_arguments(p)
    a = config_file.parse(p, section, argv)
    if a.entry_cache_bytes < 0:
        p.error("--entry-cache-bytes must be 0 or more")
    if a.metrics_port is not None and not -1 <= a.metrics_port <= 65535:
        p.error("--metrics-port must be a port, 0 (any free port) or -1 (off)")
    if a.client_memory_bytes <= 0:
        p.error("--client-memory-bytes must be more than 0")
    for flag in ("client_stall_seconds", "handshake_timeout", "keepalive_interval",
                 "dedup_idle_seconds"):
        if not getattr(a, flag) > 0:
            p.error(f"--{flag.replace('_', '-')} must be more than 0")
    if a.wal is not None and "://" not in a.wal:
        p.error("--wal must be an object store URI such as s3://BUCKET/PREFIX")
    if a.wal_flushes < 1:
        p.error("--wal-flushes must be 1 or more")
    if a.wal_window_ms < 0:
        p.error("--wal-window-ms must be 0 or more")
    if not a.wal_gc_grace_seconds > 0:
        p.error("--wal-gc-grace-seconds must be more than 0")
    if a.load_shedding_interval < 0:
        p.error("--load-shedding-interval must be 0 (off) or more")
    s3 = object_store.options_from(p, a)
    etcd_access = etcd_options.options_from(p, a)
    tls_options = tls.options_from(p, a)
    auth_options = authentication.options_from(p, a, tls_options.require_client_cert)
    logs.setup_from(a)
    cfg = BrokerConfig(etcd=a.etcd, etcd_options=etcd_access, data_dir=a.data_dir,
                       storage_root=a.storage_root,
                       wal_dir=a.wal_dir, s3=s3, wal=a.wal or None,
                       wal_window_ms=a.wal_window_ms, wal_flushes=a.wal_flushes,
                       wal_gc_grace_seconds=a.wal_gc_grace_seconds,
                       host=a.host, port=a.port, cluster=a.cluster, lease_ttl=a.lease_ttl,
                       cursor_flush_interval=a.cursor_flush_interval,
                       retention_interval=a.retention_interval,
                       entry_cache_bytes=a.entry_cache_bytes, profile=a.profile,
                       client_memory_bytes=a.client_memory_bytes,
                       client_stall_seconds=a.client_stall_seconds,
                       handshake_timeout=a.handshake_timeout,
                       keepalive_interval=a.keepalive_interval,
                       metrics_port=a.metrics_port,
                       metrics_per_subscription=a.metrics_per_subscription,
                       dedup_idle_seconds=a.dedup_idle_seconds,
                       load_shedding_interval=a.load_shedding_interval,
                       tls=tls_options, auth=auth_options,
                       grpc_reflection=a.grpc_reflection,
                       features=None if a.features is None else
                       tuple(n for n in a.features.split(",") if n))
    if a.broker_id:
        cfg.broker_id = a.broker_id
    return cfg


#: the data dir locks this process holds (until it exits)
_held: list[dirlock.DirLock] = []


def lock_data_dir(cfg: BrokerConfig) -> dirlock.DirLock | None:
    """Hold the broker's data dir until this process exits; a dir another process holds
    ends this one with one `error:` line naming the holder. A dir that cannot be opened
    (read-only, full) is served unlocked, with a warning, as before."""
    try:
        lock = dirlock.acquire(cfg.data_dir, f"shadowtopic broker on port {cfg.port}",
                               dirlock.BROKER)
    except dirlock.DataDirInUse as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except OSError as exc:
        logging.getLogger("shadowtopic.broker").warning(
            "cannot lock the data dir %s: %s", cfg.data_dir, exc)
        return None
    _held.append(lock)
    return lock
