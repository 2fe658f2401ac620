"""The write-ahead log on object storage (issue 33): two source brokers of one cluster with
`--wal s3://...` on moto's S3 server (s3_support.py) and the ledgers under an S3 root. A
produce is acknowledged once its flush window's object is written and committed in etcd;
kill -9 of the owner plus the loss of its whole data dir loses nothing acknowledged: the
other broker takes the topic, rebuilds the open ledger from the commits, and the producer
carries on there exactly once (idempotent producing across the move)."""
from __future__ import annotations

import shutil
import time
import uuid

import pytest
from support.produce import send_pipelined
from support.s3_support import MotoS3

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client
from shadowtopic.standalone import BrokerProcess


@pytest.fixture
def moto(tmp_path):
    with MotoS3(str(tmp_path)) as m:
        yield m


def brokers(etcd, moto: MotoS3, tmp_path, n: int = 2, extra: tuple[str, ...] = ()
            ) -> list[BrokerProcess]:
    bucket = moto.new_bucket()
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    args = ["--lease-ttl", "2", "--cluster", cluster, "--storage-root", f"s3://{bucket}/root",
            "--wal", f"s3://{bucket}/wal", *moto.s3_args(), *extra]
    return [BrokerProcess(etcd.endpoint, str(tmp_path / f"b{i}"), free_port(), extra_args=args,
                          env=moto.env) for i in range(n)]


def test_the_owners_machine_lost_with_its_disk_loses_nothing_acknowledged(etcd_server, moto,
                                                                           tmp_path):
    a, b = brokers(etcd_server, moto, tmp_path)
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"
    try:
        a.start(timeout=60)
        b.start(timeout=60)
        first = [f"m{i}" for i in range(300)]
        with Client(a.url, timeout=30) as c:
            c.admin.create_topic(topic)
            with c.create_producer(topic, producer_name="p1") as p:
                ids = send_pipelined(p, first[:100])
                c.admin.roll_ledger(topic)  # one ledger sealed from its objects
                ids += send_pipelined(p, first[100:])
        assert len(set(ids)) == 300
        wal_objects = moto.keys(moto_bucket(a), "wal/")
        assert wal_objects, "no WAL object was written"
        a.kill()
        shutil.rmtree(a.data_dir)
        with Client(b.url, timeout=60) as c:
            with c.create_reader(topic, start="earliest") as r:
                got = [r.read_next(timeout=60) for _ in range(300)]
                assert [m.payload.decode() for m in got] == first
                assert [m.message_id for m in got] == ids
                assert not r.has_message_available()
            with c.create_producer(topic, producer_name="p1") as p:
                more = send_pipelined(p, ["n0", "n1"])
            with c.create_reader(topic, start="earliest") as r:
                vals = [r.read_next(timeout=30).payload.decode() for _ in range(302)]
                assert vals == first + ["n0", "n1"]
                assert not r.has_message_available()
        assert more[0] > ids[-1]
    finally:
        for x in (a, b):
            x.kill()


def moto_bucket(b: BrokerProcess) -> str:
    root = b.extra_args[b.extra_args.index("--storage-root") + 1]
    return root[len("s3://"):].split("/", 1)[0]


def test_source_topics_spread_over_the_source_brokers(etcd_server, moto, tmp_path):
    """Every topic looked up through one broker: once it serves two topics more than the
    other, the lookup names the other (source/metadata/placement.py, `pick_source`), and the
    client produces there."""
    a, b = brokers(etcd_server, moto, tmp_path)
    try:
        a.start(timeout=60)
        b.start(timeout=60)
        ns = f"persistent://public/ns-{uuid.uuid4().hex[:8]}"
        owners = []
        with Client(a.url, timeout=30) as c:
            for i in range(6):
                t = f"{ns}/t{i}"
                c.admin.create_topic(t)
                with c.create_producer(t) as p:
                    p.send(b"x")
                owners.append(c.admin.lookup(t)["brokerUrl"])
        assert owners.count(b.url) == 2 and owners.count(a.url) == 4, owners
    finally:
        for x in (a, b):
            x.kill()


def test_a_source_broker_that_joins_takes_its_share_by_load_shedding(etcd_server, moto,
                                                                     tmp_path):
    """Six source topics on one broker (both with the WAL on object storage and
    `--load-shedding-interval`): a second broker joins, and the first gives up a topic at a
    time (source/broker/shedding.py) until they serve three each, while an idempotent
    producer per topic goes on sending through a client given both brokers. Every
    acknowledged message is read back exactly once, in order, at its acknowledged id."""
    a, b = brokers(etcd_server, moto, tmp_path, extra=("--load-shedding-interval", "0.5"))
    ns = f"persistent://public/ns-{uuid.uuid4().hex[:8]}"
    topics = [f"{ns}/t{i}" for i in range(6)]
    sent: dict[str, list[tuple[str, object]]] = {t: [] for t in topics}
    try:
        a.start(timeout=60)
        with Client(f"{a.url},{b.url}", timeout=30, operation_timeout=60) as c:
            for t in topics:
                c.admin.create_topic(t)
            producers = {t: c.create_producer(t, producer_name=f"p{i}")
                         for i, t in enumerate(topics)}

            def send_round(k: int) -> None:
                for i, t in enumerate(topics):
                    values = [f"{i}-{k}-{j}" for j in range(5)]
                    sent[t] += zip(values, send_pipelined(producers[t], values), strict=True)

            def owners() -> list[str]:
                return [c.admin.lookup(t).get("brokerUrl", "") for t in topics]

            send_round(0)
            assert owners() == [a.url] * 6
            b.start(timeout=60)
            k = 1
            deadline = time.monotonic() + 90
            while sorted(owners()) != sorted([a.url] * 3 + [b.url] * 3):
                assert time.monotonic() < deadline, f"not balanced: {owners()}"
                send_round(k)  # the producers follow each topic that moves
                k += 1
            assert k > 1
            send_round(k)
            for p in producers.values():
                p.close()
            for t in topics:
                with c.create_reader(t, start="earliest") as r:
                    got = [(m.payload.decode(), m.message_id)
                           for m in (r.read_next(timeout=30) for _ in sent[t])]
                    assert got == sent[t], t
                    assert not r.has_message_available()
    finally:
        for x in (a, b):
            x.kill()
