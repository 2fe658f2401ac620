"""Compaction with failpoints in the worker (source/failpoints.py): kill -9 while Spark has
the job or between the output and the pointer's move (K16), each phase held so a watcher on
a terminal sees them all (K14), and Spark's JVM killed under a held job (F15). The tests
share this module's `Paused` cluster (a broker, and a worker that holds each phase), so
this file runs beside test_compaction.py in `make test`; K16 puts workers with failpoints of
its own in that cluster one after another, the module's worker last.

A worker's start is mostly Spark's JVM (20 s and more on a loaded machine), so every
worker the tests kill is followed by one that is needed anyway: K16's two crashes are one
chain of three workers (the last one the module's worker, which the K14 test then uses and
F15 kills), and a test starts its first worker in a thread (`starting`) while the messages
go in, and waits for it before the first job."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from support.compaction_support import (
    compacted_rows,
    job_phase,
    pointer,
    produce,
    start_worker,
    wait_done,
)
from support.produce import send_pipelined

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


def starting(etcd, data_dir: str, cluster: str,
             points: dict[str, str] | None = None) -> Future[BrokerProcess]:
    """`start_worker` in a thread of its own: `.result()` is the worker, SERVING (or the
    error of its start)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="start-worker")
    try:
        return pool.submit(start_worker, etcd, data_dir, cluster, points)
    finally:
        pool.shutdown(wait=False)


def produce_pipelined(client, topic: str, items: list[tuple[str, str]]) -> list:
    """`produce` to an existing topic without waiting for each receipt before the next
    send: the producer batches them, and each message is still an entry, with an id, of its
    own. Their ids, in order (all acknowledged when this returns)."""
    with client.create_producer(topic) as p:
        return send_pipelined(p, items)


def _rerun_finished(etcd, c, b: BrokerProcess, topic: str, job: str, items: list[tuple],
                    ids: list) -> None:
    """The rerun of `job` is DONE with the result of a run never killed: the pointer names it,
    its compacted ledger holds the latest entry of each key of `items` (sent as `ids`), and
    the orphaned output and the replaced compacted ledgers are collected."""
    s = wait_done(c, topic, job, timeout=120)
    assert s.phase == "done", s.error
    ptr = pointer(etcd, topic)
    assert ptr.job_id == job
    latest = {k: mid for (k, _v), mid in zip(items, ids, strict=True)}
    assert [(r[0], r[1]) for r in compacted_rows(b, ptr)] == sorted(
        (m.ledger_id, m.entry_id) for m in latest.values())
    st = Storage(os.path.join(b.data_dir, "storage"))
    tdir = Storage.topic_compacted_dir(TopicName.parse(topic))
    deadline = time.monotonic() + 30
    while st.list_subdirs(tdir) != [Storage.compacted_rel(TopicName.parse(topic), job)]:
        assert time.monotonic() < deadline, f"not collected: {st.list_subdirs(tdir)}"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.worker_restarts
def test_killed_workers_leave_the_old_view_and_a_rerun_finishes(etcd_server, tmp_path,
                                                                paused_cluster, topic):
    """K16, both crashes, one after the other on one topic: kill -9 the worker while Spark
    runs a job (j2), then a worker that dies (kill) after a job's output is written but
    before the pointer moves (j3). Each time the pointer still names the previous compacted
    ledger (readers keep the old view), the next worker reruns the job under the same id
    with the same result, and the orphaned output and the replaced ledger are collected.

    Each worker is the next one's only predecessor in the module's cluster (no other worker
    may claim the jobs), so the chain takes three worker starts, not two per crash: the
    first holds j2, the second reruns j2 and dies at j3's publish, and the third, which
    reruns j3, is the module's paused worker (each phase held 3 s), left serving for the
    tests after this one."""
    paused_cluster.stop_worker()  # this test's workers are the cluster's only ones
    b, cluster = paused_cluster.broker, paused_cluster.cluster
    # the first worker runs j1 through and holds j2 30 s at its first phase (a job starts
    # two phases): killed while Spark has it
    w0 = starting(etcd_server, str(tmp_path / "w0"), cluster,
                  {"compaction.phase_start": "2*off->sleep(30)"})
    workers = []
    try:
        with Client(b.url, timeout=30) as c:
            items = [(f"k{i % 10}", f"v{i}") for i in range(200)]
            ids = produce(c, topic, items)
            j1 = c.admin.compact(topic)  # its horizon: the 200 (the request waits for w0)
            more = [(f"k{i % 13}", f"w{i}") for i in range(3000)]
            ids += produce_pipelined(c, topic, more)
            items += more
            workers.append(w0.result())
            assert wait_done(c, topic, j1).phase == "done"
            j2 = c.admin.compact(topic)
            deadline = time.monotonic() + 120
            while job_phase(etcd_server, topic, j2) not in (apb.SCANNING_KEYS, apb.WRITING):
                assert time.monotonic() < deadline, "the job never started"
                time.sleep(0.02)
            workers[0].kill()
            assert pointer(etcd_server, topic).job_id == j1  # the old view, whole
            # the second worker reruns j2 (its first publish goes through), then kills
            # itself once j3's output is written, before the pointer moves
            workers.append(start_worker(etcd_server, str(tmp_path / "w1"), cluster,
                                        {"compaction.before_publish": "1*off->kill"}))
            _rerun_finished(etcd_server, c, b, topic, j2, items, ids)
            more = [(f"k{i % 17}", f"x{i}") for i in range(500)]
            ids += produce_pipelined(c, topic, more)
            items += more
            j3 = c.admin.compact(topic)
            deadline = time.monotonic() + 120
            while workers[1].proc.poll() is None:
                assert time.monotonic() < deadline, "the worker did not reach the failpoint"
                time.sleep(0.05)
            assert job_phase(etcd_server, topic, j3) == apb.COMMITTING
            assert pointer(etcd_server, topic).job_id == j2  # the old view, whole
            paused_cluster.serving()  # the third worker
            _rerun_finished(etcd_server, c, b, topic, j3, items, ids)
    finally:
        try:
            workers.append(w0.result())  # (a start still under way ends first)
        except Exception:  # noqa: BLE001 - it never started: the test has failed already
            pass
        for w in workers:
            w.kill()


class Paused:
    """A cluster of this module's own: its broker and a worker that holds each job 3 s at
    the start of each phase (so a watcher sees every phase, however fast the job, and a test
    has time to kill the worker's JVM under a job). The worker starts when a test first
    needs it, and again for the next test when one killed or stopped it (K16 and F15 do)."""

    POINTS = {"compaction.phase_start": "sleep(3)"}

    def __init__(self, etcd, tmp_path) -> None:
        self.etcd, self.tmp_path = etcd, tmp_path
        self.cluster, _topic, self.broker = _cluster_broker(etcd, tmp_path)
        self.worker: BrokerProcess | None = None
        self.started = 0

    def start(self) -> Paused:
        self.broker.start(timeout=60)
        return self

    def serving(self) -> Paused:
        """With a live worker (a new one when there is none, or a test killed the last)."""
        if self.worker is None or self.worker.proc.poll() is not None:
            self.worker = start_worker(self.etcd, str(self.tmp_path / f"worker{self.started}"),
                                       self.cluster, self.POINTS)
            self.started += 1
        return self

    def stop_worker(self) -> None:
        """No worker of this cluster's own runs (a test's own workers take its jobs)."""
        if self.worker is not None:
            self.worker.kill()
            self.worker = None

    def close(self) -> None:
        self.stop_worker()
        self.broker.kill()


@pytest.fixture(scope="module")
def paused_cluster(etcd_server, tmp_path_factory):
    p = Paused(etcd_server, tmp_path_factory.mktemp("paused"))
    try:
        yield p.start()
    finally:
        p.close()


@pytest.fixture
def paused(paused_cluster) -> Paused:
    """This module's `Paused` cluster, its worker SERVING."""
    return paused_cluster.serving()


def test_cli_wait_on_a_terminal_shows_progress(paused, topic):
    """K14 on a terminal: `compaction-status -w` draws its progress (phase bars, elapsed and
    remaining time) and ends with the result line."""
    import pty
    url = paused.broker.url
    with Client(url, timeout=30) as client:
        produce(client, topic, [(f"k{i % 5}", f"v{i}") for i in range(200)])
        job = client.admin.compact(topic)
    exe = os.path.join(os.path.dirname(sys.executable), "shadowtopic")
    master, slave = pty.openpty()
    proc = subprocess.Popen([exe, "topics", "compaction-status", topic, "-w"], stdout=slave,
                            stderr=slave, stdin=subprocess.DEVNULL,
                            env=dict(os.environ, SHADOWTOPIC_URL=url, COLUMNS="120"))
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
@pytest.mark.worker_restarts
def test_f15_a_worker_whose_spark_jvm_dies_exits_and_its_job_runs_on_the_next(etcd_server,
                                                                             tmp_path, paused,
                                                                             topic):
    """F15: Spark's JVM killed (kill -9 by pid) while a job runs: the worker does not go on
    failing jobs while saying SERVING; it exits (status 1, for its supervisor) within
    seconds, the job is not recorded FAILED, and the next worker runs it to the end."""
    # the module's paused worker: each phase of a job holds 3 s, so the JVM dies while the
    # worker has the job; the next worker is a plain one of the same cluster
    b, workers = paused.broker, [paused.worker]
    try:
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
            workers.append(start_worker(etcd_server, str(tmp_path / "w1"), paused.cluster))
            assert wait_done(c, topic, job).phase == "done"
    finally:
        for w in workers:  # the module's broker stays; its worker starts again when needed
            w.kill()
