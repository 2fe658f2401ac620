"""Topics as Iceberg tables: the catalog, the tables' names, and what a reader of the catalog
sees (docs/TABLES.md). The compaction worker writes the tables (compaction/tables.py, with
compaction/iceberg.py); `shadowtopic tables` (source/cli/tables_cmd.py) reads them through
this module. pyiceberg is imported only when a catalog is opened (the worker with tables on,
the `tables` command), never when this module is imported.

**The catalog.** pyiceberg's SQL catalog by default: `--iceberg-catalog-uri` is an
SQLAlchemy URL, `sqlite:///<worker data dir>/iceberg-catalog.db` unless given (what the
standalone and `make run` use), `postgresql+psycopg2://user@host:5432/db` for a catalog
several machines share. `--iceberg-catalog-property KEY=VALUE` (repeated) passes any
property pyiceberg's `load_catalog` takes, so any catalog it speaks is one flag away
(`type=rest`, `uri=...`, `s3.endpoint=...`); pyiceberg's own configuration
(`~/.pyiceberg.yaml`, `PYICEBERG_CATALOG__<NAME>__<KEY>`) applies below the flags. The
catalog's name is `--iceberg-catalog-name` (default `shadowtopic`).

**Names.** A topic `persistent://<tenant>/<namespace>/<topic>` is the table
`(<tenant>, <namespace>, <topic>)`, its compacted state (one row per live key, and the deletes
kept for `delete_retention`); `(<tenant>, <namespace>, <topic>__log)` is its log (every
sealed ledger's rows). A partitioned topic is one table of each kind, with a `partition`
column (-1 for a topic that is not partitioned). Each level is escaped so the identifier
is the same whichever way a catalog joins or splits it: `=` becomes `=3D`, `.` becomes
`=2E` (a topic `orders.v2` is the table `orders=2Ev2`), and a topic whose name ends in
`__log` has its last `_` written `=5F`, so no topic's table is another topic's log.
"""
from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shadowtopic.core import errors
from shadowtopic.core.names import TopicName

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

#: the catalog's name when none is given (pyiceberg's configuration is looked up by it)
DEFAULT_CATALOG_NAME = "shadowtopic"
#: the SQLite catalog file in the worker's data dir (the default catalog)
CATALOG_FILE = "iceberg-catalog.db"
#: the URI that turns the worker's tables off
OFF = "off"
#: the log table's suffix
LOG_SUFFIX = "__log"
#: environment variable of the default catalog URI (below the flag and the config file)
URI_ENV = "SHADOWTOPIC_ICEBERG_CATALOG_URI"

_ESCAPES = {"=": "=3D", ".": "=2E"}
_UNESCAPE = re.compile(r"=([0-9A-F]{2})")


@dataclass(frozen=True)
class CatalogOptions:
    """How to reach the catalog: pyiceberg's `load_catalog(name, **properties())`."""

    uri: str | None
    properties: tuple[tuple[str, str], ...] = ()
    name: str = DEFAULT_CATALOG_NAME
    #: where new tables go (the storage root): pyiceberg's `warehouse` property
    warehouse: str | None = None

    @property
    def enabled(self) -> bool:
        return self.uri != OFF

    def catalog_properties(self) -> dict[str, str]:
        """The properties handed to pyiceberg: a SQL catalog at `uri` unless the properties
        say otherwise (their `type`, `uri`, ... win)."""
        props: dict[str, str] = {"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"}
        given = dict(self.properties)
        if self.uri and "uri" not in given:
            props["uri"] = self.uri
        if "type" not in given and ("uri" in props or self.uri):
            props["type"] = "sql"
        if self.warehouse and "warehouse" not in given:
            props["warehouse"] = self.warehouse
        props.update(given)
        return props

    def described(self) -> str:
        """The catalog in one line for logs and errors (a URL's password left out)."""
        uri = dict(self.properties).get("uri", self.uri or "")
        shown = re.sub(r"//([^:/@]+):[^@/]*@", r"//\1:***@", uri)
        return f"{self.name} ({shown})"


def sqlite_uri(path: str) -> str:
    """The SQLAlchemy URL of an SQLite catalog file."""
    return "sqlite:///" + os.path.abspath(path)


def add_arguments(p: argparse.ArgumentParser, default_help: str) -> None:
    """`--iceberg-catalog-uri`, `--iceberg-catalog-property`, `--iceberg-catalog-name`."""
    p.add_argument("--iceberg-catalog-uri", default=None, metavar="URL",
                   help="the Iceberg catalog: an SQLAlchemy URL of pyiceberg's SQL catalog, "
                        "e.g. postgresql+psycopg2://user@host:5432/db or sqlite:///PATH "
                        f"(default ${URI_ENV}, else {default_help})")
    p.add_argument("--iceberg-catalog-property", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="a property of pyiceberg's load_catalog (repeat for more), e.g. "
                        "type=rest, s3.endpoint=http://127.0.0.1:9000")
    p.add_argument("--iceberg-catalog-name", default=DEFAULT_CATALOG_NAME, metavar="NAME",
                   help="the catalog's name (pyiceberg's configuration is looked up by it; "
                        f"default {DEFAULT_CATALOG_NAME})")


def options_from(p: argparse.ArgumentParser, a: argparse.Namespace, default_uri: str | None,
                 warehouse: str | None = None) -> CatalogOptions:
    """The catalog options of parsed flags (a malformed property ends with `p.error`)."""
    props = []
    for item in a.iceberg_catalog_property:
        key, sep, value = str(item).partition("=")
        if not sep or not key:
            p.error(f"--iceberg-catalog-property {item!r}: expected KEY=VALUE")
        props.append((key, value))
    uri = a.iceberg_catalog_uri or os.environ.get(URI_ENV) or default_uri
    return CatalogOptions(uri, tuple(props), a.iceberg_catalog_name or DEFAULT_CATALOG_NAME,
                          warehouse)


def open_catalog(options: CatalogOptions) -> Catalog:
    """The catalog (blocking: pyiceberg connects). An SQLite catalog file that does not
    exist is created. Raises `CatalogUnavailable` when it cannot be opened."""
    from pyiceberg.catalog import load_catalog
    props = options.catalog_properties()
    uri = props.get("uri", "")
    if uri.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(uri[len("sqlite:///"):]) or ".", exist_ok=True)
    try:
        return load_catalog(options.name, **props)
    except Exception as exc:  # noqa: BLE001 - a driver missing, a server away, a bad URL
        raise errors.CatalogUnavailable(
            f"Iceberg catalog {options.described()}: {type(exc).__name__}: {exc}") from None


# ---- names -----------------------------------------------------------------------------------

def escape(level: str) -> str:
    """One level of an identifier: `=` and `.` escaped (injective, see the module doc)."""
    return "".join(_ESCAPES.get(c, c) for c in level)


def unescape(level: str) -> str:
    return _UNESCAPE.sub(lambda m: chr(int(m.group(1), 16)), level)


def _table_name(local: str) -> str:
    name = escape(local)
    if name.endswith(LOG_SUFFIX):  # never read as another topic's log
        name = name[:-len(LOG_SUFFIX)] + "_=5F" + LOG_SUFFIX[2:]
    return name


def namespace_of(topic: TopicName) -> tuple[str, str]:
    return escape(topic.tenant), escape(topic.namespace)


def table_identifier(topic: TopicName, log: bool = False) -> tuple[str, str, str]:
    """The identifier of a topic's compacted table (`log`: of its log table); a partition
    names its partitioned topic's table."""
    topic = topic.partitioned_parent or topic
    name = _table_name(topic.local)
    return (*namespace_of(topic), name + LOG_SUFFIX if log else name)


def topic_of(identifier: tuple[str, ...]) -> tuple[TopicName, bool] | None:
    """Inverse of `table_identifier`: (topic, is the log table), or None for a table that is
    not a topic's."""
    if len(identifier) != 3:
        return None
    tenant, namespace, name = identifier
    log = name.endswith(LOG_SUFFIX)
    if log:
        name = name[:-len(LOG_SUFFIX)]
    try:
        topic = TopicName.parse(f"{unescape(tenant)}/{unescape(namespace)}/{unescape(name)}")
    except errors.ShadowTopicError:
        return None
    return topic, log


# ---- reading the catalog ---------------------------------------------------------------------

def list_tables(catalog: Catalog) -> list[tuple[str, ...]]:
    """Every table of every namespace (two levels: tenant, namespace), sorted."""
    out: list[tuple[str, ...]] = []
    try:
        for (tenant, *_rest) in catalog.list_namespaces():
            for ns in catalog.list_namespaces((tenant,)):
                out.extend(tuple(t) for t in catalog.list_tables(ns))
    except Exception as exc:  # noqa: BLE001 - the catalog's own errors, drivers' errors
        raise errors.CatalogUnavailable(f"listing the Iceberg catalog: {exc}") from None
    return sorted(set(out))


def load_table(catalog: Catalog, identifier: tuple[str, ...]) -> Table:
    """The table, or `TableNotFound`."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
    try:
        return catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError):
        raise errors.TableNotFound(f"no Iceberg table {'.'.join(identifier)}") from None
    except Exception as exc:  # noqa: BLE001
        raise errors.CatalogUnavailable(
            f"loading Iceberg table {'.'.join(identifier)}: {exc}") from None


def summary(table: Table) -> dict[str, Any]:
    """One line about a table: its identifier, topic, kind, snapshot, rows, files."""
    ident = tuple(table.name())
    named = topic_of(ident)
    snap = table.current_snapshot()
    props = snap.summary.additional_properties if snap is not None and snap.summary else {}
    return {
        "table": ".".join(ident),
        "topic": str(named[0]) if named else None,
        "kind": ("log" if named[1] else "compacted") if named else None,
        "snapshot_id": snap.snapshot_id if snap is not None else None,
        "snapshots": len(table.metadata.snapshots),
        "rows": int(props.get("total-records", 0)),
        "files": int(props.get("total-data-files", 0)),
    }


def describe(table: Table) -> dict[str, Any]:
    """A table as `tables show` prints it: schema, partitioning, current snapshot (with its
    summary), every data file of it, rows."""
    out = summary(table)
    out["location"] = table.location()
    out["schema"] = [{"id": f.field_id, "name": f.name, "type": str(f.field_type),
                      "required": f.required} for f in table.schema().fields]
    out["partition_by"] = [f"{f.name} ({f.transform})" for f in table.spec().fields]
    snap = table.current_snapshot()
    files: list[dict[str, Any]] = []
    if snap is not None:
        out["current_snapshot"] = {
            "snapshot_id": snap.snapshot_id, "parent_id": snap.parent_snapshot_id,
            "timestamp_ms": snap.timestamp_ms,
            "operation": str(snap.summary.operation.value) if snap.summary else None,
            "summary": dict(snap.summary.additional_properties) if snap.summary else {},
        }
        for task in table.scan(snapshot_id=snap.snapshot_id).plan_files():
            f = task.file
            files.append({"path": f.file_path, "partition": f.partition[0] if len(
                f.partition) else None, "rows": f.record_count,
                "bytes": f.file_size_in_bytes})
    else:
        out["current_snapshot"] = None
    out["data_files"] = sorted(files, key=lambda f: str(f["path"]))
    return out
