"""Authorization (docs/SECURITY.md, "Authorization"; BEHAVIOURS A7-A13), against a real source
broker and a real shadow broker that take tokens and authorize every call:

- tenants and namespaces (a topic's namespace must exist), by superusers and tenant admins;
- a role without a grant is refused (PERMISSION_DENIED) for every Admin RPC and every action,
  and the refused call changes nothing;
- grants at namespace and at topic level, followed by both brokers through etcd; a revoke
  ends an open consumer;
- a shadow's permissions are its own;
- replication and storage reads need `replicate`;
- a call a broker forwards is authorized as its original caller, and only proxy roles may
  forward;
- the CLI's commands and its one-line refusals.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import grpc
import pytest

from shadowtopic.client import Client
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
from shadowtopic.security.authentication import AuthOptions, bearer
from shadowtopic.testing import SHADOW_BROKER, start_broker

EXE = os.path.join(os.path.dirname(sys.executable), "shadowtopic")
ORIGINAL_ROLE = "x-shadowtopic-original-role"


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("authz-keys")
    secret = tokens.create_secret_key()
    (d / "secret.key").write_bytes(secret)
    (d / "broker.token").write_text(tokens.create_token("broker", secret))
    return {"secret": secret, "path": str(d / "secret.key"),
            "broker_token": str(d / "broker.token")}


def token(keys, role: str) -> str:
    return tokens.create_token(role, keys["secret"])


@pytest.fixture(scope="module")
def cluster(keys, etcd_server, tmp_path_factory):
    """A source and a shadow broker: tokens, authorization on; `broker` (their own role)
    is a superuser and a proxy role, `admin` a superuser."""
    auth = AuthOptions(token_secret_key=keys["path"], client_token_file=keys["broker_token"],
                       authorization=True, superuser_roles=("broker", "admin"),
                       proxy_roles=("broker",))
    name = f"authz-{uuid.uuid4().hex[:8]}"
    d = tmp_path_factory.mktemp("authz-cluster")
    common = [*auth.flags(), "--cluster", name, "--metrics-port", "-1"]
    source = start_broker(etcd_server.endpoint, d / "source", args=common)
    shadow = None
    try:
        shadow = start_broker(etcd_server.endpoint, d / "shadow", module=SHADOW_BROKER,
                              args=[*common, "--storage-root", str(d / "source" / "storage")])
        yield source, shadow
    finally:
        for b in (shadow, source):
            if b is not None:
                b.kill()


@pytest.fixture(scope="module")
def admin(keys, cluster):
    with Client(cluster[0].url, timeout=20, auth_token=token(keys, "admin")) as c:
        yield c


@pytest.fixture
def team(admin):
    """A tenant `t-<id>` administered by `<tenant>-admin`, its namespace `ns` and a topic
    holding two messages."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    admin.admin.create_tenant(tenant, [f"{tenant}-admin"])
    admin.admin.create_namespace(f"{tenant}/ns")
    topic = f"persistent://{tenant}/ns/orders"
    admin.admin.create_topic(topic)
    with admin.create_producer(topic) as p:
        p.send(b"one", key="k1")
        p.send(b"two", key="k2")
    admin.admin.create_subscription(topic, "billing", "earliest")
    return {"tenant": tenant, "ns": f"{tenant}/ns", "topic": topic}


def eventually(check, timeout: float = 15.0):
    """`check()` once it stops raising (grants reach a broker through an etcd watch)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except (errors.PermissionDenied, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# ---- tenants and namespaces -------------------------------------------------------------

def test_tenants_and_namespaces_and_a_topics_namespace_must_exist(admin, keys, cluster):
    """A8."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    a = admin.admin
    a.create_tenant(tenant, ["ops"])
    assert a.list_tenants()[tenant] == ["ops"]
    assert "public" in a.list_tenants() and "public/default" in a.list_namespaces("public")
    with pytest.raises(errors.TenantAlreadyExists):
        a.create_tenant(tenant)
    with pytest.raises(errors.NamespaceNotFound, match="namespaces create"):
        a.create_topic(f"persistent://{tenant}/later/t")
    with pytest.raises(errors.TenantNotFound):
        a.create_namespace(f"nobody-{tenant}/ns")
    # the tenant's admin role creates its namespaces and topics; another tenant's may not
    with Client(cluster[0].url, timeout=20, auth_token=token(keys, "ops")) as ops:
        ops.admin.create_namespace(f"{tenant}/later")
        ops.admin.create_topic(f"persistent://{tenant}/later/t")
        assert ops.admin.list_namespaces(tenant) == [f"{tenant}/later"]
        with pytest.raises(errors.PermissionDenied, match="superuser"):
            ops.admin.create_tenant(f"x-{tenant}")
    with pytest.raises(errors.NotEmpty):
        a.delete_namespace(f"{tenant}/later")
    with pytest.raises(errors.NotEmpty):
        a.delete_tenant(tenant)
    a.delete_topic(f"persistent://{tenant}/later/t")
    a.delete_namespace(f"{tenant}/later")
    a.delete_tenant(tenant)
    assert tenant not in a.list_tenants()


# ---- refused calls change nothing -------------------------------------------------------

def _requests(team: dict) -> dict[str, object]:
    """A request for every Admin RPC, naming the team's objects."""
    topic, ns, tenant = team["topic"], team["ns"], team["tenant"]
    shadow = f"persistent://{tenant}/ns/orders-shadow"
    pb = admin_pb2
    return {
        "CreateTopic": pb.CreateTopicRequest(topic=topic + "-2"),
        "DeleteTopic": pb.DeleteTopicRequest(topic=topic, force=True),
        "ListTopics": pb.ListTopicsRequest(namespace=ns),
        "GetTopicMetadata": pb.TopicRequest(topic=topic),
        "GetPolicies": pb.TopicRequest(topic=topic),
        "SetPolicies": pb.SetPoliciesRequest(topic=topic, policies={"max_message_size": 1}),
        "GetTopicStats": pb.TopicRequest(topic=topic),
        "GetInternalStats": pb.TopicRequest(topic=topic),
        "Lookup": pb.TopicRequest(topic=topic),
        "RollLedger": pb.TopicRequest(topic=topic),
        "Truncate": pb.TopicRequest(topic=topic),
        "GetLastMessageId": pb.GetLastMessageIdRequest(topic=topic),
        "GetNamespacePolicies": pb.NamespaceRequest(namespace=ns),
        "SetNamespacePolicies": pb.SetNamespacePoliciesRequest(
            namespace=ns, policies={"max_message_size": 1}),
        "CreateShadowTopic": pb.CreateShadowTopicRequest(shadow=shadow, source=topic),
        "DeleteShadowTopic": pb.TopicRequest(topic=shadow),
        "GetShadowTopics": pb.TopicRequest(topic=topic),
        "GetShadowSource": pb.TopicRequest(topic=topic),
        "CreateSubscription": pb.CreateSubscriptionRequest(topic=topic, subscription="evil"),
        "DeleteSubscription": pb.DeleteSubscriptionRequest(topic=topic, subscription="billing",
                                                           force=True),
        "ListSubscriptions": pb.ListSubscriptionsRequest(topic=topic),
        "ResetCursor": pb.ResetCursorRequest(topic=topic, subscription="billing"),
        "Skip": pb.SkipRequest(topic=topic, subscription="billing", count=1),
        "ClearBacklog": pb.ClearBacklogRequest(topic=topic, subscription="billing"),
        "PeekMessages": pb.PeekMessagesRequest(topic=topic, subscription="billing", count=1),
        "Compact": pb.TopicRequest(topic=topic),
        "GetCompactionStatus": pb.TopicRequest(topic=topic),
        "GrantPermission": pb.PermissionRequest(topic=ns, role="mallory",
                                                actions=["produce", "consume"]),
        "RevokePermission": pb.PermissionRequest(topic=ns, role="someone"),
        "GetPermissions": pb.TopicRequest(topic=ns),
        "CreateTenant": pb.TenantRequest(tenant="mallory-corp"),
        "DeleteTenant": pb.TenantRequest(tenant=tenant),
        "ListTenants": pb.ListTenantsRequest(),
        "CreateNamespace": pb.NamespaceRequest(namespace=f"{tenant}/evil"),
        "DeleteNamespace": pb.NamespaceRequest(namespace=ns),
        "ListNamespaces": pb.ListNamespacesRequest(tenant=tenant),
    }


def _state(admin: Client, team: dict) -> dict:
    a, topic = admin.admin, team["topic"]
    return {"topics": sorted(t.topic for t in a.list_topics(team["ns"])),
            "policies": a.get_policies(topic).as_dict(),
            "ns_policies": a.get_namespace_policies(team["ns"]).as_dict(),
            "subscriptions": a.list_subscriptions(topic),
            "cursor": a.internal_stats(topic)["cursors"]["billing"]["markDeletePosition"],
            "backlog": a.stats(topic)["subscriptions"]["billing"]["msgBacklog"],
            "last": str(a.last_message_id(topic)),
            "grants": a.get_permissions(team["ns"]),
            "tenants": a.list_tenants(), "namespaces": a.list_namespaces(team["tenant"]),
            "shadows": a.get_shadow_topics(topic)}


def test_a_role_without_a_grant_is_refused_every_admin_call_and_nothing_changes(
        admin, keys, cluster, team):
    """A7: every Admin RPC of the contract, made by a valid role with no grant."""
    admin.admin.grant_permission(team["ns"], "someone", ["consume"])
    before = _state(admin, team)
    requests = _requests(team)
    methods = [m.name for m in admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods]
    assert sorted(requests) == sorted(m for m in methods if m != "WatchCompaction")
    md = (bearer(token(keys, "mallory")),)
    with grpc.insecure_channel(cluster[0].url) as ch:
        stub = admin_pb2_grpc.AdminStub(ch)
        for name, request in requests.items():
            with pytest.raises(grpc.RpcError) as info:
                getattr(stub, name)(request, metadata=md, timeout=10)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, (name, info.value)
            assert "mallory" in info.value.details()
        with pytest.raises(grpc.RpcError) as info:
            next(iter(stub.WatchCompaction(admin_pb2.TopicRequest(topic=team["topic"]),
                                           metadata=md, timeout=10)))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert _state(admin, team) == before


def test_produce_and_consume_need_their_grant_at_namespace_or_topic_level(
        admin, keys, cluster, team):
    """A9."""
    topic = team["topic"]
    with Client(cluster[0].url, timeout=20, operation_timeout=5,
                auth_token=token(keys, "app")) as app:
        with pytest.raises(errors.PermissionDenied, match="produce"):
            with app.create_producer(topic) as p:
                p.send(b"x")
        with pytest.raises(errors.PermissionDenied, match="consume"):
            app.subscribe(topic, "billing", initial_position="earliest")
        admin.admin.grant_permission(team["ns"], "app", ["produce"])      # namespace level

        def produce():
            with app.create_producer(topic) as p:
                return p.send(b"three")
        eventually(produce)
        with pytest.raises(errors.PermissionDenied, match="consume"):
            app.subscribe(topic, "billing", initial_position="earliest")
        admin.admin.grant_permission(topic, "app", ["consume"])            # topic level
        assert admin.admin.get_permissions(topic) == {"app": ["consume"]}
        consumer = eventually(lambda: app.subscribe(topic, "billing",
                                                    initial_position="earliest"))
        assert consumer.receive(timeout=10).payload == b"one"
        consumer.close()


def test_a_revoke_ends_an_open_consumer(admin, keys, cluster, team):
    """A10."""
    topic = team["topic"]
    admin.admin.grant_permission(topic, "reader", ["consume"])
    with Client(cluster[0].url, timeout=20, auth_token=token(keys, "reader")) as c:
        consumer = eventually(lambda: c.subscribe(topic, "billing",
                                                  initial_position="earliest"))
        assert consumer.receive(timeout=10).payload == b"one"
        admin.admin.revoke_permission(topic, "reader")
        deadline = time.monotonic() + 20
        with pytest.raises(errors.PermissionDenied, match="revoked"):
            while time.monotonic() < deadline:
                try:
                    consumer.receive(timeout=0.5)
                except errors.Timeout:
                    pass
        assert time.monotonic() < deadline


def test_a_shadows_permissions_are_its_own(admin, keys, cluster, team):
    """A11: consume on the source grants nothing on the shadow, nor the reverse; creating a
    shadow needs `shadow` on the source and admin of the shadow's tenant."""
    topic, tenant = team["topic"], team["tenant"]
    other = f"s-{uuid.uuid4().hex[:8]}"
    admin.admin.create_tenant(other, ["shadow-team"])
    admin.admin.create_namespace(f"{other}/mirror")
    shadow = f"persistent://{other}/mirror/orders"
    with Client(cluster[0].url, timeout=20, operation_timeout=5,
                auth_token=token(keys, "shadow-team")) as st:
        with pytest.raises(errors.PermissionDenied, match=f"shadow {topic}"):
            st.admin.create_shadow_topic(shadow, topic)
        admin.admin.grant_permission(topic, "shadow-team", ["shadow"])
        eventually(lambda: st.admin.create_shadow_topic(shadow, topic))
    assert admin.admin.get_shadow_topics(topic) == [shadow]
    admin.admin.grant_permission(topic, "src-reader", ["consume"])
    admin.admin.grant_permission(shadow, "shadow-reader", ["consume"])
    with Client(cluster[0].url, timeout=20, operation_timeout=5,
                auth_token=token(keys, "src-reader")) as c:
        eventually(lambda: c.subscribe(topic, "s", initial_position="earliest").close())
        with pytest.raises(errors.PermissionDenied):
            c.subscribe(shadow, "s", initial_position="earliest")
    with Client(cluster[0].url, timeout=20, operation_timeout=5,
                auth_token=token(keys, "shadow-reader")) as c:
        consumer = eventually(lambda: c.subscribe(shadow, "s", initial_position="earliest"))
        assert consumer.receive(timeout=15).payload == b"one"
        consumer.close()
        with pytest.raises(errors.PermissionDenied):
            c.subscribe(topic, "s2", initial_position="earliest")
    assert tenant != other


def test_replication_and_storage_reads_need_replicate(admin, keys, cluster, team):
    """A12: a role with produce and consume may neither replicate to a shadow nor read a
    ledger through Storage; `replicate` lets it read."""
    source, shadow_broker = cluster
    topic = team["topic"]
    admin.admin.grant_permission(team["ns"], "app2", ["produce", "consume"])
    md = (bearer(token(keys, "app2")),)
    ledger = int(admin.admin.internal_stats(topic)["ledgers"][0]["ledgerId"])
    read = storage_pb2.ReadEntriesRequest(topic=topic, ledger_id=ledger, from_entry=0,
                                          max_entries=10)
    with grpc.insecure_channel(source.url) as ch:
        with pytest.raises(grpc.RpcError) as info:
            list(storage_pb2_grpc.StorageStub(ch).ReadEntries(read, metadata=md, timeout=10))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with grpc.insecure_channel(shadow_broker.url) as ch:
        batch = replication_pb2.ReplicateBatch(shadow=topic + "-sh", source=topic, batch_id=1)
        acks = list(replication_pb2_grpc.ReplicationStub(ch).Replicate(
            iter([batch]), metadata=md, timeout=10))
        assert acks and acks[0].error.reason == "PermissionDenied", acks
    admin.admin.grant_permission(topic, "app2", ["replicate"])

    def reads():
        # Raw gRPC: a denial until the grant arrives is an RpcError, not the client's
        # PermissionDenied, so it is turned into the retried kind here.
        with grpc.insecure_channel(source.url) as ch:
            try:
                got = list(storage_pb2_grpc.StorageStub(ch).ReadEntries(read, metadata=md,
                                                                        timeout=10))
            except grpc.RpcError as e:
                assert e.code() != grpc.StatusCode.PERMISSION_DENIED, e.details()
                raise
        assert got
    eventually(reads, timeout=15)


def test_a_forwarded_call_is_authorized_as_its_original_caller(admin, keys, cluster, team):
    """A13: the shadow broker forwards the stats of a source topic to the source's owner
    with the caller's role; the owner authorizes that role, never the forwarding broker's,
    and only a proxy role may name another."""
    source, shadow_broker = cluster
    topic = team["topic"]
    admin.admin.grant_permission(topic, "viewer", ["consume"])
    with Client(shadow_broker.url, timeout=20, auth_token=token(keys, "viewer")) as v:
        stats = eventually(lambda: v.admin.stats(topic))
        assert stats["subscriptions"]["billing"]["msgBacklog"] >= 0
        assert stats["ownerBroker"] == source.url  # answered by the owner
    request = admin_pb2.TopicRequest(topic=topic)
    with grpc.insecure_channel(source.url) as ch:
        stub = admin_pb2_grpc.AdminStub(ch)
        # the brokers' role is a superuser, but a call it forwards for "nobody" is nobody's
        with pytest.raises(grpc.RpcError) as info:
            stub.GetTopicStats(request, timeout=10, metadata=(
                bearer(token(keys, "broker")), (ORIGINAL_ROLE, "nobody")))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "nobody" in info.value.details()
        # a role that is no proxy may not speak for another, even a superuser
        with pytest.raises(grpc.RpcError) as info:
            stub.GetTopicStats(request, timeout=10, metadata=(
                bearer(token(keys, "viewer")), (ORIGINAL_ROLE, "admin")))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "not a proxy role" in info.value.details()
        ok = stub.GetTopicStats(request, timeout=10, metadata=(
            bearer(token(keys, "broker")), (ORIGINAL_ROLE, "viewer")))
        assert ok.topic == topic


def test_the_cli_manages_tenants_namespaces_and_grants(admin, keys, cluster):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHADOWTOPIC_")}
    base = [EXE, "--url", cluster[0].url, "-o", "json", "--operation-timeout", "5"]

    def run(role: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*base, "--auth-token", token(keys, role), *args],
                              capture_output=True, text=True, timeout=60, env=env)
    tenant = f"c-{uuid.uuid4().hex[:8]}"
    out = run("admin", "tenants", "create", tenant, "--admin-roles", "ops,ci")
    assert out.returncode == 0, out.stderr
    assert json.loads(run("admin", "tenants", "list").stdout)[0]["tenant"]
    assert run("ops", "namespaces", "create", f"{tenant}/ns").returncode == 0
    assert json.loads(run("ops", "namespaces", "list", tenant).stdout) == [f"{tenant}/ns"]
    granted = run("ops", "namespaces", "grant-permission", f"{tenant}/ns", "--role", "app",
                  "--actions", "consume,produce")
    assert granted.returncode == 0, granted.stderr
    perms = json.loads(run("ops", "namespaces", "permissions", f"{tenant}/ns").stdout)
    assert perms == {"app": ["consume", "produce"]}
    topic = f"persistent://{tenant}/ns/t"
    assert run("ops", "topics", "create", topic).returncode == 0
    assert run("ops", "topics", "grant-permission", topic, "--role", "x", "--actions",
               "shadow").returncode == 0
    assert json.loads(run("ops", "topics", "permissions", topic).stdout) == {"x": ["shadow"]}
    refused = run("app", "namespaces", "revoke-permission", f"{tenant}/ns", "--role", "app")
    lines = refused.stderr.splitlines()
    assert refused.returncode == 1 and len(lines) == 1, refused.stderr
    assert lines[0].startswith("error: PermissionDenied: ") and "'app'" in lines[0]
    bad = run("ops", "topics", "grant-permission", topic, "--role", "x", "--actions", "fly")
    assert bad.returncode == 1 and "unknown action 'fly'" in bad.stderr
