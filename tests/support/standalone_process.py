"""`shadowtopic standalone` as a subprocess on free loopback ports (`Standalone`), and the
process probes its tests use (children, command lines, listening ports)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from support.waiting import wait_for

EXE = os.path.join(os.path.dirname(sys.executable), "shadowtopic")


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (all bound at once, so no duplicates)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def alive(pid: int) -> bool:
    """Some thread of `pid` still runs (a zombie or a vanished pid is not alive; a killed
    process's main thread turns zombie before its other threads have let go of its sockets)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    return True
        except (OSError, IndexError):
            continue
    return False


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def children(pid: int) -> dict[int, str]:
    """Live children of `pid` (scan of /proc/*/stat) -> their command lines."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and alive(int(entry)):
            found[int(entry)] = cmdline(int(entry))
    return found


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Standalone:
    """`shadowtopic standalone` as a subprocess on free loopback ports and its own data dir;
    output in files. `close()` kills it and anything it or its children left behind."""

    def __init__(self, tmp_path, compaction: bool = True, args: tuple[str, ...] = ()):
        """`compaction=False`: `--no-compaction` (no worker, no JVM: a test of supervision
        that does not compact starts in seconds); `args`: more flags (`--secure`)."""
        self.compaction = compaction
        self.args = list(args)
        (self.port, self.etcd_port, self.peer_port, self.shadow_port,
         self.compaction_port) = free_ports(5)
        self.data_dir = str(tmp_path / "data")
        self.out_path, self.err_path = tmp_path / "stdout", tmp_path / "stderr"
        self.url = f"127.0.0.1:{self.port}"
        self.seen: set[int] = set()
        self.proc: subprocess.Popen | None = None

    def start(self) -> Standalone:
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [EXE, "standalone", "--data-dir", self.data_dir, "--port", str(self.port),
                 "--etcd-port", str(self.etcd_port), "--etcd-peer-port", str(self.peer_port),
                 "--shadow-port", str(self.shadow_port),
                 "--compaction-port", str(self.compaction_port),
                 *([] if self.compaction else ["--no-compaction"]), *self.args],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        return self

    @property
    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60) -> None:
        wait_for(lambda: "is ready" in self.stdout or self.proc.poll() is not None, timeout,
                   "the ready banner")
        assert self.proc.poll() is None, f"standalone exited: {self.stdout}{self.stderr}"

    def children(self) -> dict[int, str]:
        found = children(self.proc.pid)
        self.seen.update(found)
        return found

    def broker_pid(self) -> int:
        pids = [p for p, cmd in self.children().items() if "-m shadowtopic.broker " in cmd]
        assert len(pids) == 1, f"expected one broker child, found {self.children()}"
        return pids[0]

    def ours(self) -> list[int]:
        """Live processes started for this data dir (etcd and brokers name it in argv)."""
        return [int(e) for e in os.listdir("/proc")
                if e.isdigit() and self.data_dir in cmdline(int(e)) and alive(int(e))]

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(10)
        for pid in self.seen | set(self.ours()):
            if alive(pid) and self.data_dir in cmdline(pid):
                os.kill(pid, signal.SIGKILL)
