"""Compaction with failpoints in the worker (source/failpoints.py): kill -9 while Spark has
the job or between the output and the pointer's move (K16), and each phase held so a
watcher on a terminal sees them all (K14). Each test has a broker and workers of its own,
so this file runs beside test_compaction.py in `make test`."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
from support.compaction_support import (
    compacted_rows,
    job_phase,
    pointer,
    produce,
    start_worker,
    wait_done,
)

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.storage import Storage
from shadowtopic.pb.v1 import admin_pb2 as apb
from shadowtopic.standalone import BrokerProcess


def _cluster_broker(etcd, tmp_path) -> tuple[str, str, BrokerProcess]:
    """A cluster of this test's own, a fresh topic name and a broker of that cluster (not
    started): (cluster, topic, broker)."""
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"
    b = BrokerProcess(etcd.endpoint, str(tmp_path / "broker"), free_port(),
                      extra_args=["--lease-ttl", "3", "--cluster", cluster])
    return cluster, topic, b


@pytest.mark.slow
@pytest.mark.parametrize("crash", ["spark-running", "before-publish"])
def test_killed_worker_leaves_the_old_view_and_a_rerun_finishes(etcd_server, tmp_path, crash):
    """K16: kill -9 the worker while Spark runs, or after the output is written but before
    the pointer moves: the pointer still names the previous compacted ledger (readers keep
    the old view), a new worker reruns the job under the same id with the same result, and
    the orphaned output and the replaced ledger are collected."""
    cluster, topic, b = _cluster_broker(etcd_server, tmp_path)
    workers = []
    # the first job runs through; the second holds 30 s at each phase (killed while Spark has
    # it: a job starts two phases), or the worker kills itself once the second's output is
    # written, before the pointer moves
    points = ({"compaction.before_publish": "1*off->kill"} if crash == "before-publish"
              else {"compaction.phase_start": "2*off->sleep(30)"})
    try:
        b.start(timeout=60)
        workers.append(start_worker(etcd_server, str(tmp_path / "w0"), cluster, points))
        with Client(b.url, timeout=30) as c:
            ids = produce(c, topic, [(f"k{i % 10}", f"v{i}") for i in range(200)])
            j1 = c.admin.compact(topic)
            assert wait_done(c, topic, j1).phase == "done"
            ids += produce(c, topic, [(f"k{i % 13}", f"w{i}") for i in range(3000)])
            j2 = c.admin.compact(topic)
            deadline = time.monotonic() + 120
            if crash == "spark-running":
                while job_phase(etcd_server, topic, j2) not in (apb.SCANNING_KEYS,
                                                                 apb.WRITING):
                    assert time.monotonic() < deadline, "the job never started"
                    time.sleep(0.02)
                workers[0].kill()
            else:  # the failpoint kills it
                while workers[0].proc.poll() is None:
                    assert time.monotonic() < deadline, "the worker did not reach the failpoint"
                    time.sleep(0.05)
            assert pointer(etcd_server, topic).job_id == j1  # the old view, whole
            st = Storage(os.path.join(b.data_dir, "storage"))
            tdir = Storage.topic_compacted_dir(TopicName.parse(topic))
            workers.append(start_worker(etcd_server, str(tmp_path / "w1"), cluster))
            s2 = wait_done(c, topic, j2, timeout=120)
            assert s2.phase == "done", s2.error
            ptr = pointer(etcd_server, topic)
            assert ptr.job_id == j2
            latest = {}
            for mid, i in zip(ids, range(len(ids))):
                k = f"k{i % 10}" if i < 200 else f"k{(i - 200) % 13}"
                latest[k] = mid
            assert [(r[0], r[1]) for r in compacted_rows(b, ptr)] == sorted(
                (m.ledger_id, m.entry_id) for m in latest.values())
            deadline = time.monotonic() + 30
            while st.list_subdirs(tdir) != [Storage.compacted_rel(TopicName.parse(topic), j2)]:
                assert time.monotonic() < deadline, f"not collected: {st.list_subdirs(tdir)}"
                time.sleep(0.2)
    finally:
        for w in workers:
            w.kill()
        b.kill()


@pytest.fixture
def paused(etcd_server, tmp_path):
    """A broker and a worker of a cluster of their own, the worker holding each job 3 s at
    the start of each phase (so a watcher sees every phase, however fast the job)."""
    cluster, _topic, b = _cluster_broker(etcd_server, tmp_path)
    w = start_worker(etcd_server, str(tmp_path / "worker"), cluster,
                     {"compaction.phase_start": "sleep(3)"})
    try:
        b.start(timeout=60)
        yield b
    finally:
        w.kill()
        b.kill()


def test_cli_wait_on_a_terminal_shows_progress(paused, topic):
    """K14 on a terminal: `compaction-status -w` draws its progress (phase bars, elapsed and
    remaining time) and ends with the result line."""
    import pty
    with Client(paused.url, timeout=30) as client:
        produce(client, topic, [(f"k{i % 5}", f"v{i}") for i in range(200)])
        job = client.admin.compact(topic)
    exe = os.path.join(os.path.dirname(sys.executable), "shadowtopic")
    master, slave = pty.openpty()
    proc = subprocess.Popen([exe, "topics", "compaction-status", topic, "-w"], stdout=slave,
                            stderr=slave, stdin=subprocess.DEVNULL,
                            env=dict(os.environ, SHADOWTOPIC_URL=paused.url, COLUMNS="120"))
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(30) == 0
    import re
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))
    assert f"{job} scanning_keys" in text and f"{job} writing" in text, text[-2000:]
    assert "done: 5 messages, 5 keys" in text, text[-2000:]


def _descendants(pid: int) -> list[int]:
    """Every process under `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _jvm_of(pid: int) -> int:
    for child in _descendants(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if b"java" in f.read().split(b"\0")[0]:
                    return child
        except OSError:
            continue
    raise AssertionError(f"no JVM under the worker {pid}")


@pytest.mark.slow
def test_f15_a_worker_whose_spark_jvm_dies_exits_and_its_job_runs_on_the_next(etcd_server,
                                                                             tmp_path):
    """F15: Spark's JVM killed (kill -9 by pid) while a job runs: the worker does not go on
    failing jobs while saying SERVING; it exits (status 1, for its supervisor) within
    seconds, the job is not recorded FAILED, and the next worker runs it to the end."""
    cluster, topic, b = _cluster_broker(etcd_server, tmp_path)
    workers = []
    try:
        b.start(timeout=60)
        # each phase of a job holds 3 s: the JVM dies while the worker has the job
        workers.append(start_worker(etcd_server, str(tmp_path / "w0"), cluster,
                                    {"compaction.phase_start": "sleep(3)"}))
        with Client(b.url, timeout=30) as c:
            produce(c, topic, [(f"k{i % 10}", f"v{i}") for i in range(100)])
            job = c.admin.compact(topic)
            deadline = time.monotonic() + 120
            while job_phase(etcd_server, topic, job) not in (apb.SCANNING_KEYS, apb.WRITING):
                assert time.monotonic() < deadline, "the job never started"
                time.sleep(0.02)
            os.kill(_jvm_of(workers[0].proc.pid), 9)
            assert workers[0].proc.wait(timeout=30) == 1
            with open(workers[0].log_path) as f:
                assert "Spark's JVM exited" in f.read()
            assert job_phase(etcd_server, topic, job) != apb.FAILED
            workers.append(start_worker(etcd_server, str(tmp_path / "w1"), cluster))
            assert wait_done(c, topic, job).phase == "done"
    finally:
        for w in workers:
            w.kill()
        b.kill()
