"""Shadows on other machines (issue 21, Done-when): a source broker and two shadow brokers,
each on a loopback address of its own (127.0.0.2, .3, .4), each with its own data dir and
WAL dir, sharing only etcd and an `s3://` storage root (moto's S3 server, s3_support.py).

Placement by load (source/metadata/placement.py) puts two shadows of one source on the two
shadow brokers; each serves every message with the source's ids, the unsealed tail (which
only the source broker holds, read through shadow/tail.py) included, while neither can read
the source broker's files: each shadow broker runs in a mount namespace of its own where an
empty tmpfs covers the source's data and WAL dirs and the other shadow broker's (root ignores
file modes, so a mount is what hides them). After kill -9 of one
shadow broker its shadow moves to the other once the lease (3 s) expires: Lookup names the
survivor, a durable subscription resumes from its first unacknowledged message, and the
consumer that was open follows by itself (source/client/reconnect.py). The shadow brokers
never open anything under the source broker's WAL dir.

One module-scoped fixture; the steps are one test because each builds on the one before.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import uuid

import pytest
from support.compaction_support import WORKER_ARGS, wait_done
from support.s3_support import MotoS3

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client, Policies, errors
from shadowtopic.standalone import BrokerProcess, wait_serving

PREFIX = "multi-host"
SRC_HOST, SH_HOSTS = "127.0.0.2", ("127.0.0.3", "127.0.0.4")


def hiding(dirs: list[str]) -> list[str]:
    """A command prefix: run the rest in a mount namespace of its own where each of `dirs`
    is an empty tmpfs (util-linux `unshare`; root only, as the disk-fault tests)."""
    mounts = " && ".join(f"mount -t tmpfs -o size=1m,mode=000 hidden {shlex.quote(d)}"
                         for d in dirs)
    return ["unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", f'{mounts} && exec "$@"', "hide"]


def seen_by(pid: int, path: str) -> subprocess.CompletedProcess:
    """`ls -A path` as the process `pid` sees it (in its mount namespace)."""
    return subprocess.run(["nsenter", "--target", str(pid), "--mount", "--", "ls", "-A", path],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)


class Hosts:
    def __init__(self, moto, cluster, src, shadows, src_wal, worker):
        self.moto, self.cluster, self.src, self.shadows = moto, cluster, src, shadows
        self.src_wal, self.worker = src_wal, worker
        self.src_dirs = [src.data_dir, src_wal]


@pytest.fixture(scope="module")
def hosts(etcd_server, tmp_path_factory):
    base = tmp_path_factory.mktemp("multi-host")
    with MotoS3(str(base)) as moto:
        bucket = moto.new_bucket()
        cluster = f"c-{uuid.uuid4().hex[:8]}"
        common = ["--lease-ttl", "3", "--cluster", cluster, "--cursor-flush-interval", "0.2",
                  "--storage-root", f"s3://{bucket}/{PREFIX}", *moto.s3_args()]
        src_wal = str(base / "src-wal")
        src = BrokerProcess(etcd_server.endpoint, str(base / "src"), free_port(), host=SRC_HOST,
                            extra_args=[*common, "--wal-dir", src_wal], env=moto.env)
        dirs = {i: [str(base / f"sh{i}"), str(base / f"sh{i}-wal")] for i in (0, 1)}
        for d in [src.data_dir, src_wal, *dirs[0], *dirs[1]]:
            os.makedirs(d, exist_ok=True)  # mount points
        shadows = [BrokerProcess(etcd_server.endpoint, dirs[i][0], free_port(), host=h,
                                 extra_args=[*common, "--wal-dir", dirs[i][1]],
                                 env=moto.env, module="shadowtopic.shadow.broker",
                                 prefix=hiding([src.data_dir, src_wal, *dirs[1 - i]]))
                   for i, h in enumerate(SH_HOSTS)]
        # the compaction worker (Spark) boots meanwhile; the compaction test waits for it
        worker = BrokerProcess(etcd_server.endpoint, str(base / "worker"), free_port(),
                               module="shadowtopic.compaction.worker", env=moto.env,
                               extra_args=[*WORKER_ARGS, "--cluster", cluster, *moto.s3_args()])
        try:
            worker.start(wait=False)
            for b in (src, *shadows):
                b.start(timeout=60)
            yield Hosts(moto, cluster, src, shadows, src_wal, worker)
        finally:
            for b in (src, *shadows, worker):
                b.kill()


def wait_owner(c: Client, topic: str, not_url: str = "", timeout: float = 30.0) -> dict:
    """Lookup of `topic` once a broker (other than `not_url`) owns it (an epoch is set)."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout * 10) + 1):
        try:
            found = c.admin.lookup(topic)
        except errors.ShadowTopicError:  # noqa: PERF203 - the owner is going away
            found = {}
        if found.get("epoch") and found.get("brokerUrl") != not_url:
            return found
        assert time.monotonic() < deadline, f"nobody owns {topic}: {found}"
        time.sleep(0.1)
    raise AssertionError(f"nobody owns {topic}")


def cli_lookup(url: str, topic: str) -> dict:
    exe = os.path.join(os.path.dirname(sys.executable), "shadowtopic")
    res = subprocess.run([exe, "topics", "lookup", topic, "-o", "json"], capture_output=True,
                         text=True, timeout=60, env=dict(os.environ, SHADOWTOPIC_URL=url),
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def open_fds(pid: int) -> list[str]:
    fd_dir = f"/proc/{pid}/fd"
    out = []
    for fd in os.listdir(fd_dir):
        try:
            out.append(os.readlink(os.path.join(fd_dir, fd)))
        except OSError:  # closed meanwhile
            continue
    return out


def test_shadows_spread_read_the_tail_and_fail_over(hosts):
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"
    shadows = [topic + "-shadow-a", topic + "-shadow-b"]
    urls = {b.url for b in hosts.shadows}
    with Client(hosts.src.url, timeout=30) as c:
        c.admin.create_topic(topic, policies=Policies(ledger_max_entries=20))
        with c.create_producer(topic) as p:
            ids = [p.send(f"m{i}".encode(), key=f"k{i % 3}") for i in range(50)]
        assert len({i.ledger_id for i in ids}) == 3  # two sealed in the bucket, one open
        # the source's files are there, but not where the shadow brokers look
        assert os.listdir(hosts.src_wal) and os.listdir(hosts.src.data_dir)
        for b in hosts.shadows:
            for d in hosts.src_dirs:
                res = seen_by(b.proc.pid, d)
                assert res.returncode == 0 and res.stdout == "", (d, res.stdout, res.stderr)
        owners = {}
        for sh in shadows:  # one after the other: each is placed by the load the last left
            c.admin.create_shadow_topic(sh, topic)
            owners[sh] = wait_owner(c, sh)
        assert {o["brokerUrl"] for o in owners.values()} == urls, owners  # placed apart

        consumers = {sh: c.subscribe(sh, "durable", initial_position="earliest")
                     for sh in shadows}
        try:
            for sh, cons in consumers.items():
                got = [cons.receive(timeout=15) for _ in range(50)]
                assert [m.message_id for m in got] == ids, sh  # the source's ids, tail too
                assert [m.payload for m in got] == [f"m{i}".encode() for i in range(50)]
                for m in got[:20]:
                    cons.acknowledge(m)
            # the acks reached the owner (the cursor is flushed to the bucket every 0.2 s)
            moved = shadows[0]
            deadline = time.monotonic() + 20
            while c.admin.stats(moved)["subscriptions"]["durable"]["msgBacklog"] != 30:
                assert time.monotonic() < deadline, "the acks did not arrive"
                time.sleep(0.1)
            time.sleep(1.0)  # a few cursor flush intervals: the snapshot is in the bucket

            dead = next(b for b in hosts.shadows if b.url == owners[moved]["brokerUrl"])
            alive = next(b for b in hosts.shadows if b is not dead)
            dead.kill()
            after = wait_owner(c, moved, not_url=dead.url, timeout=30)
            assert after["brokerUrl"] == alive.url, after
            assert cli_lookup(hosts.src.url, moved)["brokerUrl"] == alive.url

            # the open consumer follows by itself, from the first unacknowledged message
            cons = consumers[moved]
            again = [cons.receive(timeout=30) for _ in range(30)]
            assert [m.message_id for m in again] == ids[20:]
            # the other shadow kept serving: new messages reach both
            with c.create_producer(topic) as p:
                more = [p.send(f"n{i}".encode()) for i in range(5)]
            for sh, cons in consumers.items():
                if sh != moved:
                    for m in got[20:]:
                        cons.acknowledge(m)
                assert [cons.receive(timeout=15).message_id for _ in range(5)] == more, sh
        finally:
            for cons in consumers.values():
                cons.close()
        # a new durable subscription on the moved shadow reads it all from the survivor
        with c.subscribe(moved, "late", initial_position="earliest") as late:
            assert [late.receive(timeout=15).message_id for _ in range(55)] == ids + more

    # the source's WAL holds the tail the shadows read; no shadow broker could see it
    assert [f for _d, _s, files in os.walk(hosts.src_wal) for f in files]
    for b in hosts.shadows:
        if b.proc.poll() is None:
            assert seen_by(b.proc.pid, hosts.src_wal).stdout == ""
            assert not [f for f in open_fds(b.proc.pid) if f.startswith(hosts.src_wal)]
        with open(b.log_path, errors="replace") as f:
            assert hosts.src_wal not in f.read()


def test_both_shadows_read_the_compacted_view(hosts):
    """A compaction worker with the S3 flags compacts the source; two shadows of it on the
    live shadow brokers (the killed one started again) read the compacted view."""
    dead = [b for b in hosts.shadows if b.proc.poll() is not None]
    for b in dead:
        b.start(timeout=60)  # its own data dir again
    wait_serving(hosts.worker.url, timeout=180, proc=hosts.worker.proc)
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"
    shadows = [topic + "-shadow-a", topic + "-shadow-b"]
    items = [("a", "a1"), ("b", "b1"), ("a", "a2"), ("c", "c1"), ("b", "b2"), ("a", "a3")]
    with Client(hosts.src.url, timeout=30) as c:
        c.admin.create_topic(topic, policies=Policies(ledger_max_entries=4))
        for sh in shadows:
            c.admin.create_shadow_topic(sh, topic)
        with c.create_producer(topic) as p:
            ids = [p.send(v.encode(), key=k) for k, v in items]
        job_id = c.admin.compact(topic)
        status = wait_done(c, topic, job_id, timeout=120)
        assert status.phase == "done", status.error
        want = [(ids[i], items[i][1].encode()) for i in (3, 4, 5)]  # c1, b2, a3 in id order
        for sh in shadows:
            with c.create_reader(sh, "earliest", read_compacted=True) as r:
                got = [r.read_next(timeout=60) for _ in want]  # moto and Spark under load
                assert [(m.message_id, m.payload) for m in got] == want, sh
            assert wait_owner(c, sh)["brokerUrl"] in {b.url for b in hosts.shadows}
