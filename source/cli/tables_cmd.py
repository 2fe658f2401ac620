"""`shadowtopic tables`: the topics' Iceberg tables, as the compaction worker keeps them
(docs/TABLES.md; names and the catalog: source/tables.py).

    shadowtopic tables list [--iceberg-catalog-uri URL] [--iceberg-catalog-property K=V ...]
                            [--data-dir DIR] [-o table|json]
    shadowtopic tables show <topic> [--log] [same catalog flags] [-o table|json]

The catalog is read directly (no broker is asked): `--iceberg-catalog-uri` as the worker was
given it, else $SHADOWTOPIC_ICEBERG_CATALOG_URI, else the standalone's SQLite catalog
`<data-dir>/compaction-worker/iceberg-catalog.db` (`--data-dir`, default ./data: what `make
run` writes). `list` prints one row per table: its name, topic, kind (compacted or log),
current snapshot, number of snapshots, rows and data files. `show` prints one table (the
topic's compacted table; `--log`: its log table): location, partitioning, the current
snapshot and its summary, the schema, and every data file with its partition, rows and size.
A topic without such a table: one `error: TableNotFound: ...` line, exit 1; a catalog that
cannot be read: `error: CatalogUnavailable: ...`.

pyiceberg is imported when one of these commands runs, never by other commands.
"""
from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from shadowtopic.cli.output import emit, fail
from shadowtopic.core.names import TopicName
from shadowtopic.tables import (
    CATALOG_FILE,
    CatalogOptions,
    add_arguments,
    options_from,
    sqlite_uri,
)

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog


def add_parser(sub: Any) -> None:
    """`tables ...` under the CLI's subcommands."""
    group = sub.add_parser("tables", help="the topics' Iceberg tables (compacted state and "
                                          "log), read from the catalog")
    actions = group.add_subparsers(dest="action", required=True)
    p = actions.add_parser("list", help="every topic table in the catalog")
    _catalog_flags(p)
    p.set_defaults(func=list_tables)
    p = actions.add_parser("show", help="one topic's table: schema, current snapshot, files, "
                                        "rows")
    p.add_argument("topic", help="the topic (a partitioned topic: its one table)")
    p.add_argument("--log", action="store_true",
                   help="the topic's log table (<topic>__log) rather than its compacted table")
    _catalog_flags(p)
    p.set_defaults(func=show_table)


def _catalog_flags(p: argparse.ArgumentParser) -> None:
    add_arguments(p, f"<data-dir>/compaction-worker/{CATALOG_FILE}")
    p.add_argument("--data-dir", default="./data",
                   help="the standalone's data dir, for the default catalog (default ./data)")
    p.add_argument("-o", "--output", choices=["table", "json"], default=argparse.SUPPRESS,
                   help="table (default) or json")
    p.set_defaults(parser=p)


def _options(args: argparse.Namespace) -> CatalogOptions:
    path = os.path.join(args.data_dir, "compaction-worker", CATALOG_FILE)
    opts = options_from(args.parser, args, sqlite_uri(path))
    uri = dict(opts.properties).get("uri", opts.uri or "")
    if uri.startswith("sqlite:///") and not os.path.exists(uri[len("sqlite:///"):]):
        fail(f"no Iceberg catalog at {uri[len('sqlite:///'):]} (the compaction worker "
             "creates it; give --iceberg-catalog-uri, or --data-dir of the standalone)")
    return opts


def _catalog(args: argparse.Namespace) -> Catalog:
    from shadowtopic.tables import open_catalog
    return open_catalog(_options(args))


def list_tables(args: argparse.Namespace) -> int:
    from shadowtopic import tables
    catalog = _catalog(args)
    rows = [tables.summary(tables.load_table(catalog, ident))
            for ident in tables.list_tables(catalog) if tables.topic_of(ident) is not None]
    emit(rows, args.output, columns=["table", "topic", "kind", "snapshot_id", "snapshots",
                                     "rows", "files"])
    return 0


def show_table(args: argparse.Namespace) -> int:
    from shadowtopic import tables
    topic = TopicName.parse(args.topic)
    catalog = _catalog(args)
    info = tables.describe(tables.load_table(catalog, tables.table_identifier(topic, args.log)))
    if args.output == "json":
        emit(info, "json")
        return 0
    head = {k: v for k, v in info.items() if k not in ("schema", "data_files",
                                                      "current_snapshot")}
    snap = info.get("current_snapshot") or {}
    head.update({f"snapshot.{k}": v for k, v in snap.items() if k != "summary"})
    head.update({f"summary.{k}": v for k, v in (snap.get("summary") or {}).items()})
    emit(head, "table")
    emit(info["schema"], "table", columns=["id", "name", "type", "required"])
    emit(info["data_files"], "table", columns=["path", "partition", "rows", "bytes"])
    return 0
