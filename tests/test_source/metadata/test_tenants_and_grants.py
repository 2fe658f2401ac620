"""Tenants, namespaces and grants in the store (source/metadata/tenants.py,
source/metadata/grants.py) over MemoryStore: creation and deletion rules, a grant setting a
role's actions, a revoke, a partition's grants being its parent's, and the follower's table
after lists and watch events."""
from __future__ import annotations

import asyncio

import pytest

from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.core.permissions import Action, parse_actions, parse_target
from shadowtopic.metadata import MemoryStore, grants, keys, tenants
from shadowtopic.metadata.grants import GrantsFollower, GrantTable

pytestmark = pytest.mark.timeout(60)
T = TopicName("acme", "ns", "orders")


def run(coro):
    return asyncio.run(coro)


def test_tenants_and_namespaces_are_created_listed_and_deleted_in_order():
    async def go():
        s = MemoryStore()
        await tenants.create_tenant(s, "acme", ["ops", "ops", "ci"])
        assert await tenants.list_tenants(s) == {"acme": ["ci", "ops"]}
        with pytest.raises(errors.TenantAlreadyExists):
            await tenants.create_tenant(s, "acme", [])
        with pytest.raises(errors.TenantNotFound):
            await tenants.create_namespace(s, "other/ns")
        await tenants.create_namespace(s, "acme/ns")
        with pytest.raises(errors.NamespaceAlreadyExists):
            await tenants.create_namespace(s, "acme/ns")
        assert await tenants.list_namespaces(s, "acme") == ["acme/ns"]
        with pytest.raises(errors.NotEmpty):
            await tenants.delete_tenant(s, "acme")
        await s.put(keys.topic_info(T), b"x")
        await grants.grant(s, "acme/ns", "app", [Action.CONSUME])
        await grants.grant(s, T, "app", [Action.PRODUCE])
        with pytest.raises(errors.NotEmpty):
            await tenants.delete_namespace(s, "acme/ns")
        await s.delete(keys.topic_info(T))
        await tenants.delete_namespace(s, "acme/ns")  # its grants go with it
        assert await grants.read(s, "acme/ns") == {}
        assert await grants.read(s, T) == {}
        await tenants.delete_tenant(s, "acme")
        assert await tenants.list_tenants(s) == {}
    run(go())


def test_a_topics_namespace_is_created_with_it_or_must_exist():
    async def go():
        s = MemoryStore()
        with pytest.raises(errors.NamespaceNotFound, match="namespaces create acme/ns"):
            await tenants.prepare_namespace(s, "acme/ns", auto_create=False)
        await tenants.prepare_namespace(s, "acme/ns", auto_create=True)
        assert await tenants.list_namespaces(s, "acme") == ["acme/ns"]
        await tenants.prepare_namespace(s, "acme/ns", auto_create=False)
        await tenants.create_defaults(s)
        assert await tenants.list_namespaces(s, "public") == ["public/default"]
        await tenants.delete_namespace(s, "public/default")
        await tenants.create_defaults(s)  # once per cluster: a deletion sticks
        assert await tenants.list_namespaces(s, "public") == []
    run(go())


def test_a_grant_sets_the_roles_actions_and_a_revoke_removes_the_role():
    async def go():
        s = MemoryStore()
        await grants.grant(s, T, "app", [Action.PRODUCE, Action.CONSUME])
        await grants.grant(s, T, "app", [Action.CONSUME])  # replaces, as Pulsar's
        await grants.grant(s, T.partition(3), "other", [Action.SHADOW])  # the parent's
        assert await grants.read(s, T) == {"app": {Action.CONSUME}, "other": {Action.SHADOW}}
        await grants.revoke(s, T, "app")
        await grants.revoke(s, T, "nobody")  # nothing granted: nothing to do
        await grants.revoke(s, T, "other")
        assert await s.get(keys.topic_grants(T)) is None  # no role left: no key
        with pytest.raises(errors.InvalidArgument):
            await grants.grant(s, T, "", [Action.CONSUME])
    run(go())


def test_actions_and_targets_are_parsed_with_clear_errors():
    assert parse_actions(["Produce", " consume"]) == {Action.PRODUCE, Action.CONSUME}
    with pytest.raises(errors.InvalidArgument, match="unknown action 'fly'"):
        parse_actions(["fly"])
    with pytest.raises(errors.InvalidArgument, match="no action"):
        parse_actions([])
    assert parse_target("acme/ns") == "acme/ns"
    assert parse_target("acme/ns/orders") == T
    assert parse_target("persistent://acme/ns/orders") == T
    with pytest.raises(errors.InvalidTopicName):
        parse_target("a/b/c/d")


def test_the_follower_builds_the_table_from_lists_and_events():
    async def go():
        s = MemoryStore()
        tables: list[GrantTable] = []
        await tenants.create_tenant(s, "acme", ["ops"])
        await tenants.create_namespace(s, "acme/ns")
        await grants.grant(s, "acme/ns", "app", [Action.CONSUME])
        follower = GrantsFollower(s, tables.append, retry_delay=0.05)
        await follower.start_retrying()
        assert tables and tables[-1].loaded
        table = tables[-1]
        assert table.admins_of("acme") == {"ops"}
        assert table.actions("app", T) == {Action.CONSUME}
        assert table.actions("app", T.partition(0)) == {Action.CONSUME}
        await grants.grant(s, T, "app", [Action.PRODUCE])
        await grants.revoke(s, "acme/ns", "app")
        for _ in range(100):
            if tables[-1].actions("app", T) == {Action.PRODUCE}:
                break
            await asyncio.sleep(0.02)
        assert tables[-1].actions("app", T) == {Action.PRODUCE}
        assert tables[-1].actions("app", TopicName("acme", "ns", "other")) == frozenset()
        await follower.close()
    run(go())
