"""Grants: the actions (source/core/permissions.py) each role holds on a namespace or a
topic, in etcd, and the table every broker follows (docs/SECURITY.md, "Authorization").

    /shadowtopic/permissions/namespaces/<tenant>/<namespace>   Grants
    /shadowtopic/permissions/topics/<topic-path>               Grants

A grant names a target: a namespace ("tenant/namespace") or a topic (a partition's grants
are its partitioned topic's: `target_of` names the parent). `grant` sets a role's actions
to exactly those given, `revoke` removes the role; both are compare-and-swap loops, and a
target left with no role has no key.

`GrantsFollower(store, on_change)` follows the tenants (their admin roles) and every grant
(list, then watch: source/metadata/follow.py) and hands a fresh `GrantTable` to
`on_change` after every change; until both prefixes were listed once the table is not
`loaded` (a broker then refuses what it would have to authorize: it never guesses).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeAlias

from google.protobuf.message import DecodeError

from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.core.permissions import Action, check_role, sorted_names
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import Compare, Delete, MetadataStore, Snapshot, WatchEvent
from shadowtopic.metadata.follow import PrefixFollower
from shadowtopic.metadata.tenants import decode_tenant
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

log = logging.getLogger(__name__)

ATTEMPTS = 100
#: a namespace ("tenant/namespace") or a topic
Target: TypeAlias = "str | TopicName"


def target_of(topic: TopicName) -> TopicName:
    """The topic whose grants apply to `topic` (a partition's: its partitioned topic)."""
    return topic.partitioned_parent or topic


def key_of(target: Target) -> str:
    return keys.namespace_grants(target) if isinstance(target, str) else \
        keys.topic_grants(target_of(target))


def decode(value: bytes) -> dict[str, frozenset[Action]]:
    """The role -> actions of a Grants value (unknown action names are skipped, a value
    that does not decode holds none: a bad key grants nothing)."""
    try:
        record = mpb.Grants.FromString(value)
    except DecodeError:
        log.warning("a grants value that does not decode grants nothing")
        return {}
    out = {}
    for role, actions in record.roles.items():
        known = frozenset(Action(a) for a in actions.actions if a in Action._value2member_map_)
        if known:
            out[role] = known
    return out


def _encode(roles: dict[str, frozenset[Action]]) -> bytes:
    record = mpb.Grants()
    for role, actions in sorted(roles.items()):
        record.roles[role].actions.extend(sorted_names(actions))
    return record.SerializeToString(deterministic=True)


async def read(store: MetadataStore, target: Target) -> dict[str, frozenset[Action]]:
    kv = await store.get(key_of(target))
    return {} if kv is None else decode(kv.value)


async def _change(store: MetadataStore, target: Target,
                  change: Callable[[dict[str, frozenset[Action]]], None]) -> None:
    key = key_of(target)
    for _ in range(ATTEMPTS):
        kv = await store.get(key)
        roles = {} if kv is None else decode(kv.value)
        change(roles)
        revision = 0 if kv is None else kv.mod_revision
        if roles:
            ok = await store.cas(key, _encode(roles), revision)
        elif kv is None:
            return
        else:
            ok = (await store.txn([Compare(key, "mod_revision", "==", revision)],
                                  [Delete(key)])).succeeded
        if ok:
            return
    raise errors.ServiceUnavailable(f"the grants of {target} kept changing; try again")


async def grant(store: MetadataStore, target: Target, role: str,
                actions: Iterable[Action]) -> None:
    """Set `role`'s actions on `target` to `actions`."""
    check_role(role)
    given = frozenset(actions)

    def change(roles: dict[str, frozenset[Action]]) -> None:
        roles[role] = given
    await _change(store, target, change)


async def revoke(store: MetadataStore, target: Target, role: str) -> None:
    """Remove every action of `role` on `target` (nothing granted: nothing to do)."""
    check_role(role)

    def change(roles: dict[str, frozenset[Action]]) -> None:
        roles.pop(role, None)
    await _change(store, target, change)


@dataclass(frozen=True)
class GrantTable:
    """What a broker knows of tenants and grants at one moment (immutable: a change makes a
    new table)."""

    loaded: bool = False
    tenant_admins: dict[str, frozenset[str]] = field(default_factory=dict)
    namespaces: dict[str, dict[str, frozenset[Action]]] = field(default_factory=dict)
    topics: dict[TopicName, dict[str, frozenset[Action]]] = field(default_factory=dict)

    def admins_of(self, tenant: str) -> frozenset[str]:
        return self.tenant_admins.get(tenant, frozenset())

    def actions(self, role: str, topic: TopicName) -> frozenset[Action]:
        """What `role` may do on `topic` by grants of its namespace and of the topic."""
        own = self.topics.get(target_of(topic), {}).get(role, frozenset())
        return own | self.namespaces.get(topic.namespace_name, {}).get(role, frozenset())

    def roles_of(self, target: Target) -> dict[str, frozenset[Action]]:
        if isinstance(target, str):
            return dict(self.namespaces.get(target, {}))
        return dict(self.topics.get(target_of(target), {}))


class GrantsFollower:
    """Follows tenants and grants for one broker (module doc)."""

    def __init__(self, store: MetadataStore, on_change: Callable[[GrantTable], None],
                 retry_delay: float = 0.5):
        self._on_change = on_change
        self._tenants: dict[str, bytes] | None = None
        self._grants: dict[str, bytes] | None = None
        self.tenants = PrefixFollower(store, keys.TENANTS_PREFIX, self._tenant_snapshot,
                                      self._tenant_events, retry_delay)
        self.grants = PrefixFollower(store, keys.PERMISSIONS_PREFIX, self._grant_snapshot,
                                     self._grant_events, retry_delay)

    async def start_retrying(self) -> None:
        """Follow both prefixes, trying again until etcd answers (run it as a task)."""
        await self.tenants.start_retrying()
        await self.grants.start_retrying()

    async def close(self) -> None:
        await self.grants.close()
        await self.tenants.close()

    async def _tenant_snapshot(self, snap: Snapshot) -> None:
        self._tenants = {kv.key: kv.value for kv in snap.items}
        self._publish()

    async def _tenant_events(self, events: list[WatchEvent]) -> None:
        self._tenants = _applied(self._tenants or {}, events)
        self._publish()

    async def _grant_snapshot(self, snap: Snapshot) -> None:
        self._grants = {kv.key: kv.value for kv in snap.items}
        self._publish()

    async def _grant_events(self, events: list[WatchEvent]) -> None:
        self._grants = _applied(self._grants or {}, events)
        self._publish()

    def _publish(self) -> None:
        if self._tenants is None or self._grants is None:
            return
        admins = {}
        for key, value in self._tenants.items():
            name = key[len(keys.TENANTS_PREFIX):]
            if name and "/" not in name:
                admins[name] = decode_tenant(value)
        namespaces: dict[str, dict[str, frozenset[Action]]] = {}
        topics: dict[TopicName, dict[str, frozenset[Action]]] = {}
        for key, value in self._grants.items():
            target = keys.grants_target(key)
            if isinstance(target, str):
                namespaces[target] = decode(value)
            elif target is not None:
                topics[target] = decode(value)
        self._on_change(GrantTable(True, admins, namespaces, topics))


def _applied(values: dict[str, bytes], events: list[WatchEvent]) -> dict[str, bytes]:
    out = dict(values)
    for e in events:
        if e.type == "put":
            out[e.key] = e.value
        else:
            out.pop(e.key, None)
    return out
