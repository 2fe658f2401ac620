"""Issue 21: etcd as a 3-member cluster that loses a member, and the CLI that shows brokers.

One module-scoped world: a 3-member etcd (`EtcdCluster`, three processes on loopback), a
source broker and a shadow broker both started with all three endpoints (`--etcd a,b,c`),
on one storage root. Which member each broker talks to is read from the members' own
metrics (the LeaseKeepAlive streams each member started: only the brokers keep leases
alive here). That member is killed (kill -9) while a producer, a reader of the source and a
reader of the shadow stay open: produce and reads go on, an admin call works, both brokers
keep their leases (the same lease in their registrations, nothing fenced), a shadow created
after the kill gets the messages (the source broker's watch of its shadow list followed the
failover), and the member restarts into the cluster. When the two brokers talk to different
members, the shadow broker's member is lost next, the same way.

`shadowtopic brokers list` and `shadowtopic topics lookup` run as a user runs them.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass

import pytest
from support.waiting import wait_for

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client
from shadowtopic.metadata import EtcdStore, keys
from shadowtopic.metadata.etcd_server import EtcdCluster, EtcdServer
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.standalone import BrokerProcess

pytestmark = [pytest.mark.integration]

LEASE_TTL = 6  # a keepalive every 1.5 s, trusted for 4.8 s: longer than an etcd election
KEEPALIVE = re.compile(r'^grpc_server_started_total\{[^}]*grpc_method="LeaseKeepAlive"[^}]*\}'
                       r'\s+([0-9.e+]+)$', re.M)


@dataclass
class World:
    etcd: EtcdCluster
    cluster: str
    src: BrokerProcess
    sh: BrokerProcess
    src_member: EtcdServer
    sh_member: EtcdServer


def keepalives(etcd: EtcdCluster) -> dict[str, int]:
    """LeaseKeepAlive streams each running member has started (its /metrics)."""
    out = {}
    for m in etcd.members:
        if m.running():
            with urllib.request.urlopen(f"http://{m.endpoint}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            out[m.name] = int(sum(float(v) for v in KEEPALIVE.findall(text)))
    return out


def members_keeping_alive(etcd: EtcdCluster, at_least: int, intervals: float,
                          timeout: float = 30.0) -> set[str]:
    """The members whose LeaseKeepAlive count grows over a window of at least `intervals`
    keepalive intervals (a broker's is ttl/4), ended once `at_least` keepalives arrived."""
    before = keepalives(etcd)
    start = time.monotonic()
    while True:
        time.sleep(0.3)
        now = keepalives(etcd)
        grown = {name: now[name] - before.get(name, 0) for name in now}
        if (sum(grown.values()) >= at_least
                and time.monotonic() - start >= intervals * LEASE_TTL / 4):
            return {name for name, n in grown.items() if n > 0}
        assert time.monotonic() - start < timeout, f"keepalives: {before} -> {now}"


def registrations(etcd: EtcdCluster, cluster: str) -> dict[str, tuple[int, mpb.BrokerInfo]]:
    """broker url -> (lease, BrokerInfo) as registered in etcd."""
    async def read():
        store = EtcdStore(etcd.endpoints, timeout=3)
        try:
            return (await store.get_prefix(keys.brokers_prefix(cluster))).items
        finally:
            await store.close()
    out = {}
    for kv in asyncio.run(read()):
        info = mpb.BrokerInfo.FromString(kv.value)
        out[info.url] = (kv.lease, info)
    return out


def cli(*args: str, url: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
    exe = os.path.join(os.path.dirname(sys.executable), "shadowtopic")
    env = dict(os.environ, SHADOWTOPIC_URL=url) if url else dict(os.environ)
    env.pop("SHADOWTOPIC_ETCD", None)
    env.pop("COLUMNS", None)  # pytest-xdist's workers have COLUMNS=80: tables would be cut
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, stdin=subprocess.DEVNULL)


def cli_json(*args: str, url: str = ""):
    res = cli(*args, "-o", "json", url=url)
    assert res.returncode == 0, f"shadowtopic {' '.join(args)}: {res.stderr}"
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("etcd-cluster")
    etcd = EtcdCluster(root / "etcd").start()
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    args = ["--lease-ttl", str(LEASE_TTL), "--storage-root", str(root / "storage"),
            "--cluster", cluster]
    src = BrokerProcess(etcd.endpoints, str(root / "src"), free_port(), extra_args=args)
    sh = BrokerProcess(etcd.endpoints, str(root / "sh"), free_port(), extra_args=args,
                       module="shadowtopic.shadow.broker")
    try:
        src.start(timeout=60)
        # the source broker alone keeps a lease alive: its member is the one that grows
        (src_name,) = members_keeping_alive(etcd, at_least=2, intervals=0)
        sh.start(timeout=60)
        # two keepalive intervals hold at least one of the shadow broker's: a member
        # other than the source's that grows is the shadow broker's, else they share one
        others = members_keeping_alive(etcd, at_least=4, intervals=2) - {src_name}
        assert len(others) <= 1, others
        sh_name = others.pop() if others else src_name
        yield World(etcd, cluster, src, sh, etcd.member(src_name), etcd.member(sh_name))
    finally:
        for b in (src, sh):
            b.kill()
        etcd.close()


def test_the_cluster_helper_fails_over_between_its_members(tmp_path):
    """EtcdCluster's members form one cluster, and a store given the three endpoints goes
    on, without a failed call, when the member it talks to is killed (a follower here:
    no election to wait for) and when the leader is."""
    with EtcdCluster(tmp_path / "etcd") as etcd:
        assert len({m.endpoint for m in etcd.members}) == 3

        async def run():
            store = EtcdStore(etcd.endpoints, timeout=5)
            try:
                await store.put("/t/k", b"0")
                for i, victim in enumerate(["in use", "leader"], 1):
                    leader = etcd.leader()
                    if victim == "in use":
                        used = etcd.member_at(store._client._current_ep_label)
                        if used is leader:  # make a follower the one in use
                            follower = next(m for m in etcd.members if m is not leader)
                            store._client._current_endpoint_label = follower.endpoint
                            used = follower
                        await store.get("/t/k")
                        used.kill()
                        # not one failed call: the refused request goes to another member
                        await store.put("/t/k", str(i).encode())
                        assert (await store.get("/t/k")).value == str(i).encode()
                        used.restart()
                    else:
                        leader.kill()
                        deadline = time.monotonic() + 30
                        while True:  # an election: calls may time out until it is over
                            try:
                                await store.put("/t/k", str(i).encode())
                                break
                            except Exception:
                                assert time.monotonic() < deadline, "no leader elected"
                                await asyncio.sleep(0.2)
                        assert (await store.get("/t/k")).value == str(i).encode()
                        assert etcd.leader() is not leader
                        leader.restart()
            finally:
                await store.close()
        asyncio.run(run())
        assert all(m.running() for m in etcd.members)
        assert {etcd.status(m)[1] for m in etcd.members} == {etcd.status(etcd.leader())[0]}


def test_produce_and_reads_go_on_when_the_brokers_etcd_member_dies(world):
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"
    shadow = f"{topic}-shadow"
    victims = [world.src_member] + ([world.sh_member] if world.sh_member is not world.src_member
                                    else [])
    with Client(world.src.url, timeout=30) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(shadow, topic)
        with c.create_producer(topic) as p, \
                c.create_reader(topic, start="earliest") as r_src, \
                c.create_reader(shadow, start="earliest") as r_sh:
            sent = [p.send(f"before-{i}".encode()) for i in range(10)]

            def read(reader, n: int) -> list:
                return [(m.message_id.ledger_id, m.message_id.entry_id, m.payload)
                        for m in (reader.read_next(timeout=30) for _ in range(n))]

            want = [(x.ledger_id, x.entry_id, f"before-{i}".encode()) for i, x in enumerate(sent)]
            assert read(r_src, 10) == want
            assert read(r_sh, 10) == want
            leases = {url: lease for url, (lease, _) in
                      registrations(world.etcd, world.cluster).items()}
            assert set(leases) == {world.src.url, world.sh.url} and all(leases.values())

            for round_, victim in enumerate(victims):
                victim.kill()  # kill -9 the member a broker talks to
                sent = [p.send(f"r{round_}-{i}".encode()) for i in range(10)]
                want = [(x.ledger_id, x.entry_id, f"r{round_}-{i}".encode())
                        for i, x in enumerate(sent)]
                assert read(r_src, 10) == want
                assert read(r_sh, 10) == want
                # an admin call, through the CLI as a user makes it
                stats = cli_json("topics", "stats", topic, url=world.src.url)
                assert stats["msgInCounter"] >= 20 + 10 * round_
                # a shadow made now is served: the source broker's watch of its shadow
                # list followed the failover
                late = f"{topic}-late{round_}"
                c.admin.create_shadow_topic(late, topic)
                with c.create_reader(late, start="earliest") as r_late:
                    got = read(r_late, 20 + 11 * round_)
                    assert got[-10:] == want
                    x = p.send(f"after-{round_}".encode())
                    assert read(r_late, 1) == [(x.ledger_id, x.entry_id,
                                                f"after-{round_}".encode())]
                assert read(r_src, 1) == read(r_sh, 1) == [
                    (x.ledger_id, x.entry_id, f"after-{round_}".encode())]
                # both brokers kept their leases: no re-registration, nothing fenced
                now = registrations(world.etcd, world.cluster)
                assert {url: lease for url, (lease, _) in now.items()} == leases
                for b in (world.src, world.sh):
                    with open(b.log_path, errors="replace") as f:
                        assert "every owned topic is fenced" not in f.read(), b.log_tail()
                victim.restart()  # it rejoins on its data dir
                assert world.etcd.leader() is not None
    assert all(m.running() for m in world.etcd.members)


def test_brokers_list_shows_each_broker_with_its_load(world):
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"
    shadow = f"{topic}-shadow"
    with Client(world.src.url, timeout=30) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(shadow, topic)
        with c.subscribe(shadow, "s1", initial_position="earliest"), \
                c.subscribe(shadow, "s2", initial_position="earliest"), \
                c.subscribe(topic, "s3", initial_position="earliest"):

            def loaded() -> bool:  # the brokers rewrite their load at most every 5 s
                now = registrations(world.etcd, world.cluster)
                return (world.sh.url in now and world.src.url in now
                        and now[world.sh.url][1].subscriptions >= 2
                        and now[world.src.url][1].subscriptions >= 1)
            wait_for(loaded, 30, "both brokers' load in etcd", interval=0.3)
            rows = cli_json("brokers", "list", "--etcd", world.etcd.endpoints,
                            "--cluster", world.cluster)
    assert len(rows) == 2
    by_url = {r["url"]: r for r in rows}
    src, sh = by_url[world.src.url], by_url[world.sh.url]
    assert sh["subscriptions"] >= 2 and src["subscriptions"] >= 1, rows
    assert "shadow" in sh["roles"] and "shadow" not in src["roles"]
    for r in rows:
        assert r["cluster"] == world.cluster and r["broker_id"]
        assert r["topics"] >= 1 and r["load_ms"] > 0 and r["started_ms"] > 0
        assert r["metrics_url"].startswith("http://") and r["metrics_url"].endswith("/metrics")
    assert src["metrics_url"] == world.src.metrics_url()
    assert sh["metrics_url"] == world.sh.metrics_url()
    # the table names the same brokers
    table = cli("brokers", "list", "--etcd", world.etcd.endpoints, "--cluster", world.cluster)
    assert table.returncode == 0, table.stderr
    for r in rows:
        assert r["broker_id"] in table.stdout and r["url"] in table.stdout

    # topics lookup names the serving broker, of the source as of the shadow, whoever asks
    for asked in (world.src.url, world.sh.url):
        got = cli_json("topics", "lookup", topic, url=asked)
        assert (got["brokerId"], got["brokerUrl"]) == (src["broker_id"], world.src.url), got
        got = cli_json("topics", "lookup", shadow, url=asked)
        assert (got["brokerId"], got["brokerUrl"]) == (sh["broker_id"], world.sh.url), got


def test_brokers_list_errors(world):
    res = cli("brokers", "list", "--etcd", "localhost:notaport")
    assert res.returncode == 1 and res.stderr.startswith("error: bad etcd endpoint"), res.stderr
    assert res.stderr.count("\n") == 1
    dead = f"127.0.0.1:{free_port()}"
    res = cli("brokers", "list", "--etcd", dead, "--timeout", "1")
    assert res.returncode == 1 and res.stderr.startswith(f"error: etcd at {dead}"), res.stderr
    assert res.stderr.count("\n") == 1
    # an unknown cluster: an empty list, not an error
    assert cli_json("brokers", "list", "--etcd", world.etcd.endpoints,
                    "--cluster", "no-such-cluster") == []
