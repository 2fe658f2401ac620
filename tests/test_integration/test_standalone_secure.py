"""`shadowtopic standalone --secure` (docs/SECURITY.md): TLS on every port, token
authentication and authorization with files it makes under <data-dir>/security; its banner
says where the admin token is; a client with them works (a shadow fed broker to broker
included), one without TLS or without a token is refused, another role without grants is
denied."""
from __future__ import annotations

import os
import pathlib
import stat

import pytest
from support.standalone_process import Standalone

from shadowtopic.client import Client
from shadowtopic.core import errors
from shadowtopic.security import tokens


@pytest.fixture
def secure(tmp_path):
    st = Standalone(tmp_path, compaction=False, args=("--secure",)).start()
    try:
        st.wait_ready(90)
        yield st
    finally:
        st.close()


def test_a_secure_standalone_serves_tls_and_tokens_only(secure):
    sec = pathlib.Path(secure.data_dir) / "security"
    out = secure.stdout
    assert f"shadowtopic+ssl://{secure.url}" in out and str(sec / "admin.token") in out
    for name in ("ca.crt", "broker.key", "secret.key", "admin.token", "broker.token"):
        assert stat.S_IMODE(os.stat(sec / name).st_mode) == 0o600, name
    ca, admin = str(sec / "ca.crt"), sec / "admin.token"
    with Client(f"shadowtopic+ssl://{secure.url}", timeout=20, tls_trust_certs_file=ca,
                auth_token=admin) as c:
        topic = "persistent://public/default/secure"
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(topic + "-shadow", topic)
        with c.create_producer(topic) as p:
            p.send(b"hello")
        with c.create_reader(topic + "-shadow", "earliest") as r:  # broker to broker
            assert r.read_next(timeout=20).value() == "hello"
    with Client(secure.url, timeout=2, operation_timeout=2) as plain:
        with pytest.raises(errors.ServiceUnavailable):
            plain.admin.list_topics("public/default")
    with Client(secure.url, timeout=5, operation_timeout=2, tls_trust_certs_file=ca) as anon:
        with pytest.raises(errors.Unauthenticated):
            anon.admin.list_topics("public/default")
    # authorization is on: a valid token of another role needs grants
    app = tokens.create_token("app", (sec / "secret.key").read_bytes())
    with Client(f"shadowtopic+ssl://{secure.url}", timeout=5, operation_timeout=2,
                tls_trust_certs_file=ca, auth_token=app) as c:
        with pytest.raises(errors.PermissionDenied, match="'app'"):
            c.admin.create_topic("persistent://public/default/not-yours")
