"""Standalone: etcd, then a source broker, a shadow broker and a compaction worker as child
processes on one data dir (like `pulsar standalone`). Ready when every role it started says
SERVING on gRPC health.

    <data-dir>/etcd       etcd's data
    <data-dir>/storage    ledgers (the storage root) and WALs
    <data-dir>/logs       etcd.log, broker.log, shadow-broker.log, compaction-worker.log

The children die with the standalone, even under kill -9 (`source.process.spawn`). It refuses
to start when its service port or etcd's ports are taken (say by an earlier standalone), so
an orphan answering health on the port can never pass for its own broker. A role that
exits is restarted by a `source.process.Supervisor` (back-off 0.5 s doubling to 8 s; 5
failures within a minute stop everything, exit 1); etcd exiting stops everything. SIGTERM
or SIGINT stops the roles, then etcd, exit 0.

`BrokerProcess` (start a broker, shadow broker or worker process, wait for SERVING,
terminate or kill -9 it) is what tests and benchmarks use too.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from source.metadata.etcd_server import EtcdServer
from source.process import FAILED, RUNNING, Supervisor, describe_exit, port_in_use, spawn

LOOPBACK = "127.0.0.1"


def wait_serving(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Block until gRPC health at `url` says SERVING (raises TimeoutError / RuntimeError)."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(url) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"exited with code {proc.returncode}")
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"broker at {url} not SERVING after {timeout}s")


def serving(url: str, timeout: float = 1.0) -> bool:
    """One gRPC health probe: does `url` say SERVING?"""
    with grpc.insecure_channel(url) as ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                        timeout=timeout)
        except grpc.RpcError:
            return False
    return resp.status == health_pb2.HealthCheckResponse.SERVING


class BrokerProcess:
    """One broker as a child process (a `source.process.Role`)."""

    role = "broker"

    def __init__(self, etcd: str, data_dir: str, port: int, host: str = "127.0.0.1",
                 log_path: str | None = None, extra_args: list[str] | None = None,
                 module: str = "source.broker.server", env: dict[str, str] | None = None):
        self.module = module    # the shadow broker is "shadow.broker"
        self.role = {"shadow.broker": "shadow broker",
                     "compaction.worker": "compaction worker"}.get(module, "broker")
        self.etcd = etcd
        self.data_dir = data_dir
        self.host = host
        self.port = port
        self.log_path = log_path or os.path.join(data_dir, "logs", f"broker-{port}.log")
        self.extra_args = extra_args or []
        self.env = env          # added to this process's environment (e.g. failpoints.env)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 60.0, wait: bool = True) -> "BrokerProcess":
        self.proc = spawn([sys.executable, "-m", self.module, "--etcd", self.etcd,
                           "--data-dir", self.data_dir, "--host", self.host,
                           "--port", str(self.port), *self.extra_args], self.log_path,
                           env=dict(os.environ, **self.env) if self.env else None)
        if wait:
            try:
                wait_serving(self.url, timeout, self.proc)
            except RuntimeError as exc:  # it exited: say why, from its log
                raise RuntimeError(f"{self.role} {exc}; the end of {self.log_path}:\n"
                                   f"{self.log_tail(30)}") from None
        return self

    def launch(self) -> None:
        """Start without waiting, refusing a taken port: whoever holds it is not ours."""
        if port_in_use(self.port, self.host):
            raise OSError(f"port {self.port} is in use")
        self.start(wait=False)

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def ready(self) -> bool:
        return serving(self.url)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM (graceful); SIGKILL if it does not exit within `timeout`."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        """kill -9."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode("utf-8", "replace")
        except OSError:
            return ""


def run(data_dir: str = "./data", wipe: bool = False, port: int = 6650,
        etcd_port: int = 2379, host: str = LOOPBACK, etcd_peer_port: int | None = None,
        broker_args: list[str] | None = None, shadow_port: int | None = None,
        compaction_port: int | None = None, worker_args: list[str] | None = None) -> int:
    peer_port = etcd_peer_port or etcd_port + 1
    shadow_port = shadow_port or port + 1
    compaction_port = compaction_port or port + 2
    for p, h in ((port, host), (shadow_port, host), (compaction_port, LOOPBACK),
                 (etcd_port, LOOPBACK), (peer_port, LOOPBACK)):
        try:
            busy = port_in_use(p, h)
        except OSError as exc:
            print(f"error: cannot listen on {h}:{p}: {exc}", file=sys.stderr)
            return 1
        if busy:
            print(f"error: port {p} is in use (is another shadowtopic standalone running?)",
                  file=sys.stderr)
            return 1
    data_dir = os.path.abspath(data_dir)
    if wipe and os.path.isdir(data_dir):
        shutil.rmtree(data_dir)
    logs = os.path.join(data_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    etcd = EtcdServer(os.path.join(data_dir, "etcd"), client_port=etcd_port,
                      peer_port=peer_port, log_path=os.path.join(logs, "etcd.log"))
    broker = BrokerProcess(etcd.endpoint, data_dir, port, host=host,
                           log_path=os.path.join(logs, "broker.log"), extra_args=broker_args)
    # the shadow broker: a data dir of its own, the source broker's storage root (it reads
    # the source's ledgers there and writes none)
    shadow = BrokerProcess(etcd.endpoint, os.path.join(data_dir, "shadow-broker"), shadow_port,
                           host=host, log_path=os.path.join(logs, "shadow-broker.log"),
                           extra_args=[*(broker_args or []), "--storage-root",
                                       os.path.join(data_dir, "storage")],
                           module="shadow.broker")
    # the compaction worker: one warm SparkSession; its port serves gRPC health only
    worker = BrokerProcess(etcd.endpoint, os.path.join(data_dir, "compaction-worker"),
                           compaction_port, host=LOOPBACK,
                           log_path=os.path.join(logs, "compaction-worker.log"),
                           extra_args=worker_args or [], module="compaction.worker")
    roles = [Supervisor(broker), Supervisor(shadow), Supervisor(worker, start_timeout=120)]
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        print(f"starting etcd ({etcd.binary}) ...", flush=True)
        etcd.start(timeout=60)
        print("starting the source and shadow brokers and the compaction worker ...",
              flush=True)
        for role in roles:
            role.start()
        announced = False
        while not stopping:
            states = [role.poll() for role in roles]
            failed = next((r for r in roles if r.state == FAILED), None)
            if failed is not None:
                _report_failure(failed)
                return 1
            if not etcd.running():
                print(f"error: etcd {describe_exit(etcd.proc.returncode)}; stopping "
                      f"(see {etcd.log_path})", file=sys.stderr, flush=True)
                return 1
            if not announced and all(s == RUNNING for s in states):
                announced = True
                print(f"shadowtopic standalone is ready (health SERVING)\n"
                      f"  service URL : {broker.url}   (export SHADOWTOPIC_URL={broker.url})\n"
                      f"  shadow broker: {shadow.url}  (shadow topics; any URL serves them)\n"
                      f"  compaction  : worker health on {worker.url} (Spark)\n"
                      f"  etcd        : http://{etcd.endpoint}\n"
                      f"  data dir    : {data_dir}\n"
                      f"  logs        : {broker.log_path}, {shadow.log_path},\n"
                      f"                {worker.log_path}\n"
                      f"  etcd log    : {etcd.log_path}\n"
                      f"Ctrl-C to stop.", flush=True)
            time.sleep(0.2)
        print("stopping ...", flush=True)
        return 0
    except (RuntimeError, OSError) as exc:
        print(f"error: standalone failed to start: {exc}", file=sys.stderr)
        return 1
    finally:
        for role in reversed(roles):
            role.stop()
        etcd.close()


def _report_failure(sup: Supervisor) -> None:
    if sup.ever_ready:
        print(f"error: {sup.error}; stopping", file=sys.stderr, flush=True)
        return
    print(f"error: standalone failed to start: {sup.error} (see {sup.child.log_path})",
          file=sys.stderr)
    tail = sup.child.log_tail(10)
    if tail:
        print(tail, file=sys.stderr, flush=True)
