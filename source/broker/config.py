"""A broker's configuration: `BrokerConfig` and the command line that fills it.

Both broker entry points (`python -m source.broker.server`, `python -m shadow.broker`) take
the same flags; `--features` names the features the process is assembled with
(source/broker/feature.py).
"""
from __future__ import annotations

import argparse
import logging
import os
import uuid
from dataclasses import dataclass

from source.broker import memory
from source.core.argtypes import size
from source.ledger.entry_cache import DEFAULT_BYTES


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
    features: tuple[str, ...] | None = None  # broker features by name (None: all installed)
    # memory held for clients, all together, and the connection limits (broker/memory.py)
    client_memory_bytes: int = memory.DEFAULT_BYTES
    client_stall_seconds: float = memory.DEFAULT_STALL_SECONDS
    handshake_timeout: float = memory.DEFAULT_HANDSHAKE_SECONDS
    keepalive_interval: float = memory.DEFAULT_KEEPALIVE_SECONDS

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"

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
    p.add_argument("--features", default=None, metavar="NAMES",
                   help="comma-separated broker features to run (default: every installed "
                        "one: shadow, compaction); '' runs the broker core alone. Every "
                        "broker of a cluster runs the same features")
    p.add_argument("--profile", default=None, metavar="PATH",
                   help="run under cProfile and write its stats to PATH on exit (benchmarks)")
    a = p.parse_args(argv)
    if a.entry_cache_bytes < 0:
        p.error("--entry-cache-bytes must be 0 or more")
    if a.client_memory_bytes <= 0:
        p.error("--client-memory-bytes must be more than 0")
    for flag in ("client_stall_seconds", "handshake_timeout", "keepalive_interval"):
        if not getattr(a, flag) > 0:
            p.error(f"--{flag.replace('_', '-')} must be more than 0")
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = BrokerConfig(etcd=a.etcd, data_dir=a.data_dir, storage_root=a.storage_root,
                       host=a.host, port=a.port, cluster=a.cluster, lease_ttl=a.lease_ttl,
                       cursor_flush_interval=a.cursor_flush_interval,
                       retention_interval=a.retention_interval,
                       entry_cache_bytes=a.entry_cache_bytes, profile=a.profile,
                       client_memory_bytes=a.client_memory_bytes,
                       client_stall_seconds=a.client_stall_seconds,
                       handshake_timeout=a.handshake_timeout,
                       keepalive_interval=a.keepalive_interval,
                       features=None if a.features is None else
                       tuple(n for n in a.features.split(",") if n))
    if a.broker_id:
        cfg.broker_id = a.broker_id
    return cfg
