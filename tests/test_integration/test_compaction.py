"""Compaction end to end: a user asks a real broker to compact (client and CLI), a real
compaction worker process (one warm SparkSession: conftest's `worker`) runs the Spark job,
and the result is checked in etcd (pointer, job record) and in the compacted ledger it names.
Reads of the compacted view by consumers are in test_compacted_read.py; workers crashed or
held by failpoints in test_compaction_failpoints.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from support.compaction_support import compacted_rows, pointer, produce, wait_done
from support.etcd_support import etcd_put

from shadowtopic import failpoints
from shadowtopic.broker.server import free_port
from shadowtopic.client import Client, Policies, errors
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.standalone import BrokerProcess

#: the policies of the tests that check PIP-14's result exactly: a delete leaves nothing in the
#: compacted ledger (the default keeps it for a day, K18: test_compaction_deletes.py)
DROP_DELETES = Policies(delete_retention_seconds=0)


@pytest.fixture(scope="module")
def source(etcd_server, tmp_path_factory, cluster, worker):
    """A source broker of the worker's cluster (retention passes every second, so the
    threshold trigger is checked often), shared by the module's tests: each has topics of
    its own and looks only at their files; a test that restarts a broker starts its own."""
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path_factory.mktemp("source")), free_port(),
                      extra_args=["--lease-ttl", "3", "--cluster", cluster,
                                  "--retention-interval", "1"])
    b.start(timeout=60)
    try:
        yield b
    finally:
        b.kill()


@pytest.fixture
def client(source):
    with Client(source.url, timeout=30) as c:
        yield c


@pytest.fixture
def topic():
    return f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"


def test_compact_keeps_the_latest_value_per_key(client, source, etcd_server, topic):
    """K1, K2, K4, K5 and K14 through the client: latest value per key with its id, deletes
    gone, keyless kept in place, a DONE job record with its counts; K3: the raw backlog
    still reads whole."""
    client.admin.create_topic(topic, policies=DROP_DELETES)
    items = [("a", "a1"), ("b", "b1"), (None, "free1"), ("a", "a2"), ("c", "c1"),
             ("b", ""), ("a", "a3"), ("d", "d1"), ("d", ""), ("d", "d2")]
    ids = produce(client, topic, items)
    job_id = client.admin.compact(topic)
    status = wait_done(client, topic, job_id)
    assert status.phase == "done", status.error
    assert (status.keys, status.entries_written, status.entries_total) == (3, 4, 10)
    assert status.horizon == ids[-1]
    # the Spark job's time is recorded, within the job's
    assert 0 < status.compute_ms <= status.end_ms - status.start_ms
    ptr = pointer(etcd_server, topic)
    assert ptr.job_id == job_id and ptr.horizon.entry_id == ids[-1].entry_id
    rows = compacted_rows(source, ptr)
    want = [(ids[i].ledger_id, ids[i].entry_id) for i in (2, 4, 6, 9)]
    assert [(r[0], r[1]) for r in rows] == want
    assert [r[2] for r in rows] == [None, b"c", b"a", b"d"]
    r = client.create_reader(topic, "earliest")
    got = [r.read_next(timeout=10).message_id for _ in items]
    assert got == ids and not r.has_message_available()
    assert client.admin.compaction_status(topic).job_id == job_id


def test_second_compaction_while_one_runs_is_refused(client, topic):
    """K11: the running job's id comes back in the error."""
    produce(client, topic, [(f"k{i}", f"v{i}") for i in range(50)])
    first = client.admin.compact(topic)
    with pytest.raises(errors.CompactionInProgress) as exc:
        client.admin.compact(topic)
    assert first in str(exc.value)
    assert wait_done(client, topic, first).phase == "done"
    second = client.admin.compact(topic)  # once it ended, a new one runs
    assert second != first and wait_done(client, topic, second).phase == "done"


def test_compacting_an_empty_topic_creates_no_ledger(client, source, topic):
    """K6: DONE, no pointer, no compacted ledger; later messages still read."""
    client.admin.create_topic(topic)
    job_id = client.admin.compact(topic)
    assert wait_done(client, topic, job_id).phase == "done"
    st = Storage(os.path.join(source.data_dir, "storage"))
    assert st.list_subdirs(Storage.topic_compacted_dir(TopicName.parse(topic))) == []
    ids = produce(client, topic, [("k", "v")])
    assert client.create_reader(topic, "earliest").read_next(timeout=10).message_id == ids[0]


def test_recompaction_is_incremental_and_equals_a_full_one(client, source, etcd_server, topic):
    """K12: the second job reads the first one's compacted ledger plus only the ledgers
    sealed since; its result is what compacting everything gives."""
    client.admin.create_topic(topic, policies=DROP_DELETES)
    first_items = [(f"k{i % 7}", f"v{i}") for i in range(40)]
    ids = produce(client, topic, first_items)
    j1 = client.admin.compact(topic)
    assert wait_done(client, topic, j1).phase == "done"
    more = [(f"k{i % 11}", f"w{i}") for i in range(30)] + [("k3", "")]
    ids += produce(client, topic, more)
    j2 = client.admin.compact(topic)
    s2 = wait_done(client, topic, j2)
    assert s2.phase == "done" and s2.previous_job_id == j1
    ptr = pointer(etcd_server, topic)
    assert ptr.manifest.previous_job_id == j1
    assert list(ptr.manifest.input_ledgers) == [ids[-1].ledger_id]  # only the new ledger
    latest = {}
    for mid, (k, v) in zip(ids, first_items + more):
        latest[k] = (mid, v)
    want = sorted((mid.ledger_id, mid.entry_id) for k, (mid, v) in latest.items() if v)
    assert [(r[0], r[1]) for r in compacted_rows(source, ptr)] == want


def test_threshold_policy_compacts_by_itself(client, etcd_server, topic):
    """K13: with compaction_threshold_bytes set, the owner files a job once the bytes after
    the horizon exceed it."""
    client.admin.create_topic(topic, policies=Policies(compaction_threshold_bytes=2000))
    produce(client, topic, [(f"k{i % 5}", "x" * 100) for i in range(40)])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ptr = pointer(etcd_server, topic)
        if ptr is not None:
            break
        time.sleep(0.3)
    assert ptr is not None, "the threshold never triggered a compaction"
    status = client.admin.compaction_status(topic)
    assert status.trigger == "threshold" and status.keys == 5


def test_cli_compact_and_wait(client, source, topic):
    """K14 through the CLI: `topics compact` prints the job id, `compaction-status -w`
    follows it (JSON lines off a terminal) and exits 0; a failed job exits 1 with a
    one-line error."""
    produce(client, topic, [(f"k{i % 3}", f"v{i}") for i in range(20)])
    exe = os.path.join(os.path.dirname(sys.executable), "shadowtopic")
    env = dict(os.environ, SHADOWTOPIC_URL=source.url)

    def cli(*args):
        return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120,
                              env=env, stdin=subprocess.DEVNULL)

    res = cli("topics", "compact", topic)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    res = cli("topics", "compaction-status", topic, "-w")
    assert res.returncode == 0, res.stderr
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert lines[-1]["job_id"] == job_id and lines[-1]["phase"] == "done"
    assert lines[-1]["keys"] == 3
    res = cli("topics", "compaction-status", topic, "-o", "json")
    assert res.returncode == 0 and json.loads(res.stdout)["phase"] == "done"


def test_failed_job_is_recorded_and_the_cli_exits_non_zero(client, source, etcd_server,
                                                          cluster, topic):
    """K14: a job that cannot read its input ends FAILED with its error in the record; the
    pointer stays as it was; `compaction-status` exits 1 with one error line."""
    ids = produce(client, topic, [("k", "v1"), ("k", "v2")])
    client.admin.roll_ledger(topic)
    name = TopicName.parse(topic)
    job_id = f"{int(time.time() * 1000):013d}-deadbeef"
    req = mpb.CompactionRequest(topic=topic, job_id=job_id, trigger="admin",
                                storage_root=os.path.join(source.data_dir, "nowhere"),
                                horizon=ids[-1].to_pb())
    etcd_put(etcd_server, keys.compaction_request(cluster, name), req.SerializeToString())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            status = client.admin.compaction_status(topic)
            if status.phase == "failed":
                break
        except errors.CompactionNotFound:
            pass
        time.sleep(0.2)
    assert status.job_id == job_id and status.phase == "failed"
    assert status.error is not None and status.error.reason in ("DataLoss", "Internal")
    assert pointer(etcd_server, topic) is None
    exe = os.path.join(os.path.dirname(sys.executable), "shadowtopic")
    res = subprocess.run([exe, "topics", "compaction-status", topic], capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL,
                         env=dict(os.environ, SHADOWTOPIC_URL=source.url))
    assert res.returncode == 1
    assert res.stderr.startswith("error: compaction job") and res.stderr.count("\n") == 1


def test_compacting_a_shadow_is_refused(client, topic):
    """A shadow reads its source's compacted ledger: compacting it is NotAllowed."""
    client.admin.create_topic(topic)
    shadow = topic + "-shadow"
    client.admin.create_shadow_topic(shadow, topic)
    with pytest.raises(errors.NotAllowed):
        client.admin.compact(shadow)


# ---- reading the compacted view (read_compacted) ---------------------------------------------

def compacted_ids(client, topic: str, start="earliest", inclusive=False, limit=10_000):
    """Every id a compacted reader from `start` reads, until has_message_available says
    the end was reached (K9: the loop ends)."""
    out = []
    with client.create_reader(topic, start, inclusive=inclusive, read_compacted=True) as r:
        while len(out) < limit and r.has_message_available():
            out.append(r.read_next(timeout=10).message_id)
    return out


def test_compacted_reader_crosses_the_horizon(client, source, topic):
    """K1, K7, K8, K9 through the client: the compacted prefix (latest per key, ids kept),
    then everything produced after the horizon; a start at a compacted-away id lands on the
    next survivor; the read loop ends although the last compacted messages were
    tombstones; plain readers still read everything (K3)."""
    client.admin.create_topic(topic, policies=DROP_DELETES)
    items = [("a", "a1"), ("b", "b1"), ("a", "a2"), ("c", "c1"), ("b", "b2"), ("c", ""),
             ("d", "d1"), ("d", "")]
    ids = produce(client, topic, items)
    assert wait_done(client, topic, client.admin.compact(topic)).phase == "done"
    survivors = [ids[2], ids[4]]                       # a2, b2 (c and d deleted)
    assert compacted_ids(client, topic) == survivors
    assert client.admin.last_message_id(topic, read_compacted=True) == ids[4]
    assert client.admin.last_message_id(topic) == ids[-1]
    more = produce(client, topic, [("a", "a3"), ("e", "")])
    assert compacted_ids(client, topic) == survivors + more  # the raw tail, tombstone too
    assert compacted_ids(client, topic, ids[0]) == [ids[2], ids[4]] + more  # after a1
    assert compacted_ids(client, topic, ids[3], inclusive=True) == [ids[4]] + more
    assert compacted_ids(client, topic, ids[5]) == more  # beyond the last compacted entry
    with client.create_reader(topic, "earliest") as r:
        assert [r.read_next(timeout=10).message_id for _ in ids + more] == ids + more
    msg = next(m for m in [client.create_reader(topic, ids[1], inclusive=True,
                                                read_compacted=True).read_next(timeout=10)])
    assert (msg.key, msg.payload) == (b"a", b"a2")


def test_k19_a_compacted_read_opened_after_done_reads_that_jobs_view(etcd_server, tmp_path,
                                                                  cluster, worker, topic):
    """K19, read your writes: once the job's status says done, a compacted read opened on a
    broker whose watches are slow (every watch event held 3 s by the failpoint) reads that
    job's compacted ledger, not the one before it (the view reads the pointer on open)."""
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "slow-watches"), free_port(),
                      extra_args=["--lease-ttl", "3", "--cluster", cluster],
                      env=failpoints.env({"metadata.watch.events": "sleep(3)"}))
    b.start(timeout=60)
    try:
        with Client(b.url, timeout=30) as c:
            c.admin.create_topic(topic, policies=DROP_DELETES)
            first = produce(c, topic, [("a", "a1"), ("b", "b1")])
            assert wait_done(c, topic, c.admin.compact(topic)).phase == "done"
            assert compacted_ids(c, topic) == first  # the view follows the pointer from now
            more = produce(c, topic, [("a", "a2"), ("b", "")])
            assert wait_done(c, topic, c.admin.compact(topic)).phase == "done"
            assert compacted_ids(c, topic) == [more[0]]  # a2; b deleted: the second job's
            assert c.admin.last_message_id(topic, read_compacted=True) == more[0]
    finally:
        b.kill()


def test_cli_reads_the_compacted_view(client, source, topic):
    client.admin.create_topic(topic, policies=DROP_DELETES)
    ids = produce(client, topic, [("k", "v1"), ("k", "v2"), ("j", "x"), ("j", "")])
    assert wait_done(client, topic, client.admin.compact(topic)).phase == "done"
    exe = os.path.join(os.path.dirname(sys.executable), "shadowtopic")
    res = subprocess.run([exe, "read", topic, "--compacted", "--until-end", "-o", "json"],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                         env=dict(os.environ, SHADOWTOPIC_URL=source.url))
    assert res.returncode == 0, res.stderr
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert [x["message_id"] for x in lines] == [str(ids[1])]


def test_shadows_read_the_sources_compacted_view(etcd_server, tmp_path, cluster, worker,
                                                 client, source, topic):
    """K10: a shadow (served by a shadow broker) reads the source's compacted ledger: the
    same view, and no compaction runs for the shadow."""
    ids = produce(client, topic, [(f"k{i % 4}", f"v{i}") for i in range(20)])
    job = client.admin.compact(topic)
    assert wait_done(client, topic, job).phase == "done"
    shadow = topic + "-shadow"
    client.admin.create_shadow_topic(shadow, topic)
    sh = BrokerProcess(etcd_server.endpoint, str(tmp_path / "shadow-broker"), free_port(),
                       extra_args=["--lease-ttl", "3", "--cluster", cluster, "--storage-root",
                                   os.path.join(source.data_dir, "storage")],
                       module="shadowtopic.shadow.broker")
    sh.start(timeout=60)
    try:
        want = compacted_ids(client, topic)
        assert want == ids[-4:]
        assert compacted_ids(client, shadow) == want
        with Client(sh.url, timeout=30) as c2:
            assert compacted_ids(c2, shadow) == want
        with pytest.raises(errors.NotAllowed):
            client.admin.compact(shadow)
        assert client.admin.compaction_status(topic).job_id == job
    finally:
        sh.kill()


def test_compacted_view_survives_restart_and_raw_retention(etcd_server, tmp_path, cluster,
                                                           worker, topic):
    """K15: after a broker restart and a truncate of every raw ledger, a compacted reader
    still reads the compacted prefix (then the new raw tail)."""
    args = ["--lease-ttl", "3", "--cluster", cluster]
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "b"), free_port(), extra_args=args)
    b.start(timeout=60)
    try:
        with Client(b.url, timeout=30) as c:
            ids = produce(c, topic, [(f"k{i % 3}", f"v{i}") for i in range(12)])
            assert wait_done(c, topic, c.admin.compact(topic)).phase == "done"
        b.kill()
        b.start(timeout=60)
        with Client(b.url, timeout=30) as c:
            assert c.admin.compaction_status(topic).phase == "done"  # K14: the record stays
            assert compacted_ids(c, topic) == ids[-3:]
            assert c.admin.truncate(topic)["ledgersDeleted"] >= 1
            with c.create_reader(topic, "earliest") as r:
                assert not r.has_message_available()  # the raw ledgers are gone
            more = produce(c, topic, [("k0", "new")])
            assert compacted_ids(c, topic) == ids[-3:] + more
    finally:
        b.kill()


def test_pointer_to_a_missing_ledger_fails_compacted_reads_only(client, source, etcd_server,
                                                                 topic):
    """K17: compacted reads fail with DATA_LOSS; plain reads go on."""
    ids = produce(client, topic, [("k", "v1"), ("k", "v2")])
    assert wait_done(client, topic, client.admin.compact(topic)).phase == "done"
    ptr = pointer(etcd_server, topic)
    ptr.job_id = "gone"
    ptr.manifest.files[0].path = ptr.manifest.files[0].path.replace(".parquet", "-gone.parquet")
    etcd_put(etcd_server, keys.compaction(TopicName.parse(topic)), ptr.SerializeToString())
    deadline = time.monotonic() + 20
    while True:
        try:
            with client.create_reader(topic, "earliest", read_compacted=True) as r:
                r.read_next(timeout=5)
        except errors.DataLoss as exc:
            assert "missing" in str(exc)
            break
        assert time.monotonic() < deadline, "compacted reads never failed"
        time.sleep(0.2)
    with client.create_reader(topic, "earliest") as r:
        assert [r.read_next(timeout=10).message_id for _ in ids] == ids


def test_compacted_subscriptions(client, source, topic):
    """Durable subscriptions with read_compacted (Exclusive / Failover, as in Pulsar): the
    compacted prefix then the raw tail, acknowledged and resumed like any subscription;
    Shared is refused; a consumer that reads differently cannot join."""
    client.admin.create_topic(topic, policies=DROP_DELETES)
    ids = produce(client, topic, [(f"k{i % 3}", f"v{i}") for i in range(9)] + [("k0", "")])
    assert wait_done(client, topic, client.admin.compact(topic)).phase == "done"
    more = produce(client, topic, [("k1", "new")])
    c = client.subscribe(topic, "snap", initial_position="earliest", read_compacted=True)
    got = [c.receive(timeout=10) for _ in range(3)]
    assert [m.message_id for m in got] == [ids[7], ids[8], more[0]]  # k1 v7, k2 v8, new
    c.acknowledge(got[0])
    with pytest.raises(errors.ConsumerBusy):
        client.subscribe(topic, "snap", read_compacted=False)
    c.close()
    c = client.subscribe(topic, "snap", read_compacted=True)  # resumes after the ack
    assert c.receive(timeout=10).message_id == ids[8]
    c.close()
    with pytest.raises(errors.InvalidArgument):
        client.subscribe(topic, "shared-one", consumer_type="shared", read_compacted=True)
    assert "shared-one" not in client.admin.list_subscriptions(topic)
    many = client.subscribe_many(topic, [f"s{i}" for i in range(5)],
                                 initial_position="earliest", read_compacted=True)
    for m in many:
        assert [m.receive(timeout=10).message_id for _ in range(3)] == \
            [ids[7], ids[8], more[0]]


def test_retention_keeps_what_compaction_has_not_read(client, source, topic):
    """With retention deleting every sealed ledger at once, the ledgers sealed after the
    compaction horizon stay until a compaction read them (as Pulsar's compaction cursor
    holds them); the compacted view then has every key."""
    client.admin.create_topic(topic, policies=Policies(retention_time_seconds=0,
                                                       retention_size_bytes=0))
    first = produce(client, topic, [("a", "a1"), ("b", "b1")])
    assert wait_done(client, topic, client.admin.compact(topic)).phase == "done"
    second = produce(client, topic, [("a", "a2"), ("c", "c1")])
    client.admin.roll_ledger(topic)
    time.sleep(3)  # retention passes run every second on this broker
    ledgers = [x["ledgerId"] for x in client.admin.internal_stats(topic)["ledgers"]]
    assert str(second[0].ledger_id) in map(str, ledgers), ledgers
    assert wait_done(client, topic, client.admin.compact(topic)).phase == "done"
    assert compacted_ids(client, topic) == [first[1], second[0], second[1]]


def test_keyless_messages_dropped_by_policy(client, topic):
    """K5 with the topic's policy: retain_null_key false drops keyless messages."""
    client.admin.create_topic(topic, policies=Policies(retain_null_key=False))
    ids = produce(client, topic, [(None, "free"), ("k", "v"), (None, "free2")])
    assert wait_done(client, topic, client.admin.compact(topic)).phase == "done"
    assert compacted_ids(client, topic) == [ids[1]]


def test_a_deleted_topic_leaves_no_files(client, source, topic):
    """Deleting a compacted topic removes its compacted ledgers, its sealed ledgers, its WAL
    and cursor files and their folders (a new user found the compacted Parquet and empty
    folders still on disk well after the collection grace period)."""
    client.admin.create_topic(topic, policies=DROP_DELETES)
    produce(client, topic, [("a", "a1"), ("b", "b1"), ("a", "a2")])
    client.admin.create_subscription(topic, "s")
    assert wait_done(client, topic, client.admin.compact(topic)).phase == "done"
    produce(client, topic, [("c", "c1")])  # an open ledger with a WAL
    root = os.path.join(source.data_dir, "storage")
    name = TopicName.parse(topic)
    folders = [os.path.join(root, d) for d in (Storage.topic_sealed_dir(name),
                                               Storage.topic_wal_dir(name),
                                               Storage.topic_compacted_dir(name))]
    assert all(os.listdir(d) for d in folders), [(d, os.path.exists(d)) for d in folders]
    client.admin.delete_topic(topic, force=True)
    left = [d for d in folders if os.path.exists(d)]
    assert left == []
    topic_dir = Storage.topic_sealed_dir(name).split("/", 1)[1]  # persistent/<t>/<ns>/<local>
    files = [os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs
             if topic_dir in os.path.join(dp, f)]
    assert files == []
