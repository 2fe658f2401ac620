"""TLS on every gRPC port (docs/SECURITY.md, "TLS"), against real broker processes: clients
and brokers dial with TLS, mutual TLS refuses a client without a trusted certificate, a
plaintext client is refused by a TLS port and a TLS client never falls back to plaintext,
and a broker serves a rotated certificate to new connections without a restart."""
from __future__ import annotations

import shutil
import time

import pytest

from shadowtopic.client import Client
from shadowtopic.core import errors
from shadowtopic.security import certs
from shadowtopic.security.tls import TlsOptions
from shadowtopic.testing import SHADOW_BROKER, fresh_topic, start_broker

HOSTS = ["127.0.0.1", "localhost"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Two CAs: the cluster's (a broker certificate for loopback, a client's for role
    `alice`) and another (a broker certificate and a client's it signed)."""
    d = tmp_path_factory.mktemp("pki")
    ca, other = certs.make_ca("cluster CA"), certs.make_ca("other CA")
    out = {"ca": certs.write(ca, str(d), "ca")[0],
           "other_ca": certs.write(other, str(d), "other-ca")[0]}
    out["broker"], out["broker_key"] = certs.write(certs.issue(ca, "broker", HOSTS), str(d),
                                                   "broker")
    out["alice"], out["alice_key"] = certs.write(certs.issue(ca, "alice"), str(d), "alice")
    out["other_broker"], out["other_broker_key"] = certs.write(
        certs.issue(other, "broker", HOSTS), str(d), "other-broker")
    out["mallory"], out["mallory_key"] = certs.write(certs.issue(other, "mallory"), str(d),
                                                     "mallory")
    return out


@pytest.fixture(scope="module")
def cluster(pki, etcd_server, tmp_path_factory):
    """A source and a shadow broker serving mutual TLS only, each dialling the other with
    the cluster certificate; callers are authenticated by their certificate (`--auth-tls`:
    the role is its common name)."""
    tls = TlsOptions(pki["broker"], pki["broker_key"], pki["ca"], require_client_cert=True)
    name = f"tls-{time.monotonic_ns()}"
    d = tmp_path_factory.mktemp("tls-cluster")
    source = start_broker(etcd_server.endpoint, d / "source", tls=tls,
                          args=["--cluster", name, "--metrics-port", "-1", "--auth-tls"])
    shadow = None
    try:
        shadow = start_broker(etcd_server.endpoint, d / "shadow", tls=tls, module=SHADOW_BROKER,
                              args=["--cluster", name, "--metrics-port", "-1", "--auth-tls",
                                    "--storage-root", str(d / "source" / "storage")])
        yield source, shadow
    finally:
        for b in (shadow, source):
            if b is not None:
                b.kill()


def tls_client(url: str, pki: dict, **kw) -> Client:
    kw.setdefault("tls_trust_certs_file", pki["ca"])
    return Client(url, timeout=10, operation_timeout=kw.pop("operation_timeout", 20), **kw)


def test_a_client_with_a_trusted_certificate_produces_and_reads_through_a_shadow(pki,
                                                                                cluster):
    """A2, A6 (docs/BEHAVIOURS.md)."""
    source, _shadow = cluster
    topic = fresh_topic("orders")
    with tls_client(source.url, pki, tls_cert_file=pki["alice"],
                    tls_key_file=pki["alice_key"]) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(topic + "-shadow", topic)
        with c.create_producer(topic) as p:
            ids = [p.send(f"m{i}".encode(), key=f"k{i}") for i in range(20)]
        # the shadow's broker serves it (the client is redirected there, over TLS); its
        # entries come from the source's owner through replication, broker to broker
        with c.create_reader(topic + "-shadow", "earliest") as r:
            got = [r.read_next(timeout=20) for _ in ids]
        assert [m.value() for m in got] == [f"m{i}" for i in range(20)]
        # asked of the source broker, which forwards it to the shadow's owner over mutual
        # TLS: only the owner knows what it delivered
        stats = c.admin.stats(topic + "-shadow")
        assert stats["ownerBroker"] == _shadow.url and stats["msgOutCounter"] == 20
    # the role is the certificate's common name: the client's, and the brokers' own
    assert "Admin/CreateTopic by role 'alice' (tls)" in source.log_tail(400)
    assert "by role 'broker' (tls)" in _shadow.log_tail(400)  # the forwarded stats call


def test_a_plaintext_client_is_refused_and_the_broker_goes_on(pki, cluster):
    """A1."""
    source, _ = cluster
    with Client(source.url, timeout=2, operation_timeout=2) as plain:
        with pytest.raises(errors.ServiceUnavailable):
            plain.admin.list_topics("public/default")
    with tls_client(source.url, pki, tls_cert_file=pki["alice"],
                    tls_key_file=pki["alice_key"]) as c:
        assert isinstance(c.admin.list_topics("public/default"), list)


@pytest.mark.parametrize("who", ["no certificate", "another CA's certificate"])
def test_mutual_tls_refuses_a_client_without_a_trusted_certificate(pki, cluster, who):
    """A2."""
    source, _ = cluster
    kw = {} if who == "no certificate" else {"tls_cert_file": pki["mallory"],
                                             "tls_key_file": pki["mallory_key"]}
    with tls_client(source.url, pki, operation_timeout=2, **kw) as c:
        with pytest.raises(errors.ServiceUnavailable):
            c.admin.list_topics("public/default")


def test_a_tls_client_never_falls_back_to_plaintext(pki, broker):
    """A1: `broker` serves plaintext: a client told to use TLS fails instead of going on."""
    for url, kw in ((f"shadowtopic+ssl://{broker.url}", {}),
                    (broker.url, {"tls_trust_certs_file": pki["ca"]})):
        with Client(url, timeout=2, operation_timeout=2, **kw) as c:
            with pytest.raises(errors.ServiceUnavailable):
                c.admin.list_topics("public/default")


def test_client_tls_options_are_checked_before_anything_is_sent(pki, tmp_path):
    with pytest.raises(errors.InvalidArgument, match="cert file and its key file"):
        Client("127.0.0.1:1", tls_cert_file=pki["alice"])
    with pytest.raises(errors.InvalidArgument, match="cannot read"):
        Client("127.0.0.1:1", tls_trust_certs_file=str(tmp_path / "missing.pem"))


def test_a_rotated_server_certificate_is_served_to_new_connections_without_a_restart(
        pki, etcd_server, tmp_path):
    """A3."""
    live = tmp_path / "live"
    live.mkdir()
    cert, key = str(live / "broker.crt"), str(live / "broker.key")
    shutil.copy(pki["broker"], cert)
    shutil.copy(pki["broker_key"], key)
    b = start_broker(etcd_server.endpoint, tmp_path / "data",
                     tls=TlsOptions(cert, key, pki["ca"]),
                     args=["--metrics-port", "-1"])
    try:
        with tls_client(b.url, pki) as c:
            c.admin.list_topics("public/default")
        # the new pair (another CA's) replaces the files, each renamed into place
        for src, dst in ((pki["other_broker"], cert), (pki["other_broker_key"], key)):
            shutil.copy(src, dst + ".new")
            shutil.move(dst + ".new", dst)
        deadline = time.monotonic() + 20
        while True:  # (the broker looks at the files at most once a second)
            try:
                with tls_client(b.url, pki, tls_trust_certs_file=pki["other_ca"],
                                operation_timeout=1) as c:
                    c.admin.list_topics("public/default")
                break
            except errors.ServiceUnavailable:
                assert time.monotonic() < deadline, "the new certificate was never served"
        with tls_client(b.url, pki, operation_timeout=1) as old:
            with pytest.raises(errors.ServiceUnavailable):  # the old CA no longer fits
                old.admin.list_topics("public/default")
        assert b.proc.poll() is None  # the same process throughout
    finally:
        b.kill()
