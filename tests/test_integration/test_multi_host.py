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

Two more source brokers (127.0.0.5, .6) keep their WAL on the S3 server (`--wal`, issue 33),
each in a mount namespace that hides the other's disk: the owner of a topic is killed with
its data and WAL dirs deleted, then the next owner is paused (SIGSTOP) across a move and
woken; two idempotent producers on a service URL naming both brokers never stop, and every
acknowledged message is read back exactly once, in order, at its acknowledged id, on the
source and its shadow, and the compacted view after the moves equals a model.

One module-scoped fixture; the steps are one test because each builds on the one before.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from support.compaction_support import WORKER_ARGS, wait_done
from support.s3_support import MotoS3
from support.waiting import wait_cursors_saved

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client, Policies, errors
from shadowtopic.standalone import BrokerProcess, wait_serving

PREFIX = "multi-host"
SRC_HOST, SH_HOSTS = "127.0.0.2", ("127.0.0.3", "127.0.0.4")
WAL_HOSTS = ("127.0.0.5", "127.0.0.6")


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
    def __init__(self, moto, cluster, src, shadows, src_wal, worker, wal_srcs, bucket):
        self.moto, self.cluster, self.src, self.shadows = moto, cluster, src, shadows
        self.src_wal, self.worker = src_wal, worker
        self.src_dirs = [src.data_dir, src_wal]
        self.wal_srcs, self.bucket = wal_srcs, bucket  # source brokers with --wal s3://


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
        # two source brokers with the WAL on the S3 server, each blind to the other's disk
        wdirs = {i: [str(base / f"ws{i}"), str(base / f"ws{i}-wal")] for i in (0, 1)}
        every_wdir = [*wdirs[0], *wdirs[1]]
        for d in [src.data_dir, src_wal, *dirs[0], *dirs[1], *every_wdir]:
            os.makedirs(d, exist_ok=True)  # mount points
        shadows = [BrokerProcess(etcd_server.endpoint, dirs[i][0], free_port(), host=h,
                                 extra_args=[*common, "--wal-dir", dirs[i][1]],
                                 env=moto.env, module="shadowtopic.shadow.broker",
                                 prefix=hiding([src.data_dir, src_wal, *dirs[1 - i],
                                                *every_wdir]))
                   for i, h in enumerate(SH_HOSTS)]
        wal_srcs = [BrokerProcess(etcd_server.endpoint, wdirs[i][0], free_port(), host=h,
                                  extra_args=[*common, "--wal-dir", wdirs[i][1],
                                              "--wal", f"s3://{bucket}/{PREFIX}-wal"],
                                  env=moto.env,
                                  prefix=hiding([src.data_dir, src_wal, *wdirs[1 - i]]))
                    for i, h in enumerate(WAL_HOSTS)]
        # the compaction worker (Spark) boots meanwhile; the compaction test waits for it
        worker = BrokerProcess(etcd_server.endpoint, str(base / "worker"), free_port(),
                               module="shadowtopic.compaction.worker", env=moto.env,
                               extra_args=[*WORKER_ARGS, "--cluster", cluster, *moto.s3_args()])
        try:
            worker.start(wait=False)
            for b in (src, *shadows, *wal_srcs):
                b.start(timeout=60)
            yield Hosts(moto, cluster, src, shadows, src_wal, worker, wal_srcs, bucket)
        finally:
            for b in (src, *shadows, *wal_srcs, worker):
                if b.proc is not None and b.proc.poll() is None:
                    os.kill(b.proc.pid, signal.SIGCONT)  # a stopped one dies too
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
            wait_cursors_saved(c, moved)  # the snapshot is in the bucket

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


class Streamer:
    """An idempotent producer (named `name`) sending keyed messages `name-i` from a thread of
    its own, each without waiting for the one before, until stopped (bounded: `limit`
    messages). `acked` holds (i, message id) in receipt order; `failed` the sends that
    raised (allowed across a move: such a message may or may not be stored)."""

    def __init__(self, client: Client, topic: str, name: str, limit: int = 20_000):
        self.name, self.limit = name, limit
        self.acked: list[tuple[int, object]] = []
        self.failed: list[tuple[int, BaseException]] = []
        self._stop = threading.Event()
        self._producer = client.create_producer(topic, producer_name=name)
        self._thread = threading.Thread(target=self._run, name=f"stream-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        def receipt(i: int):
            def done(mid, exc) -> None:
                if exc is not None:
                    self.failed.append((i, exc))
                else:
                    self.acked.append((i, mid))
            return done

        for i in range(self.limit):
            if self._stop.is_set():
                break
            self._producer.send_async(f"{self.name}-{i}".encode(), key=f"k{i % 40}",
                                      callback=receipt(i))
            if i % 20 == 19:
                time.sleep(0.01)
        self._producer.flush()

    def wait_acked(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < n:
            assert time.monotonic() < deadline, (self.name, len(self.acked), self.failed[:1])
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        assert not self._thread.is_alive()
        self._producer.close()


def read_everything(url: str, topic: str, expect: int, **kw) -> list:
    with Client(url, timeout=60) as c, c.create_reader(topic, "earliest", **kw) as r:
        got = [r.read_next(timeout=60) for _ in range(expect)]
        assert not r.has_message_available()
    return got


def test_a_source_brokers_machine_lost_with_the_wal_on_object_storage(hosts):
    """Issue 33: kill -9 of the owner with its data and WAL dirs deleted, then the new
    owner paused (SIGSTOP) across a move and woken (SIGCONT): two idempotent producers that
    never stop see every acknowledged message exactly once, in order, on the source and its
    shadow, and the compacted view after the moves equals a model."""
    svc = ",".join(x.url for x in hosts.wal_srcs)  # both source brokers, as one service URL
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"
    shadow = topic + "-shadow"
    with Client(svc, timeout=60) as c:
        c.admin.create_topic(topic, policies=Policies(ledger_max_entries=400))
        c.admin.create_shadow_topic(shadow, topic)
        streams = [Streamer(c, topic, n) for n in ("p1", "p2")]
        try:
            for s in streams:
                s.wait_acked(300)
            # whichever broker the producers' lookup reached owns the topic
            a = next(x for x in hosts.wal_srcs if x.url == wait_owner(c, topic)["brokerUrl"])
            b = next(x for x in hosts.wal_srcs if x is not a)
            # the machine is lost: the process, its data dir and its local WAL copy
            a.kill()
            for d in (a.data_dir, a.extra_args[a.extra_args.index("--wal-dir") + 1]):
                shutil.rmtree(d)
                os.makedirs(d)  # a new, empty disk (and the others' mount point)
            for s in streams:
                s.wait_acked(len(s.acked) + 300)
            assert wait_owner(c, topic, not_url=a.url, timeout=60)["brokerUrl"] == b.url
            # a new machine in a's place; the owner b is paused across the next move
            a.start(timeout=60)
            os.kill(b.proc.pid, signal.SIGSTOP)
            try:
                with Client(a.url, timeout=60) as ca:
                    # the producers give the paused broker up (keepalive) and move
                    assert wait_owner(ca, topic, not_url=b.url, timeout=90)["brokerUrl"] == a.url
                for s in streams:
                    s.wait_acked(len(s.acked) + 200)
            finally:
                os.kill(b.proc.pid, signal.SIGCONT)
            for s in streams:  # b's late windows, if any, meet a's ownership now
                s.wait_acked(len(s.acked) + 200)
        finally:
            for s in streams:
                s.stop()
    acked = {s.name: dict(s.acked) for s in streams}
    log = None
    for t in (topic, shadow):
        with Client(svc, timeout=60) as c, c.create_reader(t, "earliest") as r:
            got = []
            while r.has_message_available() and len(got) < 50_000:
                got.append(r.read_next(timeout=60))
        by: dict[str, list[int]] = {"p1": [], "p2": []}
        for m in got:
            name, i = m.payload.decode().rsplit("-", 1)
            by[name].append(int(i))
        for name, seen in by.items():
            assert seen == sorted(set(seen)), f"{t}: {name} duplicated or out of order"
            missing = set(acked[name]) - set(seen)
            assert not missing, f"{t}: {name}: {len(missing)} acknowledged messages lost"
        ids = {m.payload.decode(): m.message_id for m in got}
        for name, mids in acked.items():  # an acknowledged id is where the message is
            assert all(ids[f"{name}-{i}"] == mid for i, mid in mids.items()), (t, name)
        if log is None:
            log = [(m.message_id, m.key, m.payload) for m in got]
        else:
            assert [(m.message_id, m.key, m.payload) for m in got] == log  # shadow == source
    # compaction after the moves: the latest value of each key, in id order
    latest: dict[bytes, tuple] = {}
    for mid, key, payload in log:
        latest[key] = (mid, payload)
    want = sorted(latest.values())
    wait_serving(hosts.worker.url, timeout=180, proc=hosts.worker.proc)
    with Client(svc, timeout=60) as c:
        job_id = c.admin.compact(topic)
        status = wait_done(c, topic, job_id, timeout=180)
        assert status.phase == "done", status.error
    for t in (topic, shadow):
        got = read_everything(svc, t, len(want), read_compacted=True)
        assert [(m.message_id, m.payload) for m in got] == want, t
