"""`TableKeeper`: the compaction worker keeps every source topic's two Iceberg tables in
step with etcd (docs/TABLES.md): the compacted table (`<tenant>.<namespace>.<topic>`: the
files of the topic's current compacted ledger) and the log table (`<topic>__log`: the files
of its sealed ledgers). Brokers know nothing of Iceberg; the worker follows what they
write in etcd.

- **Following.** One `PrefixFollower` (source/metadata/follow.py) over the topics' keys:
  a change of a topic's `ledgers` (a seal, retention, truncate), `compaction` (a published
  compaction) or `info` (created, deleted) key queues its topic (a partition queues its
  partitioned topic: one table of each kind has every partition, by the `partition`
  column). A list (at the start, and whenever the watch has to list again) queues every
  topic, and every table of the catalog whose topic is gone.
- **Reconciling.** A queued topic is planned from etcd as it is then (its info, each
  partition's ledger list and compaction pointer) against each table's current snapshot,
  and the difference committed (compaction/iceberg.py): for each partition whose compacted
  ledger changed, one `overwrite` snapshot that deletes the previous compacted files and
  appends the new ones (the snapshot summary names the job: `shadowtopic-job-id`); for the
  log, one commit deleting the ledgers gone and appending the ones sealed. Because each pass
  computes the difference afresh, passes are idempotent: a pass that fails (the catalog
  away, another writer's commit first) is simply planned again later (0.5 s, doubling to
  30 s); two workers following one etcd reach the same tables.
- **Which topics.** Tables are made for source topics whose files are under this worker's
  storage root (`--storage-root`, the brokers' root): a topic whose first file is not
  there is left out (another cluster's, say) until its keys change. A topic with neither a
  sealed ledger nor a compacted ledger has no table yet. A deleted topic's tables are
  dropped from the catalog and their metadata files deleted.
- **Format 1.** A ledger sealed before format 2 joins its table through the optional column
  `raw` (schema evolution, compaction/iceberg.py), the rest of its row null.
- **Expiry.** After each pass and `grace` seconds after each removal, the tables' snapshots
  that refer to removed files are expired once the removal is `grace` seconds old (sealed
  ledgers are deleted by their broker at once; a replaced compacted ledger stays `grace`
  seconds for its readers). Before the worker collects a replaced compacted ledger
  (`before_collect`, compaction/jobs.py), every snapshot that refers to its files is
  expired first; when that fails the collection waits. So no snapshot kept refers to a
  deleted file for longer than the grace period.

All pyiceberg calls run on one thread of their own, one pass at a time, so the event loop
never waits on the catalog and no two passes race on one table.
"""
from __future__ import annotations

import asyncio
import logging
import os
import struct
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from shadowtopic.compaction import iceberg
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import object_store
from shadowtopic.ledger.storage import Storage, topic_dir
from shadowtopic.metadata import MetadataStore, Snapshot, WatchEvent, keys
from shadowtopic.metadata.follow import PrefixFollower
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.tables import CatalogOptions, list_tables, open_catalog, table_identifier, topic_of

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

log = logging.getLogger("shadowtopic.compaction.worker")  # the worker's one logger name

T = TypeVar("T")
#: the keys of a topic whose changes a table follows
FOLLOWED = ("ledgers", "compaction", "info")
RETRY_FIRST, RETRY_MAX = 0.5, 30.0


def iceberg_dir(topic: TopicName) -> str:
    """A topic's tables' metadata, relative to the storage root."""
    return f"iceberg/{topic_dir(topic)}"


@dataclass
class Desired:
    """What a topic's tables should hold, from etcd."""

    source: bool = False
    log: dict[str, iceberg.LedgerFile] = field(default_factory=dict)
    #: per partition: the compacted files, and the pointer naming them
    compacted: dict[int, tuple[dict[str, iceberg.LedgerFile], mpb.CompactionPointer]] = \
        field(default_factory=dict)
    partitions: list[int] = field(default_factory=list)


class TableKeeper:
    """Follows etcd, keeps the tables (see the module doc). `storage`: the brokers' storage
    root as this worker opens it; `root`: its URI."""

    def __init__(self, store: MetadataStore, options: CatalogOptions, storage: Storage,
                 root: str, grace: float, s3: object_store.S3Options | None = None):
        self.store = store
        self.storage = storage
        self.root = root
        self.grace = grace
        props = dict(options.properties)
        if s3 is not None and object_store.is_s3(root):
            if s3.endpoint:
                props.setdefault("s3.endpoint", s3.endpoint)
            if s3.region:
                props.setdefault("s3.region", s3.region)
        self.options = CatalogOptions(options.uri, tuple(props.items()), options.name,
                                      options.warehouse or self.uri(""))
        self._catalog: Catalog | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="iceberg")
        self._queue: asyncio.Queue[TopicName] = asyncio.Queue()
        self._queued: set[TopicName] = set()
        self._retry: dict[TopicName, float] = {}
        self._histories: dict[str, iceberg.History] = {}
        self._foreign: set[TopicName] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._follower = PrefixFollower(store, keys.topics_prefix(), self._on_snapshot,
                                        self._on_events)
        #: passes that committed something, and passes that failed (tests, logs)
        self.commits = 0
        self.failures = 0
        #: set after each pass that left nothing queued (tests wait on it)
        self.idle = asyncio.Event()

    # ---- life ------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._follower.start_retrying()),
                       loop.create_task(self._run())]
        log.info("Iceberg tables: catalog %s, storage root %s", self.options.described(),
                 self.root)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._follower.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def uri(self, rel: str) -> str:
        """The URI of a storage-relative path, as Iceberg metadata names files."""
        full = self.storage.full(rel) if rel else self.storage.base
        if "://" not in self.root or self.root.startswith("file://"):
            return full
        return f"{self.root.split('://', 1)[0]}://{full}"

    # ---- following -------------------------------------------------------------------------

    def enqueue(self, topic: TopicName) -> None:
        topic = topic.partitioned_parent or topic
        self._foreign.discard(topic)
        if topic not in self._queued:
            self._queued.add(topic)
            self._queue.put_nowait(topic)
            self.idle.clear()

    async def _on_snapshot(self, snap: Snapshot) -> None:
        seen = set()
        for kv in snap.items:
            got = keys.topic_key_of(kv.key)
            if got is not None and got[1] in FOLLOWED:
                seen.add(got[0].partitioned_parent or got[0])
        try:
            tables = await self._call(lambda: list_tables(self.catalog()))
        except errors.ShadowTopicError as exc:
            log.warning("Iceberg catalog %s: %s", self.options.described(), exc)
            tables = []
        for ident in tables:
            named = topic_of(ident)
            if named is not None:
                seen.add(named[0])
        for topic in sorted(seen):
            self.enqueue(topic)

    async def _on_events(self, events: list[WatchEvent]) -> None:
        for ev in events:
            got = keys.topic_key_of(ev.key)
            if got is not None and got[1] in FOLLOWED:
                self.enqueue(got[0])

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._queue.empty():
                self.idle.set()
            topic = await self._queue.get()
            self._queued.discard(topic)
            try:
                removed = await self.reconcile(topic)
            except Exception as exc:  # noqa: BLE001 - planned again later, never stops
                self.failures += 1
                delay = min(RETRY_MAX, self._retry.get(topic, RETRY_FIRST / 2) * 2)
                self._retry[topic] = delay
                level = logging.WARNING if delay <= RETRY_FIRST else logging.DEBUG
                log.log(level, "%s: Iceberg tables not updated (%s: %s); again in %.1f s",
                        topic, type(exc).__name__, exc, delay, extra={"topic": str(topic)},
                        exc_info=not isinstance(exc, (errors.ShadowTopicError, OSError)))
                loop.call_later(delay, self.enqueue, topic)
                continue
            self._retry.pop(topic, None)
            if removed:  # its snapshots expire `grace` seconds after the removal
                loop.call_later(self.grace + 0.5, self.enqueue, topic)

    async def _call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def catalog(self) -> Catalog:
        """The catalog, opened on first use (the Iceberg thread only)."""
        if self._catalog is None:
            self._catalog = open_catalog(self.options)
        return self._catalog

    # ---- one topic -------------------------------------------------------------------------

    async def desired(self, topic: TopicName) -> Desired:
        """What the topic's tables should hold, read from etcd now."""
        want = Desired()
        kv = await self.store.get(keys.topic_info(topic))
        if kv is None:
            return want
        info = mpb.TopicInfo.FromString(kv.value)
        if info.kind != mpb.TopicKind.SOURCE or info.partition_of:
            return want
        want.source = True
        parts = ([(topic.partition(i), i) for i in range(info.partitions)] if info.partitions
                 else [(topic, iceberg.NOT_PARTITIONED)])
        for name, index in parts:
            want.partitions.append(index)
            lst = await self.store.get(keys.ledgers(name))
            for led in (mpb.LedgerList.FromString(lst.value).ledgers if lst else ()):
                if led.state == mpb.LedgerState.SEALED and led.path and led.entries:
                    path = self.uri(led.path)
                    want.log[path] = iceberg.LedgerFile(path, index,
                                                        (led.ledger_id, led.ledger_id))
            ptr = await self.store.get(keys.compaction(name))
            if ptr is not None:
                pointer = mpb.CompactionPointer.FromString(ptr.value)
                files = {self.uri(f.path): iceberg.LedgerFile(
                    self.uri(f.path), index, (f.first.ledger_id, f.last.ledger_id))
                    for f in pointer.manifest.files}
                want.compacted[index] = (files, pointer)
        return want

    async def reconcile(self, topic: TopicName) -> bool:
        """Bring the topic's tables to what etcd says now; True when files were removed."""
        topic = topic.partitioned_parent or topic
        want = await self.desired(topic)
        result = await self._call(lambda: self._apply(topic, want))
        return bool(result)

    async def before_collect(self, topic: TopicName, rels: Iterable[str]) -> None:
        """Before the worker deletes these compacted-ledger directories: the topic's tables
        brought up to date and every snapshot that refers to a file under them expired.
        Raises when that cannot be done now (the collection then waits)."""
        prefixes = tuple(self.uri(rel).rstrip("/") + "/" for rel in rels)
        if not prefixes:
            return
        topic = topic.partitioned_parent or topic
        await self.reconcile(topic)

        def expire() -> None:
            table = self._load(table_identifier(topic))
            if table is not None:
                self._expire(table, lambda path: path.startswith(prefixes))

        await self._call(expire)

    # ---- the Iceberg thread ----------------------------------------------------------------

    def _load(self, identifier: tuple[str, str, str]) -> Table | None:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
        try:
            return self.catalog().load_table(identifier)
        except (NoSuchTableError, NoSuchNamespaceError):
            return None

    def _open(self, topic: TopicName, log_table: bool) -> Table:
        kind = "log" if log_table else "compacted"
        return iceberg.open_table(
            self.catalog(), table_identifier(topic, log=log_table),
            self.uri(f"{iceberg_dir(topic)}/{kind}"),
            {"shadowtopic-topic": str(topic), "shadowtopic-table": kind})

    def _history(self, table: Table) -> iceberg.History:
        uuid = str(table.metadata.table_uuid)
        got = self._histories.get(uuid)
        if got is None:
            got = self._histories[uuid] = iceberg.History()
        return got

    def _expire(self, table: Table, doomed: Callable[[str], bool] | None = None) -> None:
        ids = iceberg.expire(table, self._history(table), self.grace, doomed)
        if ids:
            log.info("%s: %d snapshots expired", ".".join(table.name()), len(ids))

    def _apply(self, topic: TopicName, want: Desired) -> bool:
        if not want.source:
            self._drop(topic)
            return False
        if topic in self._foreign:
            return False
        log_table = self._load(table_identifier(topic, log=True))
        compacted = self._load(table_identifier(topic))
        if log_table is None and compacted is None:
            first = next(iter(want.log), None) or next(
                (p for files, _ in want.compacted.values() for p in files), None)
            if first is None:
                return False  # nothing sealed, nothing compacted: no table yet
            if not self._exists(first):
                log.info("%s: its ledger files are not under %s; no Iceberg tables for it",
                         topic, self.root, extra={"topic": str(topic)})
                self._foreign.add(topic)
                return False
        removed = False
        if want.log or log_table is not None:
            removed |= self._apply_log(log_table or self._open(topic, True), want)
        if want.compacted or compacted is not None:
            removed |= self._apply_compacted(compacted or self._open(topic, False), want)
        return removed

    def _exists(self, path: str) -> bool:
        try:
            from pyiceberg.io.pyarrow import PyArrowFileIO
            return PyArrowFileIO(dict(self.options.catalog_properties())).new_input(
                path).exists()
        except OSError:
            return False

    def _data_files(self, table: Table, files: Iterable[iceberg.LedgerFile]
                    ) -> tuple[list[DataFile], list[str]]:
        """The data files of `files` (format-1 files give the table its `raw` column), and
        the paths that are gone (deleted since etcd was read: the next pass sees why)."""
        files = list(files)
        present, missing = [], []
        for f in files:
            try:
                fmt = iceberg.file_format(table, f.path)
            except FileNotFoundError:
                missing.append(f.path)
                continue
            present.append(f)
            if fmt == 1:
                iceberg.ensure_raw_column(table)
        out = []
        for f in present:
            try:
                out.append(iceberg.data_file(table, f))
            except FileNotFoundError:
                missing.append(f.path)
        return out, missing

    def _apply_log(self, table: Table, want: Desired) -> bool:
        actual = iceberg.current_files(table)
        adds = [f for path, f in sorted(want.log.items()) if path not in actual]
        gone = [ledger_id(df) for path, df in actual.items() if path not in want.log]
        if adds or gone:
            data_files, missing = self._data_files(table, adds)
            if missing:
                log.info("%s: %d sealed ledgers gone before they were added (next pass)",
                         ".".join(table.name()), len(missing))
            if data_files or gone:
                iceberg.change_log(table, data_files, gone, {})
                self.commits += 1
                log.info("%s: %d ledgers added, %d removed", ".".join(table.name()),
                         len(data_files), len(gone))
            if missing:
                raise errors.DataLoss(f"{len(missing)} ledger files missing, e.g. "
                                      f"{missing[0]}")
        self._expire(table)
        return bool(gone)

    def _apply_compacted(self, table: Table, want: Desired) -> bool:
        actual = iceberg.current_files(table)
        by_partition: dict[int, dict[str, DataFile]] = {}
        for path, df in actual.items():
            by_partition.setdefault(iceberg.partition_of(df), {})[path] = df
        removed = False
        for index in sorted(set(by_partition) | set(want.compacted)):
            files, pointer = want.compacted.get(index, ({}, None))
            have = by_partition.get(index, {})
            if set(have) == set(files):
                continue
            adds, missing = self._data_files(
                table, [f for p, f in sorted(files.items()) if p not in have])
            if missing:  # the pointer moved on and this ledger was collected meanwhile
                raise errors.DataLoss(f"compacted ledger files missing, e.g. {missing[0]}")
            removes = [df for p, df in have.items() if p not in files]
            props = {iceberg.PARTITIONS: str(index)}
            if pointer is not None:
                props[iceberg.JOB_ID] = pointer.job_id
                if pointer.HasField("horizon"):
                    props[iceberg.HORIZON] = str(MessageId.from_pb(pointer.horizon))
            iceberg.replace(table, adds, removes, props)
            self.commits += 1
            removed |= bool(removes)
            log.info("%s: compaction %s: %d files replaced by %d (partition %d)",
                     ".".join(table.name()), props.get(iceberg.JOB_ID, "-"), len(removes),
                     len(adds), index)
        self._expire(table)
        return removed

    def _drop(self, topic: TopicName) -> None:
        dropped = [iceberg.drop_table(self.catalog(), table_identifier(topic, log=kind))
                   for kind in (False, True)]
        if any(dropped):
            self.storage.delete_dir(iceberg_dir(topic))
            log.info("%s: deleted: its Iceberg tables dropped", topic,
                     extra={"topic": str(topic)})


def ledger_id(data_file: DataFile) -> int:
    """The ledger of a log table's data file (its `ledger_id` column's lower bound: the
    same in every row of a sealed ledger)."""
    bound = data_file.lower_bounds.get(1)
    if bound is not None and len(bound) == 8:
        return int(struct.unpack("<q", bound)[0])
    name = os.path.basename(data_file.file_path)
    return int(name.split(".", 1)[0])
