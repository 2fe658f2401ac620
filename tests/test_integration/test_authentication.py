"""Authentication (docs/SECURITY.md, "Authentication"), against real broker processes: a
broker with a token key refuses every service's calls without a valid token (absent, bad,
expired, wrongly signed, `none`), with UNAUTHENTICATED and its reason, before the handler
runs; valid tokens work from the client, the asyncio client and the CLI, and between brokers
(a shadow fed by replication); a stream whose token expires ends with UNAUTHENTICATED; the
audit log names roles, never tokens; reflection is off unless asked for."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from shadowtopic.client import AsyncClient, Client
from shadowtopic.core import errors
from shadowtopic.pb.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    replication_pb2,
    replication_pb2_grpc,
    storage_pb2,
    storage_pb2_grpc,
)
from shadowtopic.security import tokens
from shadowtopic.security.authentication import AuthOptions
from shadowtopic.testing import SHADOW_BROKER, fresh_topic, start_broker

EXE = os.path.join(os.path.dirname(sys.executable), "shadowtopic")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    secret, other = tokens.create_secret_key(), tokens.create_secret_key()
    path = d / "secret.key"
    path.write_bytes(secret)
    broker_token = d / "broker.token"
    broker_token.write_text(tokens.create_token("broker", secret))
    return {"secret": secret, "other": other, "path": str(path),
            "broker_token": str(broker_token)}


@pytest.fixture(scope="module")
def cluster(keys, etcd_server, tmp_path_factory):
    """A source and a shadow broker that take tokens only; each dials the other with its
    own token."""
    auth = AuthOptions(token_secret_key=keys["path"], client_token_file=keys["broker_token"])
    name = f"auth-{time.monotonic_ns()}"
    d = tmp_path_factory.mktemp("auth-cluster")
    source = start_broker(etcd_server.endpoint, d / "source",
                          args=[*auth.flags(), "--cluster", name, "--metrics-port", "-1"])
    shadow = None
    try:
        shadow = start_broker(etcd_server.endpoint, d / "shadow", module=SHADOW_BROKER,
                              args=[*auth.flags(), "--cluster", name, "--metrics-port", "-1",
                                    "--storage-root", str(d / "source" / "storage")])
        yield source, shadow
    finally:
        for b in (shadow, source):
            if b is not None:
                b.kill()


def token(keys: dict, role: str = "alice", **kw) -> str:
    return tokens.create_token(role, kw.pop("key", keys["secret"]), **kw)


def unsigned(role: str) -> str:
    """A token with `alg: none` (no signature)."""
    def part(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part({'sub': role})}."


def bad_tokens(keys: dict) -> dict[str, str | None]:
    return {"none given": None,
            "expired": token(keys, expiry_s=10, now=time.time() - 3600),
            "signed with another key": token(keys, key=keys["other"]),
            "alg none": unsigned("alice"),
            "garbage": "not-a-token",
            "truncated": token(keys)[:-5]}


@pytest.mark.parametrize("case", ["none given", "expired", "signed with another key",
                                  "alg none", "garbage", "truncated"])
def test_every_client_facing_service_refuses_a_missing_or_bad_token(keys, cluster, case):
    """A4 (docs/BEHAVIOURS.md)."""
    source, _ = cluster
    bad = bad_tokens(keys)[case]
    topic = fresh_topic()
    with Client(source.url, timeout=5, operation_timeout=1, auth_token=bad) as c:
        with pytest.raises(errors.Unauthenticated) as admin_err:
            c.admin.create_topic(topic)
        with pytest.raises(errors.Unauthenticated):
            c.create_producer(topic)
        with pytest.raises(errors.Unauthenticated):
            c.subscribe(topic, "s")
    assert admin_err.value.message  # the reason, e.g. "no token" / "expired"
    with Client(source.url, timeout=5, auth_token=token(keys)) as ok:
        with pytest.raises(errors.TopicNotFound):  # nothing was created by the refused call
            ok.admin.get_topic(topic)


@pytest.mark.parametrize("case", ["none given", "signed with another key"])
def test_broker_to_broker_services_refuse_a_missing_or_bad_token(keys, cluster, case):
    """A4: storage reads (on the source) and replication (on the shadow broker), called as a
    rogue process would, with raw stubs."""
    source, shadow = cluster
    bad = bad_tokens(keys)[case]
    md = [] if bad is None else [("authorization", f"Bearer {bad}")]
    with grpc.insecure_channel(source.url) as ch:
        read = storage_pb2_grpc.StorageStub(ch).ReadEntries(
            storage_pb2.ReadEntriesRequest(topic=fresh_topic(), ledger_id=1, max_entries=1),
            timeout=5, metadata=md)
        with pytest.raises(grpc.RpcError) as err:
            list(read)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with grpc.insecure_channel(shadow.url) as ch:
        stream = replication_pb2_grpc.ReplicationStub(ch).Replicate(
            iter([replication_pb2.ReplicateBatch(shadow=fresh_topic(), source=fresh_topic())]),
            timeout=5, metadata=md)
        with pytest.raises(grpc.RpcError) as err:
            list(stream)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # health answers without credentials (probes carry none)
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        assert health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(), timeout=5).status == \
            health_pb2.HealthCheckResponse.SERVING


def test_valid_tokens_produce_and_read_through_a_shadow_fed_broker_to_broker(keys, cluster):
    """A6: brokers dial each other with their token; the audit log names roles."""
    source, shadow = cluster
    topic = fresh_topic("orders")
    calls = []

    def fresh() -> str:  # a callable token: asked at each call
        calls.append(1)
        return token(keys, expiry_s=3600)
    with Client(source.url, timeout=20, auth_token=fresh) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(topic + "-shadow", topic)
        with c.create_producer(topic) as p:
            for i in range(10):
                p.send(f"m{i}".encode())
        with c.create_reader(topic + "-shadow", "earliest") as r:
            got = [r.read_next(timeout=20).value() for _ in range(10)]
    assert got == [f"m{i}" for i in range(10)] and len(calls) > 3
    audit = source.log_tail(400)
    assert "Admin/CreateTopic by role 'alice' (token)" in audit
    assert "refused /shadowtopic.v1." in audit  # the refusals of the tests before
    assert keys["secret"].hex() not in audit and token(keys) not in audit


def test_the_asyncio_client_and_a_token_file(keys, cluster, tmp_path):
    source, _ = cluster
    path = tmp_path / "alice.token"
    path.write_text(token(keys) + "\n")

    async def main() -> list[str]:
        async with AsyncClient(source.url, timeout=20, auth_token=path) as c:
            return await c.admin.list_topics("public/default")
    assert isinstance(asyncio.run(main()), list)
    path.write_text("rewritten-garbage")  # read again at each call

    async def again() -> None:
        async with AsyncClient(source.url, timeout=5, operation_timeout=1,
                               auth_token=path) as c:
            await c.admin.list_topics("public/default")
    with pytest.raises(errors.Unauthenticated):
        asyncio.run(again())


def test_a_consumer_stream_ends_with_unauthenticated_when_its_token_expires(keys, cluster):
    """A5."""
    source, _ = cluster
    topic = fresh_topic()
    with Client(source.url, timeout=20, auth_token=token(keys)) as admin:
        admin.admin.create_topic(topic)
    short = token(keys, expiry_s=4)
    with Client(source.url, timeout=20, auth_token=short) as c:
        consumer = c.subscribe(topic, "s")
        deadline = time.monotonic() + 30
        with pytest.raises(errors.Unauthenticated, match="expired"):
            while time.monotonic() < deadline:
                try:
                    consumer.receive(timeout=0.5)
                except errors.Timeout:
                    pass
        assert time.monotonic() < deadline


def test_the_cli_takes_a_token_by_flag_or_environment(keys, cluster):
    source, _ = cluster
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHADOWTOPIC_")}
    base = [EXE, "--url", source.url, "-o", "json", "--operation-timeout", "2"]
    ok = subprocess.run([*base, "--auth-token", token(keys), "topics", "list",
                         "public/default"], capture_output=True, text=True, timeout=60, env=env)
    assert ok.returncode == 0, ok.stderr
    assert isinstance(json.loads(ok.stdout), list)
    by_env = subprocess.run([*base, "topics", "list", "public/default"], capture_output=True,
                            text=True, timeout=60,
                            env={**env, "SHADOWTOPIC_AUTH_TOKEN": token(keys)})
    assert by_env.returncode == 0, by_env.stderr
    refused = subprocess.run([*base, "topics", "list", "public/default"], capture_output=True,
                             text=True, timeout=60, env=env)
    lines = refused.stderr.splitlines()
    assert refused.returncode == 1 and len(lines) == 1
    assert lines[0].startswith("error: Unauthenticated: ") and "Traceback" not in refused.stderr


def test_reflection_is_off_unless_asked_for(broker):
    with grpc.insecure_channel(broker.url) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            next(stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def fuzzed_tokens(keys: dict, count: int) -> list[str]:
    """`count` tokens that must never authenticate: cut, re-signed with a wrong algorithm or
    key type, `none`, bit-flipped, huge, or noise (a fixed seed: the run can be repeated)."""
    import hashlib
    import hmac
    import random
    rng = random.Random(31)
    good = token(keys)
    rsa_private, _ = tokens.create_key_pair("RS256")
    ec_private, ec_public = tokens.create_key_pair("ES256")

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    def signed(header: dict, claims: dict, key: bytes) -> str:
        head = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
        return f"{head}.{b64(hmac.new(key, head.encode(), hashlib.sha256).digest())}"
    fixed = [
        unsigned("alice"), unsigned("admin"),
        tokens.create_token("alice", rsa_private, "RS256"),        # a key pair's, not ours
        tokens.create_token("alice", ec_private, "ES256"),
        signed({"alg": "HS256", "typ": "JWT"}, {"sub": "alice"}, ec_public),  # key confusion
        signed({"alg": "HS512", "typ": "JWT"}, {"sub": "alice"}, keys["secret"]),
        signed({"alg": "HS256"}, {"sub": 42}, keys["secret"] + b"x"),
        "a" * 6000, f"{good}.{good}", good.replace(".", ""), "..", ".", "",
        b64(b"\0" * 64), good + "=" * 20,
    ]
    out = list(fixed)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.="
    while len(out) < count:
        kind = rng.randrange(4)
        if kind == 0:                                   # cut anywhere
            out.append(good[:rng.randrange(len(good))])
        elif kind == 1:                                 # one character changed
            i = rng.randrange(len(good))
            c = rng.choice([x for x in alphabet if x != good[i]])
            out.append(good[:i] + c + good[i + 1:])
        elif kind == 2:                                 # noise of any length
            out.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 400))))
        else:                                           # pieces of two tokens spliced
            other = token(keys, role=f"r{rng.randrange(1000)}", key=keys["other"])
            a, b = good.split("."), other.split(".")
            picks = [rng.randrange(2) for _ in a]
            picks[rng.randrange(len(a))] = 1  # at least one piece of the other
            out.append(".".join(pair[i] for pair, i in zip(zip(a, b), picks)))
    return [t for t in out if t != good]


def test_a_fuzz_of_tokens_never_gets_through_and_never_crashes_the_broker(keys, cluster):
    """A4: 300 malformed, mis-signed or oversized tokens against Admin, Producer and Consumer:
    every one refused (UNAUTHENTICATED, or gRPC's own refusal of oversized metadata), nothing
    created, and the broker serves a valid token afterwards."""
    source, _ = cluster
    topic = fresh_topic()
    refused: dict[str, int] = {}
    with grpc.insecure_channel(source.url) as ch:
        admin = admin_pb2_grpc.AdminStub(ch)
        fuzz = fuzzed_tokens(keys, 300)
        for bad in fuzz:
            try:
                admin.CreateTopic(admin_pb2.CreateTopicRequest(topic=topic), timeout=5,
                                  metadata=(("authorization", f"Bearer {bad}"),))
            except grpc.RpcError as exc:
                refused[exc.code().name] = refused.get(exc.code().name, 0) + 1
                continue
            pytest.fail(f"token {bad[:80]!r} was accepted")
    assert set(refused) <= {"UNAUTHENTICATED", "RESOURCE_EXHAUSTED", "INTERNAL"}, refused
    assert sum(refused.values()) == len(fuzz) and refused["UNAUTHENTICATED"] >= len(fuzz) - 5
    with Client(source.url, timeout=20, auth_token=token(keys)) as ok:
        with pytest.raises(errors.TopicNotFound):
            ok.admin.get_topic(topic)
        ok.admin.create_topic(topic)
        with ok.create_producer(topic) as p:
            assert p.send(b"after the fuzz")
