"""The processes of a chaos run: a private etcd, a source broker, a shadow broker and a
compaction worker, on one private data root and loopback ports of their own.

With `s3=True` the storage root and the source broker's write-ahead log are on an S3 server
(moto's, a process of its own that is never a fault target: it holds its data in memory),
as a deployment that can lose a machine has them.

Every fault is a method of `Cluster`: `kill(target)` (SIGKILL, the process is gone until
`restart(target)`, which starts it again on the same data dir and port without waiting),
`lose(target)` (the machine is lost: SIGKILL, then its data dir is deleted, so it restarts
as a new broker on an empty disk) and `pause(target)` / `resume(target)` (SIGSTOP /
SIGCONT). `serving(target)` is one readiness
probe. `close()` kills everything it started, the children of the compaction worker (Spark's
JVM) included; it is safe to call more than once.

All processes are spawned from the caller's thread; call this from the main thread so that
`shadowtopic.process.spawn` makes them die with the driver even under kill -9.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import time
import uuid

import boto3

from shadowtopic.broker.server import free_port
from shadowtopic.metadata.etcd_server import EtcdServer
from shadowtopic.process import spawn
from shadowtopic.standalone import BrokerProcess, serving

TARGETS = ("source", "shadow", "worker", "etcd")


def _children(pid: int) -> list[int]:
    """Every descendant of `pid` (from /proc), deepest last."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


S3_ENV = {"AWS_ACCESS_KEY_ID": "chaos", "AWS_SECRET_ACCESS_KEY": "not-a-secret",
          "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


class MotoS3:
    """moto's S3 server on a free loopback port, with one bucket."""

    def __init__(self, log_path: str):
        self.port = free_port()
        self.log_path = log_path
        self.proc = None
        self.bucket = f"chaos-{uuid.uuid4().hex[:8]}"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        self.proc = spawn([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                           str(self.port)], self.log_path)
        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                              aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"])
        deadline = time.monotonic() + timeout
        while True:  # bounded by the deadline
            try:
                client.create_bucket(Bucket=self.bucket)
                return
            except Exception:  # noqa: BLE001 - not listening yet
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"moto did not start (see {self.log_path})") from None
                time.sleep(0.1)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Cluster:
    def __init__(self, root: str, lease_ttl: int = 3, spark_master: str = "local[1]",
                 s3: bool = False):
        self.root = root
        self.logs = os.path.join(root, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.cluster = f"chaos-{uuid.uuid4().hex[:8]}"
        self.etcd = EtcdServer(os.path.join(root, "etcd"),
                               log_path=os.path.join(self.logs, "etcd.log"))
        self.storage = os.path.join(root, "storage")
        self.lease_ttl = lease_ttl
        self.spark_master = spark_master
        self.procs: dict[str, BrokerProcess] = {}
        self.paused: set[str] = set()
        self._worker_kids: list[int] = []
        self.s3 = MotoS3(os.path.join(self.logs, "moto.log")) if s3 else None

    # ---- start / stop --------------------------------------------------------------------

    def start(self) -> None:
        self.etcd.start(timeout=60)
        env, s3_args, wal = None, [], []
        if self.s3 is not None:
            self.s3.start()
            self.storage = f"s3://{self.s3.bucket}/root"
            env = S3_ENV
            s3_args = ["--s3-endpoint", self.s3.endpoint, "--s3-region", "us-east-1"]
            wal = ["--wal", f"s3://{self.s3.bucket}/wal"]
        args = ["--lease-ttl", str(self.lease_ttl), "--storage-root", self.storage,
                "--cluster", self.cluster, *s3_args]
        ep = self.etcd.endpoint
        self.procs["source"] = BrokerProcess(
            ep, os.path.join(self.root, "source"), free_port(), extra_args=[*args, *wal],
            log_path=os.path.join(self.logs, "source.log"), env=env)
        self.procs["shadow"] = BrokerProcess(
            ep, os.path.join(self.root, "shadow"), free_port(), extra_args=args,
            module="shadowtopic.shadow.broker", log_path=os.path.join(self.logs, "shadow.log"),
            env=env)
        self.procs["worker"] = BrokerProcess(
            ep, os.path.join(self.root, "worker"), free_port(),
            module="shadowtopic.compaction.worker",
            log_path=os.path.join(self.logs, "worker.log"), env=env,
            extra_args=["--spark-master", self.spark_master, "--grace", "1",
                        "--lease-ttl", str(self.lease_ttl), "--relist", "1",
                        "--cluster", self.cluster, *s3_args])
        self.procs["source"].start(timeout=60)
        self.procs["shadow"].start(timeout=60)
        self.procs["worker"].start(timeout=240)

    def url(self, target: str) -> str:
        return self.procs[target].url

    def log_path(self, target: str) -> str:
        return str(self.etcd.log_path) if target == "etcd" else self.procs[target].log_path

    def pid(self, target: str) -> int | None:
        proc = self.etcd.proc if target == "etcd" else self.procs[target].proc
        return None if proc is None or proc.poll() is not None else proc.pid

    # ---- faults --------------------------------------------------------------------------

    def kill(self, target: str) -> None:
        """SIGKILL `target` (and, for the worker, the JVM it started) and reap it."""
        self.paused.discard(target)
        if target == "etcd":
            self.etcd.kill()
            return
        pid = self.pid(target)
        kids = _children(pid) if pid else []
        self.procs[target].kill()
        for k in kids:  # Spark's JVM: not ours to leave behind
            try:
                os.kill(k, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def lose(self, target: str) -> None:
        """The machine of broker `target` is lost: SIGKILL, then its whole data dir (broker
        id, local WAL copy, logs' dir aside) is deleted; `restart` brings up a new broker
        on an empty disk at the same address."""
        self.kill(target)
        data_dir = self.procs[target].data_dir
        shutil.rmtree(data_dir, ignore_errors=True)
        os.makedirs(data_dir)

    def restart(self, target: str) -> None:
        """Start `target` again on the same data dir and port. etcd: waits until it answers
        (<= 60 s); the others: returns at once (poll `serving`)."""
        if target == "etcd":
            self.etcd.start(timeout=60)
        else:
            self.procs[target].start(wait=False)

    def pause(self, target: str) -> None:
        pid = self.pid(target)
        if pid:
            os.kill(pid, signal.SIGSTOP)
            self.paused.add(target)

    def resume(self, target: str) -> None:
        pid = self.pid(target)
        if pid:
            os.kill(pid, signal.SIGCONT)
        self.paused.discard(target)

    def serving(self, target: str) -> bool:
        if target == "etcd":
            return self.etcd.running()
        return self.procs[target].exit_code() is None and serving(self.url(target), 0.5)

    def exited(self, target: str) -> int | None:
        """The exit code if `target` has exited (it should not have), else None."""
        if target == "etcd":
            return None if self.etcd.running() else -1
        return self.procs[target].exit_code()

    def log_tail(self, target: str, n: int = 20) -> str:
        if target == "etcd":
            return self.etcd.log_tail(n)
        return self.procs[target].log_tail(n)

    # ---- clean-up ------------------------------------------------------------------------

    def close(self) -> None:
        for target in list(self.paused):
            try:
                self.resume(target)
            except OSError:
                pass
        for target in ("worker", "shadow", "source"):
            if target in self.procs:
                try:
                    self.kill(target)
                except OSError:
                    pass
        self.etcd.kill()
        if self.s3 is not None:
            self.s3.close()
        time.sleep(0.1)
