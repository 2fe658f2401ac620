"""A real Spark standalone cluster for tests: a master and workers, each a JVM of its own.

PySpark ships `bin/spark-class` but not Spark's `sbin/start-*.sh` scripts, so the daemons
start the way those scripts start them:

    spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 --port P --webui-port W
    spark-class org.apache.spark.deploy.worker.Worker spark://127.0.0.1:P --host 127.0.0.1 \\
        --cores C --memory M --work-dir DIR --webui-port W2

on loopback ports, with their work dirs and logs under `base`. `start()` returns once the
master's web UI (`/json/`) lists every worker ALIVE. The executors a worker launches inherit
its environment: `env` carries what the tasks need (the object store's credentials, the
Python of this venv for PySpark's workers). Each process dies with the test process
(source/process.py `spawn`); `close()` kills them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pyspark

from shadowtopic.broker.server import free_port
from shadowtopic.process import spawn

HOST = "127.0.0.1"
SPARK_CLASS = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


class SparkCluster:
    def __init__(self, base: str, workers: int = 2, cores: int = 1, memory: str = "1g",
                 env: dict[str, str] | None = None):
        self.base = base
        self.workers, self.cores, self.memory = workers, cores, memory
        self.env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
                    "SPARK_LOG_DIR": os.path.join(base, "logs"), **(env or {})}
        self.port, self.ui_port = free_port(), free_port()
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    def _spawn(self, name: str, *args: str) -> None:
        self.procs.append(spawn([SPARK_CLASS, *args], os.path.join(self.base, f"{name}.log"),
                                env=self.env))

    def start(self, timeout: float = 120.0) -> SparkCluster:
        try:
            self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", HOST,
                        "--port", str(self.port), "--webui-port", str(self.ui_port))
            for i in range(self.workers):
                work = os.path.join(self.base, f"worker{i}")
                os.makedirs(work, exist_ok=True)
                self._spawn(f"worker{i}", "org.apache.spark.deploy.worker.Worker",
                            self.master_url, "--host", HOST, "--cores", str(self.cores),
                            "--memory", self.memory, "--work-dir", work,
                            "--webui-port", str(free_port()))
            self._wait_alive(timeout)
            return self
        except BaseException:
            self.close()
            raise

    def state(self) -> dict:
        """The master's state (its web UI's `/json/`: workers, active applications, ...);
        empty while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.ui_port}/json/", timeout=2) as r:
                state: dict = json.load(r)
                return state
        except OSError:
            return {}

    def alive_workers(self) -> int:
        """Workers the master lists ALIVE."""
        return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")

    def applications(self) -> list[dict]:
        """The applications running on the cluster (name, cores, ...)."""
        apps: list[dict] = self.state().get("activeapps", [])
        return apps

    def _wait_alive(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for _ in range(int(timeout * 4) + 1):  # bounded: every 0.25 s until the deadline
            if self.alive_workers() == self.workers:
                return
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        raise RuntimeError(f"the Spark cluster did not come up ({self.alive_workers()} of "
                           f"{self.workers} workers alive): {self.log_tail()}")

    def log_tail(self) -> str:
        out = []
        for name in ["master", *(f"worker{i}" for i in range(self.workers))]:
            try:
                with open(os.path.join(self.base, f"{name}.log"), errors="replace") as f:
                    out.append(f"--- {name}\n{f.read()[-1500:]}")
            except OSError:
                pass
        return "\n".join(out)

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
