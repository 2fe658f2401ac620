"""Standalone: etcd, then the broker as child processes on one data dir (like
`pulsar standalone`). Ready when the broker's gRPC health says SERVING.

    <data-dir>/etcd       etcd's data
    <data-dir>/storage    ledgers (the storage root) and WALs
    <data-dir>/logs       etcd.log, broker.log

`BrokerProcess` (start a broker process, wait for SERVING, terminate or kill -9 it) is what
tests and benchmarks use too. The shadow broker and the compaction worker join here as
further processes when their issues land.
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


def wait_serving(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Block until gRPC health at `url` says SERVING (raises TimeoutError / RuntimeError)."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(url) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"broker exited with code {proc.returncode}")
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"broker at {url} not SERVING after {timeout}s")


class BrokerProcess:
    """One broker as a child process."""

    def __init__(self, etcd: str, data_dir: str, port: int, host: str = "127.0.0.1",
                 log_path: str | None = None, extra_args: list[str] | None = None):
        self.etcd = etcd
        self.data_dir = data_dir
        self.host = host
        self.port = port
        self.log_path = log_path or os.path.join(data_dir, "logs", f"broker-{port}.log")
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 60.0, wait: bool = True) -> "BrokerProcess":
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "source.broker.server", "--etcd", self.etcd,
             "--data-dir", self.data_dir, "--host", self.host, "--port", str(self.port),
             *self.extra_args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        if wait:
            wait_serving(self.url, timeout, self.proc)
        return self

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
        etcd_port: int = 2379, host: str = "127.0.0.1") -> int:
    data_dir = os.path.abspath(data_dir)
    if wipe and os.path.isdir(data_dir):
        shutil.rmtree(data_dir)
    os.makedirs(os.path.join(data_dir, "logs"), exist_ok=True)
    etcd = EtcdServer(os.path.join(data_dir, "etcd"), client_port=etcd_port,
                      peer_port=etcd_port + 1)
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    broker = BrokerProcess(etcd.endpoint, data_dir, port, host=host,
                           log_path=os.path.join(data_dir, "logs", "broker.log"))
    try:
        print(f"starting etcd ({etcd.binary}) ...", flush=True)
        etcd.start(timeout=60)
        print("starting broker ...", flush=True)
        broker.start(timeout=60)
        print(f"shadowtopic standalone is ready (health SERVING)\n"
              f"  service URL : {broker.url}   (export SHADOWTOPIC_URL={broker.url})\n"
              f"  etcd        : http://{etcd.endpoint}\n"
              f"  data dir    : {data_dir}\n"
              f"  logs        : {os.path.join(data_dir, 'logs')}\n"
              f"Ctrl-C to stop.", flush=True)
        while not stopping:
            if broker.proc.poll() is not None:
                print(f"broker exited with code {broker.proc.returncode}; see "
                      f"{broker.log_path}", file=sys.stderr)
                return 1
            time.sleep(0.2)
        print("stopping ...", flush=True)
        return 0
    except (TimeoutError, RuntimeError, OSError) as exc:
        print(f"error: standalone failed to start: {exc}", file=sys.stderr)
        tail = broker.log_tail(10)
        if tail:
            print(tail, file=sys.stderr)
        return 1
    finally:
        broker.terminate()
        etcd.close()
