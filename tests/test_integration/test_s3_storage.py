"""Ledgers on a real S3 API (issue 21, item 2): a source broker and a shadow broker on one
`s3://bucket/prefix` storage root served by moto's server process (s3_support.py), each
with its open ledgers' WALs in its own data dir. Sealed ledgers and cursor snapshots land in
the bucket, reads come back from it, a kill -9 keeps every acknowledged cursor, and a
shadow reads the source's sealed ledgers from the bucket.

One module-scoped fixture (moto, one bucket, a source broker, a shadow broker, a cluster of
their own) serves every test; each test uses topics of its own. A compaction worker of the
pair's cluster (`s3_worker`) compacts a topic over the bucket, and the source and its shadow
both read the compacted view from it. (That test hung in about 1 run of 8 while a request's
horizon could pass a ledger still being sealed: test_compaction_horizon.py.)
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid

import pytest
from support.compaction_support import WORKER_ARGS, wait_done
from support.s3_support import MotoS3
from support.waiting import wait_cursors_saved

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client, Policies, errors
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.storage import Storage
from shadowtopic.standalone import BrokerProcess

PREFIX = "cluster-a"
FLUSH = "0.2"  # cursor flush interval: snapshots reach the bucket soon after acks


class S3Pair:
    def __init__(self, moto: MotoS3, bucket: str, cluster: str, src: BrokerProcess,
                 sh: BrokerProcess):
        self.moto, self.bucket, self.cluster, self.src, self.sh = moto, bucket, cluster, src, sh

    @property
    def root(self) -> str:
        return f"s3://{self.bucket}/{PREFIX}"

    def keys(self, under: str) -> list[str]:
        """Object keys under `<prefix>/<under>`, relative to the root."""
        return [k[len(PREFIX) + 1:] for k in self.moto.keys(self.bucket, f"{PREFIX}/{under}")]


@pytest.fixture(scope="module")
def s3(etcd_server, tmp_path_factory):
    base = tmp_path_factory.mktemp("s3")
    with MotoS3(str(base)) as moto:
        bucket = moto.new_bucket()
        cluster = f"c-{uuid.uuid4().hex[:8]}"
        args = ["--lease-ttl", "3", "--cluster", cluster,
                "--storage-root", f"s3://{bucket}/{PREFIX}", "--cursor-flush-interval", FLUSH,
                *moto.s3_args()]
        src = BrokerProcess(etcd_server.endpoint, str(base / "src"), free_port(),
                            extra_args=args, env=moto.env)
        sh = BrokerProcess(etcd_server.endpoint, str(base / "sh"), free_port(),
                           extra_args=args, env=moto.env, module="shadowtopic.shadow.broker")
        try:
            src.start(timeout=60)
            sh.start(timeout=60)
            yield S3Pair(moto, bucket, cluster, src, sh)
        finally:
            for b in (src, sh):
                b.kill()


def topic_name() -> str:
    return f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"


def read_all(url: str, topic: str, n: int) -> list:
    with Client(url, timeout=30) as c, c.create_reader(topic, start="earliest") as r:
        return [r.read_next(timeout=60) for _ in range(n)]  # moto under load


def wal_files(data_dir: str) -> list[str]:
    out = []
    for d, _, names in os.walk(os.path.join(data_dir, "wal")):
        out += [os.path.relpath(os.path.join(d, n), data_dir) for n in names
                if n.endswith(".wal")]
    return sorted(out)


def test_sealed_ledgers_land_in_the_bucket_and_read_back(s3):
    topic = topic_name()
    tdir = Storage.topic_sealed_dir(TopicName.parse(topic))
    with Client(s3.src.url, timeout=30) as c:
        c.admin.create_topic(topic)
        with c.create_producer(topic) as p:
            first = [p.send(f"m{i}".encode(), key=f"k{i % 5}") for i in range(60)]
        # the open ledger's acknowledged entries are in the broker's local WAL, not the bucket
        assert not s3.keys(tdir)
        wals = wal_files(s3.src.data_dir)
        assert len(wals) == 1 and wals[0].endswith(f"/{first[0].ledger_id}.wal"), wals
        assert not s3.keys("wal")
        sealed = c.admin.roll_ledger(topic)
        assert int(sealed["ledgerId"]) == first[0].ledger_id
        assert s3.keys(tdir) == [sealed["path"]]  # one Parquet object per sealed ledger
        # named by the ledger and the sealing owner's epoch (storage.py)
        assert re.fullmatch(rf"{tdir}/{first[0].ledger_id}-\d+\.parquet", sealed["path"])
        with c.create_producer(topic) as p:  # a new open ledger after the seal
            second = [p.send(f"n{i}".encode()) for i in range(20)]
        assert second[0].ledger_id > first[0].ledger_id
    got = read_all(s3.src.url, topic, 80)
    assert [m.message_id for m in got] == first + second
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(60)] + \
        [f"n{i}".encode() for i in range(20)]
    assert [m.key for m in got[:60]] == [f"k{i % 5}".encode() for i in range(60)]
    # the sealed ledger's WAL is gone from the local disk once sealed
    left = wal_files(s3.src.data_dir)
    assert not [w for w in left if w.endswith(f"/{first[0].ledger_id}.wal")], left


def test_a_shadow_reads_the_sealed_ledgers_from_the_bucket(s3):
    topic = topic_name()
    shadow = topic + "-shadow"
    with Client(s3.src.url, timeout=30) as c:
        c.admin.create_topic(topic, policies=Policies(ledger_max_entries=25))
        with c.create_producer(topic) as p:
            ids = [p.send(f"m{i}".encode(), key=f"k{i}") for i in range(70)]
        c.admin.roll_ledger(topic)  # every entry sealed: the shadow reads the bucket only
        c.admin.create_shadow_topic(shadow, topic)
        assert c.admin.lookup(shadow)["brokerUrl"] == s3.sh.url
        with c.subscribe(shadow, "s", initial_position="earliest") as cons:
            got = []
            for _ in range(70):
                m = cons.receive(timeout=15)
                got.append(m)
                cons.acknowledge(m)
            assert [m.message_id for m in got] == ids  # the source's ids
            assert [m.payload for m in got] == [f"m{i}".encode() for i in range(70)]
            with pytest.raises(errors.Timeout):
                cons.receive(timeout=0.3)
    tdir = Storage.topic_sealed_dir(TopicName.parse(topic))
    in_bucket = {k.rsplit("-", 1)[0] for k in s3.keys("ledgers")}  # <ledger>-<epoch>.parquet
    assert {f"{tdir}/{lid}" for lid in {i.ledger_id for i in ids}} <= in_bucket
    assert wal_files(s3.sh.data_dir) == []  # the shadow broker writes no WAL
    # the shadow's subscription keeps its cursor in the bucket too
    shadow_cursors = Storage.topic_sealed_dir(TopicName.parse(shadow)).replace(
        "ledgers/", "cursors/", 1)
    deadline = time.monotonic() + 20
    while not s3.keys(shadow_cursors):
        assert time.monotonic() < deadline, "no cursor snapshot of the shadow in the bucket"
        time.sleep(0.1)


def test_cursors_in_the_bucket_survive_kill_9(s3):
    topic = topic_name()
    cursors = Storage.topic_sealed_dir(TopicName.parse(topic)).replace("ledgers/", "cursors/", 1)
    with Client(s3.src.url, timeout=30) as c:
        c.admin.create_topic(topic, policies=Policies(ledger_max_entries=30))
        with c.create_producer(topic) as p:
            ids = [p.send(f"m{i}".encode()) for i in range(80)]
        with c.subscribe(topic, "durable", initial_position="earliest") as cons:
            for i in range(50):
                m = cons.receive(timeout=15)
                assert m.message_id == ids[i]
                cons.acknowledge(m)
            deadline = time.monotonic() + 20
            while c.admin.stats(topic)["subscriptions"]["durable"]["msgBacklog"] != 30:
                assert time.monotonic() < deadline, "the acks did not arrive"
                time.sleep(0.1)
        wait_cursors_saved(c, topic)  # the snapshot is written
    assert s3.keys(cursors), "no cursor snapshot in the bucket"
    s3.src.kill()
    s3.src.start(timeout=60)  # same data dir: its local WAL holds the open ledger
    with Client(s3.src.url, timeout=30) as c:
        assert c.admin.stats(topic)["subscriptions"]["durable"]["msgBacklog"] == 30
        with c.subscribe(topic, "durable") as cons:
            got = [cons.receive(timeout=15) for _ in range(30)]
            assert [m.message_id for m in got] == ids[50:]
    assert [m.message_id for m in read_all(s3.src.url, topic, 80)] == ids
    # the open ledger the kill left in the local WAL was sealed into the bucket on restart
    last = f"{Storage.topic_sealed_dir(TopicName.parse(topic))}/{ids[-1].ledger_id}-"
    deadline = time.monotonic() + 20
    while not any(k.startswith(last) for k in s3.keys("ledgers")):
        assert time.monotonic() < deadline, f"{last} not sealed into the bucket"
        time.sleep(0.1)


def test_a_broker_on_a_missing_bucket_stops_with_one_error_line(s3, etcd_server, tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "shadowtopic.broker", "--etcd", etcd_server.endpoint,
         "--data-dir", str(tmp_path / "d"), "--port", str(free_port()), "--metrics-port", "-1",
         "--storage-root", f"s3://no-such-bucket-{uuid.uuid4().hex[:6]}/p",
         *s3.moto.s3_args()],
        capture_output=True, text=True, timeout=60, env=dict(os.environ, **s3.moto.env),
        stdin=subprocess.DEVNULL)
    assert res.returncode == 1, res.stderr
    errs = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errs) == 1 and "no bucket" in errs[0], res.stderr


def test_a_malformed_s3_endpoint_is_refused(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "shadowtopic.broker", "--data-dir", str(tmp_path / "d"),
         "--storage-root", "s3://b/p", "--s3-endpoint", "ftp://127.0.0.1:9000"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode == 2, res.stderr
    assert "--s3-endpoint" in res.stderr and "http(s)://HOST[:PORT]" in res.stderr, res.stderr


@pytest.fixture(scope="module")
def s3_worker(s3, etcd_server, tmp_path_factory):
    """A compaction worker of the pair's cluster, with the same S3 flags and credentials."""
    w = BrokerProcess(etcd_server.endpoint, str(tmp_path_factory.mktemp("s3-worker")),
                      free_port(), module="shadowtopic.compaction.worker", env=s3.moto.env,
                      extra_args=[*WORKER_ARGS, "--cluster", s3.cluster, *s3.moto.s3_args()])
    w.start(timeout=180)
    try:
        yield w
    finally:
        w.kill()


def test_compaction_reads_and_writes_the_bucket_and_both_brokers_read_it(s3, s3_worker):
    """The Spark job's tasks read the sealed ledgers from the bucket and write the compacted
    ledger there; the source and its shadow serve the compacted view from it."""
    topic = topic_name()
    shadow = topic + "-shadow"
    items = [("a", "a1"), ("b", "b1"), ("a", "a2"), ("c", "c1"), ("b", "b2"), ("a", "a3")]
    with Client(s3.src.url, timeout=30) as c:
        c.admin.create_topic(topic, policies=Policies(ledger_max_entries=4))
        c.admin.create_shadow_topic(shadow, topic)
        with c.create_producer(topic) as p:
            ids = [p.send(v.encode(), key=k) for k, v in items]
        job_id = c.admin.compact(topic)
        status = wait_done(c, topic, job_id, timeout=180)
        assert status.phase == "done", status.error
        assert status.horizon == ids[-1]
        want = [(ids[i], items[i][1].encode()) for i in (3, 4, 5)]  # c1, b2, a3 in id order
        for url, name in ((s3.src.url, topic), (s3.sh.url, shadow)):
            with Client(url, timeout=30) as cc, \
                    cc.create_reader(name, "earliest", read_compacted=True) as r:
                got = [r.read_next(timeout=60) for _ in want]  # moto and Spark under load
                assert [(m.message_id, m.payload) for m in got] == want, name
    compacted = Storage.compacted_rel(TopicName.parse(topic), job_id)
    objects = s3.keys(compacted)
    assert f"{compacted}/manifest.pb" in objects, objects
    assert [o for o in objects if o.rsplit("/", 1)[1].startswith("part-")], objects
