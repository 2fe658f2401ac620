"""The Iceberg write side (compaction/iceberg.py) and the table names (source/tables.py),
without processes: a real pyiceberg SQL catalog on SQLite in a temp dir, over ledger files
written by the broker's own sealed-ledger writer. The worker's following of etcd and the
PostgreSQL catalog are tested end to end in tests/test_integration/test_iceberg_tables.py."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shadowtopic import tables
from shadowtopic.columns import SCHEMA_V1
from shadowtopic.compaction import iceberg
from shadowtopic.compaction.tables import ledger_id
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import sealed
from shadowtopic.pb.v1 import common_pb2

TOPIC = TopicName("t", "ns", "orders")


def message(key: str | None, payload: bytes, **props: str) -> bytes:
    m = common_pb2.Message(payload=payload, properties=props, event_time=7)
    if key is not None:
        m.key = key.encode()
    return m.SerializeToString()


def seal(root, lid: int, items: list[tuple[str | None, bytes]]) -> str:
    """A sealed ledger (format 2) of `items`; its path."""
    import pyarrow.fs as pafs
    path = os.path.join(root, f"{lid}.parquet")
    sealed.write_runs(pafs.LocalFileSystem(), path, [(1000 + lid, [message(k, p, n=str(i))
                                                                   for i, (k, p) in
                                                                   enumerate(items)])],
                      len(items), ledger_id=lid)
    return path


@pytest.fixture
def catalog(tmp_path):
    opts = tables.CatalogOptions(tables.sqlite_uri(str(tmp_path / "catalog.db")),
                                 warehouse=str(tmp_path))
    return tables.open_catalog(opts)


def log_table(catalog, tmp_path, topic=TOPIC):
    return iceberg.open_table(catalog, tables.table_identifier(topic, log=True),
                              str(tmp_path / "meta" / "log"), {})


def test_identifiers_are_escaped_and_injective():
    names = ["a", "a.b", "a=2Eb", "x__log", "x_=5Flog", "x", "a=b", "y.__log"]
    seen = {}
    for tenant in ("p", "p.q"):
        for local in names:
            topic = TopicName(tenant, "n.s", local)
            for log in (False, True):
                ident = tables.table_identifier(topic, log)
                assert all("." not in level for level in ident), ident
                assert ident not in seen, (ident, topic, seen.get(ident))
                seen[ident] = (topic, log)
                assert tables.topic_of(ident) == (topic, log)
    part = TopicName("p", "n", "orders-partition-3")
    assert tables.table_identifier(part) == ("p", "n", "orders")
    assert tables.topic_of(("only", "two")) is None


def test_log_table_adds_and_removes_ledgers_without_copying(catalog, tmp_path):
    data = tmp_path / "ledgers"
    data.mkdir()
    paths = [seal(str(data), lid, [("k1", b"v1"), (None, b"free"), ("k2", b"")])
             for lid in (1, 2, 3)]
    t = log_table(catalog, tmp_path)
    files = [iceberg.data_file(t, iceberg.LedgerFile(p, -1, (lid, lid)))
             for lid, p in enumerate(paths, 1)]
    assert [ledger_id(f) for f in files] == [1, 2, 3]
    iceberg.change_log(t, files, [], {})
    assert len(t.metadata.snapshots) == 1
    got = t.scan().to_arrow().sort_by([("ledger_id", "ascending"), ("entry_id", "ascending")])
    assert got.num_rows == 9
    assert got.column("key").to_pylist()[:3] == [b"k1", None, b"k2"]
    assert got.column("payload").to_pylist()[:3] == [b"v1", b"free", b""]
    assert got.column("is_tombstone").to_pylist()[:3] == [False, False, True]
    assert got.column("partition").to_pylist() == [-1] * 9  # from the manifest, not the file
    assert dict(got.column("properties").to_pylist()[1]) == {"n": "1"}
    assert set(iceberg.current_files(t)) == set(paths)  # the files where they are
    first = t.current_snapshot().snapshot_id
    # retention drops ledger 1, a seal adds 4: one commit, a delete and an append
    paths.append(seal(str(data), 4, [("k9", b"v9")]))
    iceberg.change_log(t, [iceberg.data_file(t, iceberg.LedgerFile(paths[3], -1, (4, 4)))],
                       [1], {})
    ops = [s.summary.operation.value for s in t.metadata.snapshots]
    assert ops == ["append", "delete", "append"]
    assert set(iceberg.current_files(t)) == set(paths[1:])
    assert sorted(set(t.scan().to_arrow().column("ledger_id").to_pylist())) == [2, 3, 4]
    # ledger 1 is referred to by the first two snapshots: they expire once the removal is
    # `grace` old, not before
    history = iceberg.History()
    assert iceberg.expirable(t, history, grace_s=3600) == []
    doomed = iceberg.expirable(t, history, grace_s=0)
    assert first in doomed and t.current_snapshot().snapshot_id not in doomed
    before = {m for s in t.metadata.snapshots for m in history.manifests_of(t, s)}
    assert iceberg.expire(t, history, grace_s=0) == doomed
    for s in t.metadata.snapshots:
        assert paths[0] not in iceberg.snapshot_files(t, s.snapshot_id)
    kept = {m for s in t.metadata.snapshots for m in history.manifests_of(t, s)}
    for m in before - kept:
        assert not os.path.exists(m)  # the manifests only expired snapshots used: deleted
    for m in kept:
        assert os.path.exists(m)
    for p in paths[1:]:
        assert os.path.exists(p)  # data files are never deleted here


def test_a_compaction_is_one_overwrite_snapshot_per_partition(catalog, tmp_path):
    data = tmp_path / "compacted"
    data.mkdir()
    t = iceberg.open_table(catalog, tables.table_identifier(TOPIC), str(tmp_path / "meta"),
                           {})
    a = [seal(str(data), lid, [(f"k{lid}", b"a")]) for lid in (10, 11)]
    b = seal(str(data), 12, [("p1", b"b")])
    iceberg.replace(t, [iceberg.data_file(t, iceberg.LedgerFile(p, 0)) for p in a], [],
                    {iceberg.JOB_ID: "j1"})
    iceberg.replace(t, [iceberg.data_file(t, iceberg.LedgerFile(b, 1))], [],
                    {iceberg.JOB_ID: "j2"})
    prev = t.current_snapshot().snapshot_id
    c = seal(str(data), 13, [("k", b"new")])
    have = iceberg.current_files(t)
    iceberg.replace(t, [iceberg.data_file(t, iceberg.LedgerFile(c, 0))],
                    [have[p] for p in a], {iceberg.JOB_ID: "j3"})
    snap = t.current_snapshot()
    assert snap.summary.operation.value == "overwrite"
    assert snap.summary["shadowtopic-job-id"] == "j3"
    assert snap.summary["deleted-data-files"] == "2" and snap.summary["added-data-files"] == "1"
    scan = t.scan().to_arrow()
    assert sorted(zip(scan.column("partition").to_pylist(), scan.column("key").to_pylist())) \
        == [(0, b"k"), (1, b"p1")]
    old = t.scan(snapshot_id=prev).to_arrow()  # the previous snapshot still reads
    assert sorted(old.column("key").to_pylist()) == [b"k10", b"k11", b"p1"]
    # collecting the replaced files expires every snapshot that refers to them, at once
    doomed = iceberg.expirable(t, iceberg.History(), grace_s=3600,
                               doomed=lambda path: path in a)
    assert set(doomed) == {s.snapshot_id for s in t.metadata.snapshots} - {snap.snapshot_id}


def test_format_1_files_join_by_schema_evolution(catalog, tmp_path):
    """A ledger sealed before format 2 (column `raw`) adds the column `raw` to its table;
    its rows read raw, format-2 rows read payload."""
    data = tmp_path / "old"
    data.mkdir()
    raw = message("k", b"old-value")
    old = str(data / "1.parquet")
    pq.write_table(pa.table({"ledger_id": [1], "entry_id": [0], "key": [b"k"],
                             "is_tombstone": [False], "publish_time": [5], "raw": [raw]},
                            schema=SCHEMA_V1), old)
    new = seal(str(data), 2, [("k", b"new-value")])
    t = log_table(catalog, tmp_path)
    assert iceberg.file_format(t, old) == 1 and iceberg.file_format(t, new) == 2
    iceberg.ensure_raw_column(t)
    files = [iceberg.data_file(t, iceberg.LedgerFile(p, -1)) for p in (old, new)]
    iceberg.change_log(t, files, [], {})
    got = t.scan().to_arrow().sort_by("ledger_id")
    assert got.column("raw").to_pylist() == [raw, None]
    assert got.column("payload").to_pylist() == [None, b"new-value"]
    assert got.column("key").to_pylist() == [b"k", b"k"]


def test_a_missing_catalog_driver_or_server_is_catalog_unavailable(tmp_path):
    opts = tables.CatalogOptions("postgresql+psycopg2://nobody@127.0.0.1:1/none")
    with pytest.raises(errors.CatalogUnavailable) as err:
        tables.open_catalog(opts)
    assert "127.0.0.1:1" in err.value.message
    shown = tables.CatalogOptions("postgresql+psycopg2://u:secret@h/db").described()
    assert "secret" not in shown and "u:***@h" in shown


def test_the_keeper_follows_etcd_skips_foreign_topics_and_drops_deleted_ones(tmp_path, arun):
    """`TableKeeper.reconcile` over the in-memory metadata store: a topic whose files are
    not under the keeper's root gets no table; sealed ledgers join the log table; a deleted
    topic's tables are dropped and their metadata deleted."""
    from shadowtopic.compaction.tables import TableKeeper, iceberg_dir
    from shadowtopic.ledger.storage import Storage
    from shadowtopic.metadata import keys
    from shadowtopic.metadata.memory import MemoryStore
    from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

    root = str(tmp_path / "storage")
    storage = Storage(root)
    opts = tables.CatalogOptions(tables.sqlite_uri(str(tmp_path / "catalog.db")))
    here, away = TopicName("t", "ns", "here"), TopicName("t", "ns", "away")

    async def run():
        store = MemoryStore()
        keeper = TableKeeper(store, opts, storage, root, grace=0.0)
        for topic in (here, away):
            rel = Storage.sealed_rel(topic, 7 if topic == here else 8)
            if topic == here:
                os.makedirs(os.path.dirname(storage.full(rel)))
                seal(os.path.dirname(storage.full(rel)), 7, [("k", b"v")])
            lst = mpb.LedgerList()
            lst.ledgers.add(ledger_id=7 if topic == here else 8, state=mpb.LedgerState.SEALED,
                            entries=1, path=rel)
            info = mpb.TopicInfo(name=str(topic), kind=mpb.TopicKind.SOURCE,
                                 partition_index=-1)
            await store.put(keys.topic_info(topic), info.SerializeToString())
            await store.put(keys.ledgers(topic), lst.SerializeToString())
            await keeper.reconcile(topic)
        catalog = keeper.catalog()
        assert tables.list_tables(catalog) == [tables.table_identifier(here, log=True)]
        t = catalog.load_table(tables.table_identifier(here, log=True))
        assert t.scan().to_arrow().column("key").to_pylist() == [b"k"]
        assert os.path.isdir(storage.full(iceberg_dir(here)))
        await store.delete(keys.topic_prefix(here), prefix=True)
        await keeper.reconcile(here)
        assert tables.list_tables(catalog) == []
        assert not os.path.exists(storage.full(iceberg_dir(here)))
        await keeper.close()

    arun(run(), timeout=60)
