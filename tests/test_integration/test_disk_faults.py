"""A broker on a full or read-only data disk (docs/BEHAVIOURS.md F14, and F8 under a running
broker): reads go on, writes fail typed, Producer health says NOT_SERVING until the disk
takes writes again, and nothing acknowledged is lost.

The broker's data dir is a small tmpfs mounted for the test (root only: skipped otherwise),
filled with a file to make it full, or remounted read-only; its log is kept off that disk.
"""
from __future__ import annotations

import errno
import os
import subprocess
import time
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.brokers import BROKER_ARGS
from support.metrics_support import base_of, registered_metrics_url, wait_ready

from shadowtopic.broker.server import PRODUCER, free_port
from shadowtopic.client import Client
from shadowtopic.core import errors
from shadowtopic.standalone import BrokerProcess

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
DEADLINE = 20.0  # seconds any awaited state may take (polled, never slept out)


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs mounted at a fresh directory, unmounted afterwards."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    res = _mount("-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt))
    if res.returncode != 0:
        pytest.skip(f"mount is not permitted here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(disk) -> str:
    """Write a file until the disk is full; its path (remove it to free the space)."""
    path = os.path.join(disk, "filler")
    block = b"\xab" * (64 << 10)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                os.write(fd, block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
        while True:  # the last partial block
            try:
                if os.write(fd, b"\xab" * 512) == 0:
                    break
            except OSError:
                break
    finally:
        os.close(fd)
    return path


def health(url: str, service: str = "") -> int:
    with grpc.insecure_channel(url) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=2).status


def wait_health(url: str, service: str, status: int) -> None:
    deadline = time.monotonic() + DEADLINE
    while True:
        now = health(url, service)
        if now == status:
            return
        assert time.monotonic() < deadline, f"{service or 'overall'} health stays {now}"
        time.sleep(0.1)


def start_broker(etcd_server, disk, tmp_path) -> BrokerProcess:
    b = BrokerProcess(etcd_server.endpoint, str(disk / "data"), free_port(),
                      log_path=str(tmp_path / f"broker-{uuid.uuid4().hex[:6]}.log"),
                      extra_args=BROKER_ARGS)
    return b.start(timeout=60)


def read_all(client: Client, topic: str, count: int) -> list[tuple[str, bytes]]:
    with client.create_reader(topic, "earliest") as r:
        return [(str(m.message_id), m.payload) for m in
                (r.read_next(timeout=DEADLINE) for _ in range(count))]


def test_full_disk_fails_writes_typed_keeps_reads_and_recovers(etcd_server, small_disk,
                                                                 tmp_path):
    """F14 (full): produce, roll-ledger and compact -> StorageFull, Producer health
    NOT_SERVING while reads, stats and the overall health go on; once space is freed
    Producer is SERVING, produce and rolls work, and every acknowledged message is there."""
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/full"
    broker = start_broker(etcd_server, small_disk, tmp_path)
    try:
        ready = base_of(registered_metrics_url(etcd_server, broker))
        with Client(broker.url, timeout=20) as c:
            c.admin.create_topic(topic)
            acked = []
            with c.create_producer(topic) as p:
                for i in range(20):
                    acked.append((str(p.send(f"m{i}".encode())), f"m{i}".encode()))
                c.admin.roll_ledger(topic)  # one sealed ledger, one open
                for i in range(20, 30):
                    acked.append((str(p.send(f"m{i}".encode())), f"m{i}".encode()))
                wait_health(broker.url, PRODUCER, SERVING)

                filler = fill(small_disk)
                with pytest.raises(errors.StorageFull):
                    p.send(b"x" * 200_000)
                with pytest.raises(errors.StorageFull):
                    c.admin.roll_ledger(topic)
                with pytest.raises(errors.StorageFull):
                    c.admin.compact(topic)  # it seals the open ledger first
                wait_health(broker.url, PRODUCER, NOT_SERVING)
                assert health(broker.url) == SERVING
                assert health(broker.url, "shadowtopic.v1.Consumer") == SERVING
                assert "storage not writable" in wait_ready(ready, 503)  # HTTP says so too
                assert read_all(c, topic, len(acked)) == acked
                assert c.admin.stats(topic)["msgInCounter"] >= 30

                os.remove(filler)
                wait_health(broker.url, PRODUCER, SERVING)
                assert wait_ready(ready, 200) == "ready\n"
                for i in range(30, 35):
                    acked.append((str(p.send(f"m{i}".encode())), f"m{i}".encode()))
            c.admin.roll_ledger(topic)
            assert read_all(c, topic, len(acked)) == acked
            with c.create_reader(topic, acked[-1][0]) as r:  # nothing after the last ack
                assert not r.has_message_available()
    finally:
        broker.kill()


def test_broker_restarted_on_a_read_only_disk_serves_reads(etcd_server, small_disk, tmp_path):
    """F14 (read-only): a broker restarted (after kill -9) on a read-only remount of its
    data dir says SERVING, serves the acknowledged messages to readers and to the existing
    subscription, refuses produce with StorageReadOnly and says Producer NOT_SERVING; once
    the disk is writable again, Producer is SERVING and produce goes on after them."""
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/ro"
    broker = start_broker(etcd_server, small_disk, tmp_path)
    try:
        with Client(broker.url, timeout=20) as c:
            c.admin.create_topic(topic)
            c.admin.create_subscription(topic, "sub", start="earliest")
            acked = []
            with c.create_producer(topic) as p:
                for i in range(12):
                    acked.append((str(p.send(f"m{i}".encode())), f"m{i}".encode()))
                    if i == 5:
                        c.admin.roll_ledger(topic)  # one sealed ledger, one left open
        broker.kill()
        res = _mount("-o", "remount,ro", str(small_disk))
        assert res.returncode == 0, res.stderr
        broker = start_broker(etcd_server, small_disk, tmp_path)
        assert health(broker.url) == SERVING
        with Client(broker.url, timeout=20) as c:
            assert read_all(c, topic, len(acked)) == acked
            with c.subscribe(topic, "sub") as sub:
                got = [sub.receive(timeout=DEADLINE) for _ in acked]
                assert [(str(m.message_id), m.payload) for m in got] == acked
                for m in got:
                    sub.acknowledge(m)  # kept in memory: the disk takes no cursor file
            with c.create_producer(topic) as p:
                with pytest.raises(errors.StorageReadOnly):
                    p.send(b"refused")
            wait_health(broker.url, PRODUCER, NOT_SERVING)
            assert health(broker.url, "shadowtopic.v1.Admin") == SERVING
            assert c.admin.stats(topic)["subscriptions"]["sub"]["msgBacklog"] == 0

            res = _mount("-o", "remount,rw", str(small_disk))
            assert res.returncode == 0, res.stderr
            wait_health(broker.url, PRODUCER, SERVING)
            with c.create_producer(topic) as p:
                acked.append((str(p.send(b"after")), b"after"))
            assert read_all(c, topic, len(acked)) == acked
    finally:
        broker.kill()
