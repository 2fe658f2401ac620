"""The broker's authorization decisions (source/broker/authorize.py) and its rule table
(source/broker/access_rules.py): superusers, tenant admins (never `replicate`), grants;
nothing allowed before the grants are loaded; a stream that loses a permission ends; every
RPC of the contract has a rule whose fields are fields of its request."""
from __future__ import annotations

import asyncio

import pytest

from shadowtopic.broker import access_rules
from shadowtopic.broker.authorize import CALL, Authorizer, Call
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.core.permissions import Action
from shadowtopic.metadata import MemoryStore
from shadowtopic.metadata.grants import GrantTable
from shadowtopic.pb.v1 import (
    admin_pb2,
    consumer_pb2,
    producer_pb2,
    replication_pb2,
    storage_pb2,
    tables_pb2,
)
from shadowtopic.security.authentication import Principal

pytestmark = pytest.mark.timeout(60)
T = TopicName("acme", "ns", "orders")


def authz(**grants) -> Authorizer:
    a = Authorizer(MemoryStore(), frozenset({"root"}), enabled=True)
    a.table = GrantTable(True, {"acme": frozenset({"ops"})}, {"acme/ns": grants})
    return a


def as_role(role: str, task=None) -> Call:
    call = Call(Principal(role, "token"), task)
    CALL.set(call)
    return call


def test_superusers_tenant_admins_and_grants():
    a = authz(app=frozenset({Action.CONSUME}))
    root, ops, app = (Principal(r, "token") for r in ("root", "ops", "app"))
    assert all(a.allows(root, act, T) for act in Action)
    assert a.allows(ops, Action.PRODUCE, T) and not a.allows(ops, Action.REPLICATE, T)
    assert not a.allows(ops, Action.PRODUCE, TopicName("other", "ns", "t"))
    assert a.allows(app, Action.CONSUME, T.partition(2))
    assert not a.allows(app, Action.PRODUCE, T)
    as_role("app")
    with pytest.raises(errors.PermissionDenied, match="'app' may not produce on"):
        a.require(Action.PRODUCE, T)
    with pytest.raises(errors.PermissionDenied, match="admin role of tenant acme"):
        a.require_admin("acme", "create a topic")
    a.require_lookup(T)  # consume is enough to look a topic up


def test_nothing_is_allowed_before_the_grants_are_loaded():
    a = Authorizer(MemoryStore(), frozenset(), enabled=True)
    as_role("app")
    with pytest.raises(errors.ServiceUnavailable, match="not loaded"):
        a.require(Action.CONSUME, T)


def test_authorization_off_allows_everything():
    a = Authorizer(MemoryStore(), frozenset(), enabled=False)
    as_role("anyone")
    a.require(Action.REPLICATE, T)
    a.require_superuser("anything")


def test_a_stream_that_loses_its_permission_is_ended():
    async def go():
        a = authz(app=frozenset({Action.CONSUME}))
        task = asyncio.get_running_loop().create_task(asyncio.sleep(30))
        call = as_role("app", task)
        a.opened(call)
        a.require(Action.CONSUME, T)
        assert (Action.CONSUME, T) in call.holds
        a._changed(GrantTable(True, {}, {"acme/ns": {"app": frozenset({Action.CONSUME})}}))
        assert call.ended is None
        a._changed(GrantTable(True, {}, {}))
        assert isinstance(call.ended, errors.PermissionDenied) and "revoked" in str(call.ended)
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(go())


SERVICES = {"Admin": admin_pb2, "Producer": producer_pb2, "Consumer": consumer_pb2,
            "Replication": replication_pb2, "Storage": storage_pb2, "Tables": tables_pb2}


def test_every_rpc_of_the_contract_has_a_rule_naming_fields_of_its_request():
    seen = set()
    for service, module in SERVICES.items():
        for m in module.DESCRIPTOR.services_by_name[service].methods:
            path = f"/shadowtopic.v1.{service}/{m.name}"
            rule = access_rules.RULES.get(path)
            assert rule is not None, f"{path} has no rule"
            fields = m.input_type.fields_by_name
            for name in (rule.field, rule.source):
                if name and rule.kind != "in_stream":
                    assert name in fields, f"{path}: no field {name}"
            seen.add(path)
    assert seen == set(access_rules.RULES)


def test_a_method_without_a_rule_needs_a_superuser():
    a = authz()
    as_role("ops")
    with pytest.raises(errors.PermissionDenied, match="no rule"):
        asyncio.run(access_rules.check(a, "/shadowtopic.v1.Admin/Unknown", None))
