"""`/healthz` and `/readyz` of a broker (source/observability/http.py), on real processes:
`/readyz` says 503 with the reason while etcd is away (a private etcd, killed and restarted
on its data dir) and 200 again once it is back, while `/healthz` stays 200; the default
metrics port falls back to a free one when taken, an explicit one that is taken is refused;
what the endpoint answers to other paths and methods. The full-disk side (`/readyz` 503
while Producer is NOT_SERVING) is in test_disk_faults.py."""
from __future__ import annotations

import gzip
import re
import socket
import urllib.error
import urllib.request
import uuid

import pytest
from support.metrics_support import base_of, get, registered_metrics_url, scrape, value, wait_ready

from shadowtopic.broker.server import free_port
from shadowtopic.metadata import EtcdServer
from shadowtopic.standalone import BrokerProcess


def test_readyz_follows_etcd_and_healthz_stays_up(tmp_path):
    etcd = EtcdServer(data_dir=tmp_path / "etcd").start()
    port, cluster = free_port(), f"c-{uuid.uuid4().hex[:8]}"
    b = BrokerProcess(etcd.endpoint, str(tmp_path / "data"), free_port(),
                      extra_args=["--lease-ttl", "2", "--metrics-port", str(port),
                                  "--cluster", cluster])
    base = f"http://127.0.0.1:{port}"
    try:
        b.start(timeout=60)
        assert wait_ready(base, 200) == "ready\n"
        assert get(base + "/healthz")[:2] == (200, "ok\n")
        etcd.kill()
        body = wait_ready(base, 503)
        assert body.startswith("not ready: etcd ") and "unreachable" in body, body
        assert body.count("\n") == 1  # one line
        assert get(base + "/healthz")[:2] == (200, "ok\n")
        assert value(scrape(base + "/metrics"), "shadowtopic_broker_ready", cluster=cluster) == 0
        etcd.restart()
        assert wait_ready(base, 200) == "ready\n"
        assert value(scrape(base + "/metrics"), "shadowtopic_broker_ready", cluster=cluster) == 1
    finally:
        b.kill()
        etcd.close()


def _taken_default_metrics_port() -> tuple[int, socket.socket]:
    """A free gRPC port whose default metrics port (port + 1000) this test holds: tried
    again (bounded) when another process of the run has port + 1000 already."""
    for _ in range(50):
        port = free_port()
        if port + 1000 > 65535:
            continue
        taken = socket.socket()
        try:
            taken.bind(("127.0.0.1", port + 1000))
        except OSError:  # in use by another test's process
            taken.close()
            continue
        taken.listen(1)
        return port, taken
    raise AssertionError("no port with port + 1000 free in 50 tries")


def test_default_port_falls_back_when_taken_an_explicit_one_is_refused(etcd_server, tmp_path):
    port, taken = _taken_default_metrics_port()
    with taken:  # the default metrics port (port + 1000) is taken
        b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "a"), port,
                          extra_args=["--lease-ttl", "3"])
        try:
            b.start(timeout=60)
            url = registered_metrics_url(etcd_server, b)
            assert url.startswith("http://127.0.0.1:") and f":{port + 1000}/" not in url
            assert wait_ready(base_of(url), 200) == "ready\n"
        finally:
            b.kill()
        held = taken.getsockname()[1]
        c = BrokerProcess(etcd_server.endpoint, str(tmp_path / "c"), free_port(),
                          extra_args=["--lease-ttl", "3", "--metrics-port", str(held)])
        with pytest.raises(RuntimeError, match="cannot bind the metrics port"):
            c.start(timeout=60)
        c.kill()


def test_other_paths_and_methods(broker, etcd_server):
    base = base_of(registered_metrics_url(etcd_server, broker))
    status, body, _ = get(base + "/nope")
    assert status == 404 and "/metrics" in body
    req = urllib.request.Request(base + "/metrics", data=b"x", method="POST")
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("POST answered 200")
    except urllib.error.HTTPError as e:
        assert e.code == 405
    # a scraper that accepts gzip gets it, and the same series
    req = urllib.request.Request(base + "/metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        text = gzip.decompress(r.read()).decode()
    assert re.search(r"^# TYPE pulsar_in_messages(_total)? counter$", text, re.M)
    assert "# TYPE grpc_server_handling_seconds histogram" in text
    # a client that sends nothing holds nobody up: the endpoint answers others meanwhile
    with socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1]))):
        assert get(base + "/healthz")[:2] == (200, "ok\n")
