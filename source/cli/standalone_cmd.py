"""`shadowtopic standalone`: its flags, which are also the keys of the config file's
[standalone] section (source/config_file.py), and the command.

The flags are parsed here, over the config file and the environment, not by the CLI's main
parser (which lists the command and its flags for --help). `--config FILE`, `--log-format`
and `--log-level` are passed on to every role it starts; each role reads its own section of
the file. The launcher itself (source/standalone.py) is imported only when it runs.
"""
from __future__ import annotations

import argparse

from shadowtopic import config_file
from shadowtopic.core.argtypes import size

SECTION = "standalone"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", default="./data")
    p.add_argument("--wipe-data", action="store_true", help="delete the data dir first")
    p.add_argument("--port", type=int, default=6650)
    p.add_argument("--shadow-port", type=int, default=None,
                   help="the shadow broker's port (default --port + 1)")
    p.add_argument("--compaction-port", type=int, default=None,
                   help="the compaction worker's gRPC health port (default --port + 2)")
    p.add_argument("--no-compaction", action="store_true",
                   help="start no compaction worker (no Java needed; `topics compact` "
                        "requests wait until a worker of the cluster runs)")
    p.add_argument("--spark-master", default=None,
                   help="the compaction worker's Spark master (default local[*])")
    p.add_argument("--secure", action="store_true",
                   help="TLS on every port, token authentication and authorization (the "
                        "admin token is a superuser's) and etcd's auth, with a CA, "
                        "certificates, tokens and etcd passwords it makes under "
                        "<data-dir>/security (kept across restarts; printed at start)")
    p.add_argument("--etcd-port", type=int, default=2379)
    p.add_argument("--etcd-peer-port", type=int, default=None,
                   help="etcd's peer port (default --etcd-port + 1)")
    p.add_argument("--entry-cache-bytes", type=size, default=None, metavar="SIZE",
                   help="the broker's memory for entries, all topics together (default 256M)")
    p.add_argument("--log-format", choices=("console", "json"), default=None,
                   help="every role's log format, console or json (default: each role's "
                        "config, else console)")
    p.add_argument("--log-level", type=str.upper, default=None,
                   choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
                   help="every role's log level (default: each role's config, else INFO)")
    p.add_argument("--spark-log-level", type=str.upper, default=None,
                   choices=("ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF"),
                   help="Spark's log level in <data-dir>/logs/spark.log (default WARN)")
    config_file.add_arguments(p)


def parse(argv: list[str], parser_class: type[argparse.ArgumentParser]) -> argparse.Namespace:
    """`shadowtopic standalone ARGV...` over the config file and the environment."""
    p = parser_class(prog="shadowtopic standalone",
                     description="run etcd, a source broker, a shadow broker and a compaction "
                                 "worker on one data dir")
    add_arguments(p)
    args = config_file.parse(p, SECTION, argv)
    args.func = run
    args.url, args.output, args.operation_timeout = None, "table", None
    return args


def run(args: argparse.Namespace) -> int:
    from shadowtopic import standalone as sa
    return sa.run(args.data_dir, args.wipe_data, args.port, args.etcd_port,
                  etcd_peer_port=args.etcd_peer_port, shadow_port=args.shadow_port,
                  compaction_port=args.compaction_port,
                  worker_args=["--spark-master", args.spark_master] if args.spark_master else [],
                  broker_args=[] if args.entry_cache_bytes is None
                  else ["--entry-cache-bytes", str(args.entry_cache_bytes)],
                  config=args.config, log_format=args.log_format, log_level=args.log_level,
                  spark_log_level=args.spark_log_level, compaction=not args.no_compaction,
                  secure=args.secure)
