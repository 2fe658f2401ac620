"""The write side of the topics' Iceberg tables (docs/TABLES.md): their schema and
partitioning, data files described from the ledger files where they lie (never copied,
never rewritten: Iceberg's metadata points at the sealed and compacted ledgers), the
snapshots a change commits, and which snapshots expire. The one module that calls
pyiceberg's write API, behind typed functions; compaction/tables.py decides what to commit
and when, source/tables.py names the tables and opens the catalog.

**Schema.** The columns of a ledger file (format 2, source/columns.py and docs/FORMAT.md),
all optional, with fixed field ids, plus `partition` (int: the partition index, -1 for a
topic that is not partitioned), which no file holds: the tables are partitioned by identity
on it, so each data file's manifest entry carries its value and readers fill the column
from there (the Iceberg spec's rule for identity partition columns missing from a file).
The files carry no Iceberg field ids; the tables' name mapping (`schema.name-mapping.default`)
maps their columns by name. A format-1 file (column `raw`, sealed before format 2) adds the
optional column `raw` to its table by schema evolution the first time one comes: its rows
read `raw` and null `payload`, `head`, ...; format-2 rows read `raw` null.

**Snapshots.** `replace` is a compaction's one snapshot (operation `overwrite`): the
partition's previous compacted files deleted and the new ones appended in one commit.
`change_log` is a log table's: the ledgers retention, truncate or a delete removed
(operation `delete`, by the files' `ledger_id`: whole files only, never a rewrite) and the
ledgers sealed since (`append`, merging the table's manifests once they are more than 20, so
a table of many ledgers is read from few manifests), in one commit. A commit is tried once
(the tables say `commit.retry.num-retries = 0`): on a conflict (another writer committed
first) the caller plans again from the table as it then is, so a retry never adds a file
twice.

**Expiry** (`expire`): a snapshot other than the current one is expired when it refers to a
file a later snapshot removed and that removal is `grace` seconds old, or at once when the
file is one about to be deleted (`doomed`: the worker is collecting that compacted ledger),
or when it is older than the table's `history.expire.max-snapshot-age-ms` (default one day)
or beyond its newest `shadowtopic-max-snapshots` (default 100). The manifests and
manifest lists only expired snapshots used are deleted with them; old `metadata.json`
files go as pyiceberg commits (`write.metadata.delete-after-commit.enabled`). Data files
are never deleted here: brokers delete sealed ledgers, the worker compacted ones.
"""
from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import pyarrow.parquet as pq

from shadowtopic.columns import version
from shadowtopic.core import errors

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.manifest import DataFile
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

log = logging.getLogger(__name__)
_LONG = struct.Struct("<q")


class _NoMissingStatistics(logging.Filter):
    """pyiceberg warns of every column a ledger file keeps no statistics for (by design:
    source/ledger/sealed.py writes them for the id and time columns only), once per file."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("PyArrow statistics missing")


logging.getLogger("pyiceberg.io.pyarrow").addFilter(_NoMissingStatistics())

#: the partition column (and the value of a topic that is not partitioned)
PARTITION = "partition"
NOT_PARTITIONED = -1
RAW = "raw"
#: the table properties of every topic table (pyiceberg's and Iceberg's names)
TABLE_PROPERTIES = {
    "format-version": "2",
    "commit.retry.num-retries": "0",
    # a log table gains a manifest per seal: merged past 20, so a pass reads few manifests
    "commit.manifest-merge.enabled": "true",
    "commit.manifest.min-count-to-merge": "20",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "10",
    "history.expire.max-snapshot-age-ms": str(24 * 3600 * 1000),
    "history.expire.min-snapshots-to-keep": "1",
    "shadowtopic-max-snapshots": "100",
}
#: snapshot summary properties this module writes
JOB_ID = "shadowtopic-job-id"
HORIZON = "shadowtopic-horizon"
PARTITIONS = "shadowtopic-partitions"


def schema() -> Schema:
    """The table schema (field ids fixed: docs/TABLES.md). They are the ids a catalog
    assigns afresh when it creates the table (top-level fields first, then the map's key
    and value), so the name mapping made from this schema is the table's."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BinaryType,
        BooleanType,
        IntegerType,
        LongType,
        MapType,
        NestedField,
        StringType,
    )
    return Schema(
        NestedField(1, "ledger_id", LongType(), required=False),
        NestedField(2, "entry_id", LongType(), required=False),
        NestedField(3, "key", BinaryType(), required=False),
        NestedField(4, "is_tombstone", BooleanType(), required=False),
        NestedField(5, "publish_time", LongType(), required=False,
                    doc="ms since the epoch, assigned by the broker"),
        NestedField(6, "payload", BinaryType(), required=False,
                    doc="as stored: compressed when `compression` says so"),
        NestedField(7, "properties", MapType(15, StringType(), 16, StringType(),
                                             value_required=False), required=False),
        NestedField(8, "event_time", LongType(), required=False,
                    doc="ms since the epoch; null when the producer set none"),
        NestedField(9, "producer_name", StringType(), required=False),
        NestedField(10, "sequence_id", LongType(), required=False),
        NestedField(11, "compression", StringType(), required=False),
        NestedField(12, "head", BinaryType(), required=False),
        NestedField(13, "tail", BinaryType(), required=False),
        NestedField(14, PARTITION, IntegerType(), required=False,
                    doc="the partition; -1: the topic is not partitioned"),
    )


def partition_spec() -> PartitionSpec:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform
    return PartitionSpec(PartitionField(source_id=14, field_id=1000,
                                        transform=IdentityTransform(), name=PARTITION))


def open_table(catalog: Catalog, identifier: tuple[str, str, str], location: str,
               properties: Mapping[str, str]) -> Table:
    """The table, created (with its namespace) when it does not exist."""
    from pyiceberg.exceptions import (
        NamespaceAlreadyExistsError,
        NoSuchTableError,
        TableAlreadyExistsError,
    )
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        pass
    try:
        catalog.create_namespace(identifier[:2])
    except NamespaceAlreadyExistsError:
        pass
    sch = schema()
    try:
        table = catalog.create_table(
            identifier, sch, location=location, partition_spec=partition_spec(),
            properties={**TABLE_PROPERTIES, **properties,
                        "schema.name-mapping.default": sch.name_mapping.model_dump_json()})
    except TableAlreadyExistsError:  # another writer created it meanwhile
        return catalog.load_table(identifier)
    if table.schema().name_mapping != sch.name_mapping:
        raise errors.Internal(f"{'.'.join(identifier)}: the catalog gave the schema other "
                              "field ids than its name mapping's")
    return table


def drop_table(catalog: Catalog, identifier: tuple[str, str, str]) -> bool:
    """Drop the table from the catalog (its files stay: the caller deletes its metadata
    directory); False when there was none."""
    from pyiceberg.exceptions import NoSuchTableError
    try:
        catalog.drop_table(identifier)
    except NoSuchTableError:
        return False
    return True


# ---- data files ------------------------------------------------------------------------------

@dataclass(frozen=True)
class LedgerFile:
    """A ledger file as a table wants it: where it is, its partition, and the range of its
    `ledger_id` column as etcd knows it (the ledger of a sealed file; a compacted file's
    first and last ids): the file's footer has no statistics for that column, and readers
    (and `change_log`'s delete) prune files by it."""

    path: str
    partition: int
    ledgers: tuple[int, int] | None = None


def current_files(table: Table) -> dict[str, DataFile]:
    """The data files of the table's current snapshot, by path."""
    snap = table.current_snapshot()
    if snap is None:
        return {}
    out: dict[str, DataFile] = {}
    for manifest in snap.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            out[entry.data_file.file_path] = entry.data_file
    return out


def partition_of(data_file: DataFile) -> int:
    value = data_file.partition[0] if len(data_file.partition) else None
    return NOT_PARTITIONED if value is None else int(value)


def file_format(table: Table, path: str) -> int:
    """The ledger format of a file (its footer's `shadowtopic_format`, source/columns.py).
    Raises FileNotFoundError when it is not there."""
    with table.io.new_input(path).open() as stream:
        return version(pq.read_metadata(stream).schema.to_arrow_schema())


def ensure_raw_column(table: Table) -> Table:
    """Add the optional column `raw` (format-1 files) when the table lacks it."""
    from pyiceberg.types import BinaryType
    if RAW in table.schema().column_names:
        return table
    with table.update_schema() as update:
        update.add_column(RAW, BinaryType(), doc="format 1: the serialized Message")
    log.info("%s: column `raw` added for ledger files of format 1", ".".join(table.name()))
    return table


def data_file(table: Table, f: LedgerFile) -> DataFile:
    """The Iceberg description of one ledger file: counts, sizes and bounds from its
    footer, its partition value. Raises FileNotFoundError when it is not there."""
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record
    source = table.io.new_input(f.path)
    with source.open() as stream:
        meta = pq.read_metadata(stream)
    sch = table.schema()
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=meta,
        stats_columns=compute_statistics_plan(sch, table.metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(sch)).to_serialized_dict()
    if f.ledgers is not None:  # field 1, ledger_id: Iceberg's single-value form of a long
        field_id = sch.find_field("ledger_id").field_id
        stats["lower_bounds"][field_id] = _LONG.pack(f.ledgers[0])
        stats["upper_bounds"][field_id] = _LONG.pack(f.ledgers[1])
        stats["null_value_counts"][field_id] = 0
        stats["value_counts"][field_id] = meta.num_rows
    return DataFile.from_args(
        content=DataFileContent.DATA, file_path=f.path, file_format=FileFormat.PARQUET,
        partition=Record(f.partition), file_size_in_bytes=len(source), sort_order_id=None,
        spec_id=table.metadata.default_spec_id, equality_ids=None, key_metadata=None,
        **stats)


# ---- commits ---------------------------------------------------------------------------------

def _committed(op: Callable[[], None], what: str) -> None:
    """Run a commit; a conflict (another writer committed first) or any other catalog
    failure becomes `CatalogUnavailable`: the caller plans again later."""
    from pyiceberg.exceptions import CommitFailedException
    try:
        op()
    except CommitFailedException as exc:
        raise errors.CatalogUnavailable(f"{what}: a concurrent commit won ({exc}); "
                                        "planning again") from None
    except errors.ShadowTopicError:
        raise
    except (FileNotFoundError, OSError):
        raise
    except Exception as exc:  # noqa: BLE001 - drivers' and pyiceberg's own errors
        raise errors.CatalogUnavailable(f"{what}: {type(exc).__name__}: {exc}") from None


def replace(table: Table, adds: Iterable[DataFile], removes: Iterable[DataFile],
            properties: Mapping[str, str]) -> None:
    """One snapshot that deletes `removes` and appends `adds` (a compaction's)."""
    adds, removes = list(adds), list(removes)

    def commit() -> None:
        tx = table.transaction()
        with tx.update_snapshot(snapshot_properties=dict(properties)).overwrite() as op:
            for f in removes:
                op.delete_data_file(f)
            for f in adds:
                op.append_data_file(f)
        tx.commit_transaction()

    _committed(commit, f"{'.'.join(table.name())}: replacing {len(removes)} files by "
                       f"{len(adds)}")


def _ledger_in(ids: list[int]) -> BooleanExpression:
    """`ledger_id IN ids` (pyiceberg's `In` is a pydantic model whose `__new__` mypy does
    not see through: called as the callable it is)."""
    from pyiceberg.expressions import In
    make = cast("Callable[[str, list[int]], BooleanExpression]", In)
    return make("ledger_id", ids)


def change_log(table: Table, adds: Iterable[DataFile], removed_ledgers: Iterable[int],
               properties: Mapping[str, str]) -> None:
    """One commit: the files of `removed_ledgers` deleted (a `delete` snapshot: whole
    files), then `adds` appended (an `append` snapshot)."""
    adds, removed = list(adds), sorted(set(removed_ledgers))
    name = ".".join(table.name())

    def commit() -> None:
        tx = table.transaction()
        if removed:
            with tx.update_snapshot(snapshot_properties=dict(properties)).delete() as op:
                op.delete_by_predicate(_ledger_in(removed))
                if op.rewrites_needed:  # a file with other ledgers' rows too: never rewrite
                    raise errors.Internal(f"{name}: deleting ledgers {removed[:5]}... would "
                                          "rewrite a data file")
        if adds:
            with tx.update_snapshot(snapshot_properties=dict(properties)).merge_append() as ap:
                for f in adds:
                    ap.append_data_file(f)
        tx.commit_transaction()

    _committed(commit, f"{name}: {len(adds)} ledgers added, {len(removed)} removed")


# ---- expiry ----------------------------------------------------------------------------------

@dataclass
class History:
    """What expiry learns of a table's snapshots (immutable, so read once per process): per
    snapshot, the files it removed (path, sequence number of the file) and the manifests it
    uses."""

    removed: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    manifests: dict[int, set[str]] = field(default_factory=dict)

    def removed_by(self, table: Table, snap: Snapshot) -> list[tuple[str, int]]:
        from pyiceberg.manifest import ManifestEntryStatus
        got = self.removed.get(snap.snapshot_id)
        if got is None:
            got = []
            summary = snap.summary.additional_properties if snap.summary else {}
            if int(summary.get("deleted-data-files", "0") or 0):
                for m in snap.manifests(table.io):
                    if m.added_snapshot_id != snap.snapshot_id or not m.deleted_files_count:
                        continue
                    for e in m.fetch_manifest_entry(table.io, discard_deleted=False):
                        if e.status == ManifestEntryStatus.DELETED:
                            got.append((e.data_file.file_path, int(e.file_sequence_number or 0)))
            self.removed[snap.snapshot_id] = got
        return got

    def manifests_of(self, table: Table, snap: Snapshot) -> set[str]:
        got = self.manifests.get(snap.snapshot_id)
        if got is None:
            got = {m.manifest_path for m in snap.manifests(table.io)}
            self.manifests[snap.snapshot_id] = got
        return got

    def forget(self, snapshot_ids: Iterable[int]) -> None:
        for sid in snapshot_ids:
            self.removed.pop(sid, None)
            self.manifests.pop(sid, None)


def expirable(table: Table, history: History, grace_s: float,
              doomed: Callable[[str], bool] | None = None, now_ms: int | None = None
              ) -> list[int]:
    """The snapshots `expire` would expire now (see the module doc)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    current = table.current_snapshot()
    if current is None:
        return []
    props = table.metadata.properties
    max_age = int(props.get("history.expire.max-snapshot-age-ms",
                            TABLE_PROPERTIES["history.expire.max-snapshot-age-ms"]))
    max_count = int(props.get("shadowtopic-max-snapshots",
                              TABLE_PROPERTIES["shadowtopic-max-snapshots"]))
    protected = {ref.snapshot_id for ref in table.metadata.refs.values()}
    snaps = sorted(table.metadata.snapshots, key=lambda s: (s.sequence_number or 0,
                                                            s.timestamp_ms))
    removals = [(s, history.removed_by(table, s)) for s in snaps]
    removals = [(s, r) for s, r in removals if r]
    out: list[int] = []
    for i, s in enumerate(snaps):
        if s.snapshot_id in protected:
            continue
        seq = s.sequence_number or 0
        stale = False
        for r, removed in removals:
            if (r.sequence_number or 0) <= seq:
                continue
            live_here = [path for path, file_seq in removed if file_seq <= seq]
            if not live_here:
                continue
            if now - r.timestamp_ms >= grace_s * 1000 or (
                    doomed is not None and any(doomed(p) for p in live_here)):
                stale = True
                break
        too_old = now - s.timestamp_ms > max_age
        too_many = len(snaps) - i > max_count
        if stale or too_old or too_many:
            out.append(s.snapshot_id)
    return out


def expire(table: Table, history: History, grace_s: float,
           doomed: Callable[[str], bool] | None = None) -> list[int]:
    """Expire what `expirable` says, then delete the manifests and manifest lists only the
    expired snapshots used. Returns the expired snapshot ids."""
    ids = expirable(table, history, grace_s, doomed)
    if not ids:
        return []
    gone = [s for s in table.metadata.snapshots if s.snapshot_id in ids]
    kept = [s for s in table.metadata.snapshots if s.snapshot_id not in ids]
    used: set[str] = set()
    for s in kept:
        used |= history.manifests_of(table, s)
    orphans: set[str] = set()
    for s in gone:
        orphans |= history.manifests_of(table, s) - used
        orphans.add(s.manifest_list)

    def commit() -> None:
        table.maintenance.expire_snapshots().by_ids(ids).commit()

    _committed(commit, f"{'.'.join(table.name())}: expiring {len(ids)} snapshots")
    history.forget(ids)
    for path in sorted(orphans - {s.manifest_list for s in kept}):
        try:
            table.io.delete(path)
        except (FileNotFoundError, OSError) as exc:
            log.info("%s: %s not deleted: %s", ".".join(table.name()), path, exc)
    return ids


def snapshot_files(table: Table, snapshot_id: int) -> set[str]:
    """The data files a snapshot refers to."""
    snap = table.snapshot_by_id(snapshot_id)
    if snap is None:
        return set()
    return {e.data_file.file_path for m in snap.manifests(table.io)
            for e in m.fetch_manifest_entry(table.io, discard_deleted=True)}


def now_ms() -> int:
    return int(time.time() * 1000)

