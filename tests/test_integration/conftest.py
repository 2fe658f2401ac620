"""Integration fixtures: real broker processes against the session's real etcd, started
through shadowtopic.testing (what users test their code with).

Tests use unique topic names (the `topic` fixture: a namespace of its own), so they never
see each other's data although they share one etcd and, by default, one broker: `broker` is
the test process's shared broker. A test that kills, restarts or pauses its broker, or
looks at its data directory or log as a whole, is marked `@pytest.mark.own_broker` and gets
a broker of its own (own data dir, free loopback port). A test that stops the shared broker
without the mark fails, and the broker is started again for the tests after it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest
from support.brokers import BROKER_ARGS
from support.policy_broker import ARGS as QUICK_ARGS

from shadowtopic.client import Client
from shadowtopic.testing import SHADOW_BROKER, start_broker


@pytest.fixture(scope="session")
def shared_broker(etcd_server, tmp_path_factory):
    """The broker of every test in this test process that does not need its own."""
    b = start_broker(etcd_server.endpoint, tmp_path_factory.mktemp("shared-broker"),
                     args=BROKER_ARGS)
    try:
        yield b
    finally:
        b.kill()


@pytest.fixture
def broker(request, etcd_server, tmp_path):
    """The shared broker, or with `@pytest.mark.own_broker` a fresh one, killed afterwards."""
    if request.node.get_closest_marker("own_broker") is None:
        b = request.getfixturevalue("shared_broker")
        pid = b.proc.pid
        yield b
        if b.proc.pid != pid or b.proc.poll() is not None:
            b.kill()
            b.start(timeout=60)
            pytest.fail("the test stopped the shared broker: mark it @pytest.mark.own_broker")
        return
    b = start_broker(etcd_server.endpoint, tmp_path / "data", args=BROKER_ARGS)
    try:
        yield b
    finally:
        b.kill()


@pytest.fixture
def client(broker):
    with Client(broker.url, timeout=20) as c:
        yield c


@pytest.fixture
def topic():
    """A fresh topic name in a namespace of its own."""
    return f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"


@pytest.fixture
def cli(binary_cli):
    """Run the `shadowtopic` CLI against the test broker: cli(*args) -> CompletedProcess.
    The installed console script (`binary_cli`); a module whose tests run many commands may
    override it with support.cli_inprocess's `runner` (their command in this process)."""
    return binary_cli


@pytest.fixture
def binary_cli(broker):
    """Run the installed `shadowtopic` console script against the test broker:
    cli(*args) -> CompletedProcess."""
    exe = os.path.join(os.path.dirname(sys.executable), "shadowtopic")

    def run(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
        env = dict(os.environ, SHADOWTOPIC_URL=broker.url)
        res = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout,
                             env=env, stdin=subprocess.DEVNULL)
        if check and res.returncode != 0:
            raise AssertionError(f"shadowtopic {' '.join(args)} failed: {res.stderr}")
        return res

    return run


@pytest.fixture
def two_brokers(etcd_server, tmp_path):
    """Two broker processes on one shared storage root (short leases): (a, b)."""
    shared = str(tmp_path / "shared-storage")
    args = ["--lease-ttl", "3", "--storage-root", shared]
    started = []
    try:
        started.append(start_broker(etcd_server.endpoint, tmp_path / "a", args=args))
        started.append(start_broker(etcd_server.endpoint, tmp_path / "b", args=args))
        yield tuple(started)
    finally:
        for broker in started:
            if broker.proc is not None and broker.proc.poll() is None:
                os.kill(broker.proc.pid, signal.SIGCONT)  # a test may have paused it
            broker.kill()


class Pairs:
    """`start(*extra_broker_args)` -> (source broker, shadow broker) under `root`: both on
    one shared storage root, short leases, and a cluster of their own (brokers of earlier
    tests, killed with their leases not yet expired, are still registered in the session's
    etcd and must not be picked for a shadow). `close()` kills them."""

    def __init__(self, etcd, root) -> None:
        self.etcd, self.root = etcd, root
        self.started: list = []

    def start(self, *extra: str):
        shared = str(self.root / "shared-storage")
        args = ["--lease-ttl", "3", "--storage-root", shared,
                "--cluster", f"c-{uuid.uuid4().hex[:8]}", *extra]
        src = start_broker(self.etcd.endpoint, self.root / "src", args=args)
        self.started.append(src)
        sh = start_broker(self.etcd.endpoint, self.root / "sh", args=args,
                          module=SHADOW_BROKER)
        self.started.append(sh)
        return src, sh

    def close(self) -> None:
        for b in self.started:
            if b.proc is not None and b.proc.poll() is None:
                os.kill(b.proc.pid, signal.SIGCONT)  # a test may have paused it
            b.kill()


@pytest.fixture
def start_pair(etcd_server, tmp_path):
    """start_pair(*extra_broker_args) -> (source broker, shadow broker) of this test (see
    `Pairs`), killed at teardown."""
    pairs = Pairs(etcd_server, tmp_path)
    try:
        yield pairs.start
    finally:
        pairs.close()


@pytest.fixture(scope="module")
def start_module_pair(etcd_server, tmp_path_factory):
    """`start_pair` for a module-scoped fixture: a pair that the module's tests share (two
    broker starts each saved), for tests that neither stop, pause nor restart its brokers
    nor look at its storage as a whole (each test's topics are its own). Killed after the
    module's last test."""
    pairs = Pairs(etcd_server, tmp_path_factory.mktemp("pair"))
    try:
        yield pairs.start
    finally:
        pairs.close()


@pytest.fixture
def compacting_source(etcd_server, tmp_path, cluster, worker):
    """A source broker of the worker's `cluster`, of this test alone (the test may restart
    it); killed afterwards."""
    b = start_broker(etcd_server.endpoint, tmp_path / "broker",
                     args=[*BROKER_ARGS, "--cluster", cluster])
    try:
        yield b
    finally:
        b.kill()


@pytest.fixture
def quick_broker(etcd_server, tmp_path):
    """A broker of its own whose maintenance (TTL, expiry, quota, retention) runs twice a
    second."""
    b = start_broker(etcd_server.endpoint, tmp_path / "data", args=QUICK_ARGS)
    try:
        yield b
    finally:
        b.kill()
