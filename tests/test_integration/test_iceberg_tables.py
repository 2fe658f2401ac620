"""Every topic an Iceberg table (docs/TABLES.md), end to end: a real broker and a real
compaction worker (Spark local) sharing one storage root, the worker keeping the tables in
a real pyiceberg SQL catalog: SQLite in a temp dir, and a throwaway PostgreSQL server
(tests/support/postgres.py). The module's fixtures are parametrized by the catalog (one
broker, one worker, one catalog at a time): every test runs on SQLite; on PostgreSQL the
compaction's snapshots (overwrite, expiry, collection) and the CLI's listing run too, the
log table's and the partitioned topic's tests not (`SQLITE_ONLY`: fewer minutes of a second
cell in `make test`, and still a real PostgreSQL catalog under a real worker).

What is checked: a compaction adds exactly one snapshot, whose scan equals what the
compacted reader reads (tombstones included while kept) and whose parent still reads the
previous view; once the replaced compacted ledger is collected (after the grace period) no
kept snapshot refers to a deleted file; the `__log` table equals the sealed ledgers after
seals, retention and truncate; a partitioned topic is one table with a `partition` column;
a deleted topic's tables are dropped; `shadowtopic tables list | show` print them."""
from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
from support.brokers import BROKER_ARGS
from support.compaction_support import WORKER_ARGS, produce, wait_done
from support.etcd_support import etcd_get
from support.postgres import PostgresServer
from support.waiting import eventually, wait_for

from shadowtopic import tables
from shadowtopic.broker.server import free_port
from shadowtopic.cli.main import main
from shadowtopic.client import Client, Policies
from shadowtopic.core.names import TopicName
from shadowtopic.metadata import keys
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.standalone import BrokerProcess
from shadowtopic.testing import start_broker

#: the worker's grace period: long enough to read the previous snapshot after a
#: compaction, short enough to see its files collected
GRACE = 5.0


#: a test that runs on the SQLite catalog only (see the module's docstring)
SQLITE_ONLY = pytest.mark.parametrize("catalog_uri", ["sqlite"], indirect=True)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def catalog_uri(request, tmp_path_factory):
    if request.param == "sqlite":
        yield tables.sqlite_uri(str(tmp_path_factory.mktemp("catalog") / "iceberg.db"))
        return
    with PostgresServer.start() as pg:
        yield pg.uri


@pytest.fixture(scope="module")
def cell(etcd_server, tmp_path_factory, catalog_uri):
    """(broker, worker, storage root) of one cluster: the worker keeps the tables of the
    broker's storage root in `catalog_uri`."""
    base = tmp_path_factory.mktemp("cell")
    root = str(base / "storage")
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    broker = start_broker(etcd_server.endpoint, base / "broker",
                          args=[*BROKER_ARGS, "--cluster", cluster, "--storage-root", root,
                                "--retention-interval", "1"])
    worker = BrokerProcess(etcd_server.endpoint, str(base / "worker"), free_port(),
                           module="shadowtopic.compaction.worker",
                           extra_args=[*WORKER_ARGS, "--cluster", cluster, "--grace",
                                       str(GRACE), "--storage-root", root,
                                       "--iceberg-catalog-uri", catalog_uri])
    try:
        worker.start(timeout=180)
        yield broker, worker, root
    finally:
        worker.kill()
        broker.kill()


@pytest.fixture(scope="module")
def catalog(catalog_uri, cell):
    return tables.open_catalog(tables.CatalogOptions(catalog_uri))


@pytest.fixture
def client(cell):
    with Client(cell[0].url, timeout=30) as c:
        yield c


@pytest.fixture
def topic():
    return f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"


def table(catalog, topic: str, log: bool = False):
    """The topic's table now (None: none yet)."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
    try:
        return catalog.load_table(tables.table_identifier(TopicName.parse(topic), log))
    except (NoSuchTableError, NoSuchNamespaceError):
        return None


def rows(scan) -> list[tuple]:
    t = scan.to_arrow()
    cols = [t.column(c).to_pylist() for c in ("partition", "ledger_id", "entry_id", "key",
                                               "payload", "is_tombstone")]
    return sorted(zip(*cols, strict=True))


def compacted_view(client, topic: str, partition: int = -1) -> list[tuple]:
    """What the compacted reader reads, as the table's rows."""
    r = client.create_reader(topic, "earliest", read_compacted=True)
    out = []
    try:
        while r.has_message_available():
            m = r.read_next(timeout=10)
            out.append((partition, m.message_id.ledger_id, m.message_id.entry_id, m.key,
                        m.payload, m.is_tombstone))
    finally:
        r.close()
    return sorted(out)


def sealed(etcd_server, topic: str) -> dict[str, int]:
    """The topic's sealed ledger files (storage-relative) and their entries, from etcd."""
    kv = etcd_get(etcd_server, keys.ledgers(TopicName.parse(topic)))
    lst = mpb.LedgerList.FromString(kv.value) if kv else mpb.LedgerList()
    return {i.path: i.entries for i in lst.ledgers
            if i.state == mpb.LedgerState.SEALED and i.path and i.entries}


def no_snapshot_refers_to_a_missing_file(t) -> None:
    from shadowtopic.compaction import iceberg
    for s in t.metadata.snapshots:
        try:
            files = iceberg.snapshot_files(t, s.snapshot_id)
        except FileNotFoundError as exc:  # expired (its manifest deleted) since `t` was read
            raise AssertionError(f"snapshot {s.snapshot_id} expired while read: {exc}") from None
        for path in files:
            assert os.path.exists(path), f"snapshot {s.snapshot_id} refers to {path}, deleted"


def test_a_compaction_adds_one_snapshot_that_reads_as_the_compacted_view(
        client, cell, catalog, topic, etcd_server):
    _, _, root = cell
    items = [("a", "a1"), ("b", "b1"), ("a", "a2"), ("c", "c1"), ("b", ""), (None, "free")]
    produce(client, topic, items)
    job1 = client.admin.compact(topic)
    assert wait_done(client, topic, job1).phase == "done"
    t = wait_for(lambda: (t := table(catalog, topic)) is not None and t.current_snapshot()
                 and t.current_snapshot().summary.get("shadowtopic-job-id") == job1 and t,
                 timeout=30, what=f"the snapshot of job {job1}")
    assert len(t.metadata.snapshots) == 1
    view1 = compacted_view(client, topic)
    assert any(r[5] for r in view1), "the delete of b is kept (delete_retention 1 day)"
    assert rows(t.scan()) == view1
    first = t.current_snapshot().snapshot_id
    old_files = {f["path"] for f in tables.describe(t)["data_files"]}
    assert old_files and all(p.startswith(os.path.join(root, "compacted")) for p in old_files)

    produce(client, topic, [("a", "a3"), ("d", "d1"), ("c", "")])
    job2 = client.admin.compact(topic)
    assert wait_done(client, topic, job2).phase == "done"
    t = wait_for(lambda: (t := table(catalog, topic)).current_snapshot().summary.get(
        "shadowtopic-job-id") == job2 and t, timeout=30, what=f"the snapshot of job {job2}")
    snap = t.current_snapshot()
    assert len(t.metadata.snapshots) == 2 and snap.parent_snapshot_id == first
    assert snap.summary.operation.value == "overwrite"
    assert rows(t.scan()) == compacted_view(client, topic)
    assert rows(t.scan(snapshot_id=first)) == view1  # the previous snapshot still reads
    # after the grace period the replaced compacted ledger is collected, and no snapshot
    # kept refers to it any more
    wait_for(lambda: not any(os.path.exists(p) for p in old_files), timeout=GRACE + 30,
             what="the replaced compacted ledger collected")
    t = table(catalog, topic)
    assert [s.snapshot_id for s in t.metadata.snapshots] == [snap.snapshot_id]
    no_snapshot_refers_to_a_missing_file(t)
    assert rows(t.scan()) == compacted_view(client, topic)


@SQLITE_ONLY
def test_the_log_table_follows_seals_retention_and_truncate(client, cell, catalog, topic,
                                                           etcd_server):
    _, _, root = cell
    sent = []
    for batch in ([("k1", "v1"), (None, "x"), ("k2", "v2")], [("k1", "v3")], [("k3", "")]):
        ids = produce(client, topic, batch)
        client.admin.roll_ledger(topic)
        sent += [(i.ledger_id, i.entry_id, k.encode() if k else None, v.encode())
                 for i, (k, v) in zip(ids, batch, strict=True)]

    def matches(expect_rows: list[tuple] | None = None):
        want = sealed(etcd_server, topic)
        t = table(catalog, topic, log=True)
        assert t is not None and t.current_snapshot() is not None
        files = {f["path"]: f["rows"] for f in tables.describe(t)["data_files"]}
        assert files == {os.path.join(root, p): n for p, n in want.items()}
        if expect_rows is not None:
            got = [(r[1], r[2], r[3], r[4]) for r in rows(t.scan())]
            assert got == sorted(expect_rows)
            assert {r[0] for r in rows(t.scan())} <= {-1}
        return t

    wait_for(lambda: len(sealed(etcd_server, topic)) == 3, what="three sealed ledgers")
    eventually(lambda: matches(sent), timeout=30)
    # retention removes the oldest ledgers
    client.admin.set_policies(topic, Policies(retention_size_bytes=1))
    wait_for(lambda: len(sealed(etcd_server, topic)) < 3, timeout=30, what="retention")
    kept = {int(os.path.basename(p).split(".")[0]) for p in sealed(etcd_server, topic)}
    eventually(lambda: matches([r for r in sent if r[0] in kept]), timeout=30)
    t = table(catalog, topic, log=True)
    assert "delete" in [s.summary.operation.value for s in t.metadata.snapshots]
    # truncate removes every sealed ledger
    client.admin.set_policies(topic, Policies(retention_size_bytes=-1))
    produce(client, topic, [("k9", "v9")])
    client.admin.roll_ledger(topic)
    wait_for(lambda: any(n == 1 for n in sealed(etcd_server, topic).values()), timeout=30,
             what="the new ledger sealed")
    eventually(lambda: matches(), timeout=30)
    client.admin.truncate(topic)
    wait_for(lambda: not sealed(etcd_server, topic), timeout=30, what="truncate")
    eventually(lambda: matches([]), timeout=30)
    # snapshots that referred to deleted ledgers are expired after the grace period
    eventually(lambda: no_snapshot_refers_to_a_missing_file(table(catalog, topic, log=True)),
               timeout=GRACE + 30, interval=1)
    # a deleted topic's tables are dropped
    client.admin.delete_topic(topic, force=True)
    wait_for(lambda: table(catalog, topic, log=True) is None, timeout=30,
             what="the log table dropped")


@SQLITE_ONLY
def test_a_partitioned_topic_is_one_table_with_a_partition_column(client, catalog):
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/p"
    client.admin.create_topic(topic, partitions=2)
    p = client.create_producer(topic)
    for i in range(20):
        p.send(f"v{i}", key=f"k{i % 7}")
    p.close()
    job = client.admin.compact(topic)
    assert wait_done(client, topic, job).phase == "done"
    want = []
    for i in range(2):
        want += compacted_view(client, f"{topic}-partition-{i}", partition=i)
    assert {r[0] for r in want} == {0, 1}
    t = eventually(lambda: _rows_equal(catalog, topic, want), timeout=30)
    assert [f.name for f in t.spec().fields] == ["partition"]
    log_rows = eventually(lambda: _log_rows(catalog, topic, 20), timeout=30)
    assert {r[0] for r in log_rows} == {0, 1}


def _rows_equal(catalog, topic, want):
    t = table(catalog, topic)
    assert t is not None and rows(t.scan()) == sorted(want)
    return t


def _log_rows(catalog, topic, n):
    t = table(catalog, topic, log=True)
    assert t is not None
    got = rows(t.scan())
    assert len(got) == n
    return got


def test_the_cli_lists_and_shows_the_tables(client, catalog_uri, catalog, topic, capsys):
    """`shadowtopic tables ...` run in this process (its pyiceberg is loaded already)."""
    produce(client, topic, [("a", "1"), ("b", "2"), ("a", "3")])
    job = client.admin.compact(topic)
    assert wait_done(client, topic, job).phase == "done"

    def both() -> bool:  # the compacted table with the job's snapshot (the keeper adds it
        t = table(catalog, topic)  # after the job is DONE), and the log table
        return t is not None and t.current_snapshot() is not None and \
            t.current_snapshot().summary.get("shadowtopic-job-id") == job and \
            table(catalog, topic, log=True) is not None
    wait_for(both, timeout=30, what="both tables, the compaction's snapshot in one")
    flags = ["--iceberg-catalog-uri", catalog_uri]

    def cli(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        with pytest.raises(SystemExit) as done:
            main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, done.value.code, out.out, out.err)

    out = cli("tables", "list", *flags, "-o", "json")
    assert out.returncode == 0, out.stderr
    listed = {r["table"]: r for r in json.loads(out.stdout)}
    name = ".".join(tables.table_identifier(TopicName.parse(topic)))
    assert listed[name]["kind"] == "compacted" and listed[name]["topic"] == topic
    assert listed[name]["rows"] == 2 and listed[name]["snapshots"] == 1
    assert listed[name + "__log"]["kind"] == "log" and listed[name + "__log"]["rows"] == 3
    out = cli("tables", "show", topic, *flags, "-o", "json")
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert [c["name"] for c in shown["schema"]][:6] == ["ledger_id", "entry_id", "key",
                                                        "is_tombstone", "publish_time",
                                                        "payload"]
    assert shown["current_snapshot"]["summary"]["shadowtopic-job-id"] == job
    assert shown["rows"] == 2 and len(shown["data_files"]) >= 1
    assert shown["partition_by"] == ["partition (identity)"]
    out = cli("tables", "show", topic, "--log", *flags)
    assert out.returncode == 0, out.stderr
    assert "ledger_id" in out.stdout and "__log" in out.stdout
    out = cli("tables", "show", "persistent://public/none/nothing", *flags)
    assert out.returncode == 1 and out.stderr.startswith("error: TableNotFound:")
