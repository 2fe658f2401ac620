"""`shadowtopic standalone`'s processes: each role prints its metrics URL as it becomes
ready, its children die with it (even under kill -9), it refuses taken ports, restarts a
broker that exits and gives up after repeated failures, and stops gracefully on SIGTERM.
Plus the Supervisor's back-off on a fake role and clock.

And its edges as a new user meets them: one line as each part becomes ready (with its URL);
a second standalone (or a broker) on a data dir in use is refused at once, in one line
naming the holder, and writes nothing there; with `--log-format json` every role's log is
JSON lines, Spark's own logging in logs/spark.log. The tests of a standalone with every role
share one (`full_standalones`, with `--log-format json`: its start is a Spark JVM's), the
kill -9 test last."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
from support.metrics_support import scrape, value
from support.standalone_process import EXE, Standalone, alive, free_ports, listening
from support.waiting import wait_for

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client
from shadowtopic.process import BACKOFF, FAILED, RUNNING, STARTING, Supervisor, spawn
from shadowtopic.standalone import BrokerProcess, wait_serving

# ---- helpers -------------------------------------------------------------------------------

@pytest.fixture
def standalone(request, tmp_path):
    """`shadowtopic standalone --no-compaction` (supervision does not need Spark's JVM), or
    with `@pytest.mark.parametrize("standalone", [True], indirect=True)` every role."""
    s = Standalone(tmp_path, compaction=getattr(request, "param", False))
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def full_standalones(tmp_path_factory):
    """get() -> a READY `shadowtopic standalone` with every role (the compaction worker and
    its Spark JVM too, the longest start here) and `--log-format json`: one for the module's
    tests that only look at it, and a new one after a test killed it (the kill -9 test
    does)."""
    started: list[Standalone] = []

    def get() -> Standalone:
        if not started or started[-1].proc.poll() is not None:
            started.append(Standalone(tmp_path_factory.mktemp("full"), compaction=True,
                                      args=("--log-format", "json")))
            started[-1].start().wait_ready(timeout=180)
        return started[-1]

    try:
        yield get
    finally:
        for s in started:
            s.close()


@pytest.fixture
def full_standalone(full_standalones) -> Standalone:
    return full_standalones()


# ---- the standalone ------------------------------------------------------------------------

def test_standalone_prints_each_roles_metrics_url(full_standalone):
    s = full_standalone
    urls = dict(re.findall(r"^(.*) ready: .*, metrics (http://\S+/metrics)$", s.stdout, re.M))
    assert set(urls) == {"source broker", "shadow broker", "compaction worker"}, s.stdout
    assert len(set(urls.values())) == 3, s.stdout
    for url in urls.values():  # each answers with its role's series
        assert value(scrape(url), "process_resident_memory_bytes") > 0
    assert value(scrape(urls["compaction worker"]), "shadowtopic_compaction_running",
                 cluster="standalone") == 0
    assert value(scrape(urls["source broker"]), "shadowtopic_broker_ready",
                 cluster="standalone") == 1


def snapshot(data_dir: str) -> tuple:
    """What a second standalone would touch first: the data dir's entries, the lock file
    (text and mtime) and the files in logs/ (the running processes write into their own
    files and directories all the time; etcd's log is compared apart)."""
    lock = os.path.join(data_dir, "LOCK")
    return (sorted(os.listdir(data_dir)), read(lock), os.stat(lock).st_mtime_ns,
            sorted(os.listdir(os.path.join(data_dir, "logs"))))


def read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def test_ready_lines_one_owner_of_a_data_dir_and_json_logs(full_standalone, tmp_path):
    s = full_standalone
    lines = s.stdout.splitlines()
    ready = [line for line in lines if " ready: " in line]
    assert ready[0] == f"etcd ready: http://127.0.0.1:{s.etcd_port}", lines
    expected = [f"source broker ready: 127.0.0.1:{s.port}",
                f"shadow broker ready: 127.0.0.1:{s.shadow_port}",
                f"compaction worker ready: health on 127.0.0.1:{s.compaction_port}"]
    assert len(ready) == 4, lines
    for start in expected:     # each role once, its URL first (its metrics URL may follow)
        assert [line for line in ready[1:] if line.startswith(start)] != [], (start, lines)
    assert lines.index(ready[-1]) < next(i for i, line in enumerate(lines) if "is ready" in line)

    # a second standalone on the same data dir (other ports): refused at once, one line
    before = snapshot(s.data_dir)
    etcd_log = read(os.path.join(s.data_dir, "logs", "etcd.log"))
    ports = [str(p) for p in free_ports(5)]
    r = subprocess.run([EXE, "standalone", "--data-dir", s.data_dir, "--port", ports[0],
                        "--etcd-port", ports[1], "--etcd-peer-port", ports[2],
                        "--shadow-port", ports[3], "--compaction-port", ports[4]],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (f"error: data dir {s.data_dir} is in use by pid {s.proc.pid} "
                        f"(shadowtopic standalone) (it holds {s.data_dir}/LOCK)\n")
    assert snapshot(s.data_dir) == before
    after = read(os.path.join(s.data_dir, "logs", "etcd.log"))
    assert after.startswith(etcd_log)   # the running etcd's log, nothing of a second etcd
    assert ports[1] not in after and ports[2] not in after

    # a broker on the standalone's data dir: its broker holds it
    log_path = str(tmp_path / "second-broker.log")
    b = BrokerProcess(f"127.0.0.1:{s.etcd_port}", s.data_dir, free_port(), log_path=log_path)
    with pytest.raises(RuntimeError):
        b.start(timeout=60)
    assert b.proc.returncode == 1
    with open(log_path) as f:
        assert f.read() == (f"error: data dir {s.data_dir} is in use by pid "
                            f"{s.broker_pid()} (shadowtopic broker on port {s.port}) "
                            f"(it holds {s.data_dir}/broker.lock)\n")

    # every role logs JSON lines; Spark's own output is in a file of its own
    logs = os.path.join(s.data_dir, "logs")
    for name in ("broker.log", "shadow-broker.log", "compaction-worker.log"):
        with open(os.path.join(logs, name)) as f:
            records = [line for line in f.read().splitlines() if line.strip()]
        assert records, name
        for line in records:
            try:
                assert {"ts", "level", "logger", "msg"} <= json.loads(line).keys()
            except ValueError:
                raise AssertionError(f"{name}: not a JSON line: {line!r}") from None
    assert os.path.exists(os.path.join(logs, "spark.log"))


def test_sigkill_of_standalone_leaves_no_child(full_standalone):
    """Every role (the worker's Spark JVM too) dies with a standalone killed with -9."""
    standalone = full_standalone
    kids = standalone.children()
    assert any("etcd" in cmd for cmd in kids.values()), kids
    assert any("-m shadowtopic.broker " in cmd for cmd in kids.values()), kids
    assert any("-m shadowtopic.compaction.worker " in cmd for cmd in kids.values()), kids
    standalone.proc.kill()
    standalone.proc.wait(10)
    wait_for(lambda: not any(alive(pid) for pid in kids), 5, "the children to die")
    ports = (standalone.port, standalone.etcd_port, standalone.peer_port)
    wait_for(lambda: not any(listening(port) for port in ports), 3, "the ports to close")


@pytest.mark.parametrize("which", ["port", "etcd_port", "peer_port"])
def test_standalone_refuses_a_busy_port(standalone, which):
    busy = getattr(standalone, which)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", busy))
        holder.listen()
        standalone.start()
        code = standalone.proc.wait(15)
        assert code == 1
        lines = standalone.stderr.strip().splitlines()
        assert lines == [f"error: port {busy} is in use "
                         f"(is another shadowtopic standalone running?)"]
        assert standalone.ours() == []
        assert "is ready" not in standalone.stdout
    for port in (standalone.port, standalone.etcd_port, standalone.peer_port):
        if port != busy:
            assert not listening(port)


def test_killed_broker_is_restarted_and_serves_the_same_data(standalone):
    standalone.start().wait_ready()
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"
    sent = [f"m{i}".encode() for i in range(5)]
    with Client(standalone.url, timeout=20) as c:
        c.admin.create_topic(topic)
        with c.create_producer(topic) as p:
            for payload in sent:
                p.send(payload)
    first = standalone.broker_pid()
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: "broker restarted" in standalone.stdout, 30, "the restart")
    assert "broker exited with code -9 (SIGKILL); restarting in 0.5 s (see " in standalone.stderr
    wait_serving(standalone.url, timeout=30)
    second = standalone.broker_pid()
    assert second != first and standalone.proc.poll() is None
    with Client(standalone.url, timeout=20) as c, \
            c.create_reader(topic, start="earliest") as r:
        got = [r.read_next(timeout=15).payload for _ in sent]
    assert got == sent


def test_repeated_failures_stop_everything(standalone):
    """Kill the broker, then hold its port: every restart fails; the 5th failure within a
    minute stops the standalone (etcd too) with a non-zero exit."""
    standalone.start().wait_ready()
    kids = standalone.children()
    os.kill(standalone.broker_pid(), signal.SIGKILL)
    holder = socket.socket()
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

        def take_port() -> bool:
            try:
                holder.bind(("127.0.0.1", standalone.port))
            except OSError:
                return False
            holder.listen()
            return True

        wait_for(take_port, 5, "the dead broker's port", interval=0.02)
        code = standalone.proc.wait(40)
    finally:
        holder.close()
    assert code != 0
    err = standalone.stderr
    assert err.count("restarting in") == 4, err
    for delay in ("0.5 s", "1 s", "2 s", "4 s"):
        assert f"restarting in {delay} " in err, err
    assert "5 failures within 60 s, giving up" in err, err
    assert not any(alive(pid) for pid in kids)
    assert standalone.ours() == []
    assert not listening(standalone.etcd_port)


def test_etcd_exiting_stops_the_standalone(standalone):
    standalone.start().wait_ready()
    kids = standalone.children()
    etcd = [pid for pid, cmd in kids.items() if "etcd" in cmd.split()[0]]
    assert len(etcd) == 1, kids
    os.kill(etcd[0], signal.SIGKILL)
    assert standalone.proc.wait(60) == 1
    assert "error: etcd exited with code -9 (SIGKILL); stopping (see " in standalone.stderr
    assert not any(alive(pid) for pid in kids)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_broker_then_etcd_and_exits_0(standalone, sig):
    standalone.start().wait_ready()
    kids = standalone.children()
    assert not any("compaction.worker" in cmd for cmd in kids.values()), kids
    assert "compaction  : off (--no-compaction" in standalone.stdout
    standalone.proc.send_signal(sig)
    assert standalone.proc.wait(60) == 0
    assert not any(alive(pid) for pid in kids)
    assert "stopping" in standalone.stdout
    # graceful: the broker ran its SIGTERM shutdown (a PDEATHSIG kill would not log this)
    broker_log = open(os.path.join(standalone.data_dir, "logs", "broker.log")).read()
    assert "shutting down" in broker_log


# ---- building blocks -----------------------------------------------------------------------

def test_child_spawned_from_a_worker_thread_outlives_the_thread(tmp_path):
    """PDEATHSIG follows the forking thread: it must not be set off the main thread, or a
    child started by a short-lived thread (asyncio.to_thread) would die with it."""
    procs = []
    t = threading.Thread(target=lambda: procs.append(
        spawn([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "log")))
    t.start()
    t.join(10)
    try:
        time.sleep(0.5)
        assert procs[0].poll() is None
    finally:
        procs[0].kill()
        procs[0].wait()


class FakeRole:
    role, log_path = "worker", "/logs/worker.log"

    def __init__(self):
        self.code: int | None = None
        self.is_ready = False
        self.launches = 0

    def launch(self):
        self.launches += 1
        self.code, self.is_ready = None, True

    def exit_code(self):
        return self.code

    def ready(self):
        return self.is_ready

    def terminate(self):
        return 0

    def kill(self):
        self.code = -9

    def log_tail(self, n=40):
        return ""


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def crash_and_wait(sup: Supervisor, role: FakeRole, clock: Clock) -> float:
    """Crash the running role; return the back-off the supervisor chose (0 if it gave up)."""
    role.code = 1
    crashed_at = clock.now
    if sup.poll() == FAILED:
        return 0.0
    assert sup.state == BACKOFF
    while sup.poll() == BACKOFF:
        clock.now += 0.25
    assert sup.state == RUNNING
    return clock.now - crashed_at


def test_supervisor_backs_off_exponentially_and_gives_up(capsys):
    role, clock = FakeRole(), Clock()
    sup = Supervisor(role, clock=clock)
    assert sup.start() == STARTING and sup.poll() == RUNNING
    delays = [crash_and_wait(sup, role, clock) for _ in range(4)]
    assert delays == [0.5, 1.0, 2.0, 4.0]
    assert crash_and_wait(sup, role, clock) == 0.0
    assert sup.state == FAILED and role.launches == 5
    assert "worker exited with code 1; 5 failures within 60 s, giving up" in sup.error
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "worker exited with code 1; restarting in 0.5 s (see /logs/worker.log)"
    assert len(err) == 4


def test_supervisor_forgets_failures_older_than_the_window():
    role, clock = FakeRole(), Clock()
    sup = Supervisor(role, clock=clock)
    sup.start()
    sup.poll()
    for _ in range(8):
        assert crash_and_wait(sup, role, clock) == 0.5
        clock.now += 61
        assert sup.poll() == RUNNING
    assert role.launches == 9


def test_supervisor_first_start_failure_is_final():
    role, clock = FakeRole(), Clock()
    role.launch = lambda: setattr(role, "code", 2)
    sup = Supervisor(role, clock=clock)
    sup.start()
    assert sup.poll() == FAILED
    assert sup.error == "worker exited with code 2"
    clock.now += 100
    assert sup.poll() == FAILED


def test_supervisor_kills_a_start_that_never_gets_ready():
    role, clock = FakeRole(), Clock()
    sup = Supervisor(role, start_timeout=60, clock=clock)
    sup.start()
    sup.poll()
    role.code = 1
    sup.poll()                       # crash -> back-off 0.5 s
    role.launch = lambda: setattr(role, "is_ready", False) or setattr(role, "code", None)
    clock.now += 0.5
    assert sup.poll() == STARTING
    clock.now += 61
    assert sup.poll() == BACKOFF
    assert role.code == -9           # the hung start was killed
