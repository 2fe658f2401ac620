"""Integration fixtures: real broker processes against the session's real etcd.

Each test gets its own broker (own data dir, free loopback port) and unique topic names, so
tests never see each other's data although they share one etcd.
"""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from source.broker.server import free_port
from source.client import Client
from source.standalone import BrokerProcess


@pytest.fixture
def broker(etcd_server, tmp_path):
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "data"), free_port(),
                      extra_args=["--lease-ttl", "3"])
    b.start(timeout=60)
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
def cli(broker):
    """Run the `shadowtopic` CLI against the test broker: cli(*args) -> CompletedProcess."""
    exe = os.path.join(os.path.dirname(sys.executable), "shadowtopic")

    def run(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
        env = dict(os.environ, SHADOWTOPIC_URL=broker.url)
        res = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout,
                             env=env, stdin=subprocess.DEVNULL)
        if check and res.returncode != 0:
            raise AssertionError(f"shadowtopic {' '.join(args)} failed: {res.stderr}")
        return res

    return run
