"""Health follows the broker's etcd session; graceful shutdown releases ownership."""
from __future__ import annotations

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.etcd_support import etcd_get

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client
from shadowtopic.core.names import TopicName
from shadowtopic.metadata import keys
from shadowtopic.metadata.etcd_server import EtcdServer
from shadowtopic.standalone import BrokerProcess, wait_serving


def health(url: str) -> int:
    with grpc.insecure_channel(url) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                    timeout=2).status


@pytest.mark.slow
def test_broker_started_before_etcd_serves_once_etcd_is_up(tmp_path):
    """F5: NOT_SERVING while etcd is down, SERVING once it is up, no crash loop."""
    etcd = EtcdServer(tmp_path / "etcd")
    broker = BrokerProcess(etcd.endpoint, str(tmp_path / "data"), free_port())
    try:
        broker.start(wait=False)
        deadline = time.monotonic() + 30
        status = None
        while time.monotonic() < deadline:
            try:
                status = health(broker.url)
                break
            except grpc.RpcError:
                time.sleep(0.1)
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        time.sleep(1.0)
        assert broker.proc.poll() is None, "broker exited while etcd was down"
        etcd.start()
        wait_serving(broker.url, timeout=30, proc=broker.proc)
        with Client(broker.url) as c:
            c.admin.create_topic("persistent://public/health/t")
            with c.create_producer("persistent://public/health/t") as p:
                assert p.send(b"up").ledger_id >= 1
    finally:
        broker.kill()
        etcd.close()


@pytest.mark.slow
@pytest.mark.own_broker
def test_sigterm_exits_promptly_and_releases_ownership(broker, client, topic, etcd_server, arun):
    """F9 (part): SIGTERM ends the broker within its grace period and frees its topics."""

    client.admin.create_topic(topic)
    with client.create_producer(topic) as p:
        p.send(b"x")
    with client.create_reader(topic) as r:      # an open consumer stream must not hold it up
        assert r.read_next(timeout=10).payload == b"x"
        t = time.monotonic()
        assert broker.terminate(timeout=30) == 0
        assert time.monotonic() - t < 8

    assert etcd_get(etcd_server, keys.ownership("standalone", TopicName.parse(topic))) is None
