"""The standalone's edges as a new user meets them: one line as each part becomes ready
(with its URL); a second standalone (or a broker) on a data dir in use is refused at once,
in one line naming the holder, and writes nothing there; with `--log-format json` every
role's log is JSON lines, Spark's own logging in logs/spark.log."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
from support.standalone_process import EXE, Standalone, free_ports

from shadowtopic.broker.server import free_port
from shadowtopic.standalone import BrokerProcess


class JsonStandalone(Standalone):
    """A standalone with `--log-format json`."""

    def start(self) -> JsonStandalone:
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [EXE, "standalone", "--data-dir", self.data_dir, "--port", str(self.port),
                 "--etcd-port", str(self.etcd_port), "--etcd-peer-port", str(self.peer_port),
                 "--shadow-port", str(self.shadow_port),
                 "--compaction-port", str(self.compaction_port), "--log-format", "json"],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        return self


@pytest.fixture
def standalone(tmp_path):
    s = JsonStandalone(tmp_path)
    try:
        yield s.start()
    finally:
        s.close()


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


def test_ready_lines_one_owner_of_a_data_dir_and_json_logs(standalone, tmp_path):
    s = standalone
    s.wait_ready(timeout=180)
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
