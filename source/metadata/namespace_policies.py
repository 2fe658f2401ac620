"""Namespace policies: the defaults of every topic of a namespace, in etcd, as in Pulsar's
`namespaces set-message-ttl` and the like.

Stored under `keys.namespace_policies("tenant/namespace")` as a `storage.v1.Policies`
(source/metadata/policies_record.py) holding only the fields set on the namespace (like
`TopicInfo.policies` for a topic); no key: none set. A topic's effective policies are, field
by field, its own value, else its namespace's, else the default (`Policies.effective`; a
partition's own are its parent's).
A namespace needs no creating: its policies can be set before any of its topics exists.

- `read(store, ns)`: the namespace's set policies (a value that does not decode counts as
  none, with a warning: one bad key must not stop every topic of the namespace loading);
- `update(store, ns, set, remove)`: set some fields and unset others in one compare-and-swap
  loop; the key is deleted once no field is left;
- `NamespaceFollower(store, on_change)`: the one watch a broker keeps on every namespace's
  policies (list, then watch the prefix: source/metadata/follow.py); it calls
  `on_change(namespaces)` with the namespaces whose policies changed (None: any may have,
  after the first list), one call at a time. A change is taken as seen only once
  `on_change` returned, so one that failed is offered again by the next list.
  `changes(ns)` counts the changes seen per namespace, for a topic that was opening
  meanwhile (source/broker/topics.py).
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

from google.protobuf.message import DecodeError

from shadowtopic.core.errors import InvalidArgument, ServiceUnavailable
from shadowtopic.core.policies import Policies
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import Compare, Delete, MetadataStore, Snapshot, WatchEvent
from shadowtopic.metadata.follow import PrefixFollower
from shadowtopic.metadata.policies_record import from_record, to_record
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

log = logging.getLogger(__name__)

ATTEMPTS = 100  # compare-and-swap rounds before giving up (each lost round: another writer won)

#: on_change(namespaces): the namespaces whose policies changed (None: any may have)
OnChange = Callable[[set[str] | None], Awaitable[None]]


def decode(key: str, value: bytes) -> Policies:
    try:
        return from_record(mpb.Policies.FromString(value))
    except DecodeError:
        log.warning("%s holds no Policies: the namespace's topics use their own and the "
                    "defaults", key)
        return Policies()


async def read(store: MetadataStore, namespace: str) -> Policies:
    """The policies set on `namespace` (only those fields; none: an empty Policies)."""
    key = keys.namespace_policies(namespace)
    kv = await store.get(key)
    return Policies() if kv is None else decode(key, kv.value)


async def update(store: MetadataStore, namespace: str, changes: Policies,
                 remove: Iterable[str] = ()) -> Policies:
    """Set the fields `changes` sets and unset the fields named in `remove` on `namespace`;
    the namespace's policies after that. `InvalidPolicies` for a value out of range or a
    name that is no policy; `InvalidArgument` for a field both set and removed."""
    remove = set(remove)
    changes.validate()
    Policies().without(remove)  # unknown names
    both = sorted(remove & set(changes.as_dict()))
    if both:
        raise InvalidArgument(f"{', '.join(both)}: both set and removed")
    key = keys.namespace_policies(namespace)
    for _ in range(ATTEMPTS):
        kv = await store.get(key)
        now = Policies() if kv is None else decode(key, kv.value)
        new = now.merged(changes).without(remove)
        revision = 0 if kv is None else kv.mod_revision
        if new.as_dict():
            ok = await store.cas(key, to_record(new).SerializeToString(), revision)
        elif kv is None:
            return new  # nothing was set, nothing is
        else:
            ok = (await store.txn([Compare(key, "mod_revision", "==", revision)],
                                  [Delete(key)])).succeeded
        if ok:
            return new
    raise ServiceUnavailable(f"the policies of {namespace} kept changing; try again")


class NamespaceFollower:
    """Follows every namespace's policies for one broker (see the module doc)."""

    def __init__(self, store: MetadataStore, on_change: OnChange, retry_delay: float = 0.5):
        self._on_change = on_change
        self._values: dict[str, bytes] | None = None  # None: not listed yet
        self._changes: dict[str, int] = {}
        self.follower = PrefixFollower(store, keys.NAMESPACES_PREFIX, self._snapshot,
                                       self._events, retry_delay)

    def changes(self, namespace: str) -> int:
        """How many changes of `namespace`'s policies this follower has heard of."""
        return self._changes.get(namespace, 0)

    async def start_retrying(self) -> None:
        """Start following, trying again until etcd answers (run it as a task)."""
        await self.follower.start_retrying()

    async def close(self) -> None:
        await self.follower.close()

    async def _snapshot(self, snap: Snapshot) -> None:
        values = {}
        for kv in snap.items:
            ns = keys.namespace_from_policies_key(kv.key)
            if ns is not None:
                values[ns] = kv.value
        if self._values is None:
            await self._apply(values, None)
            return
        changed = {ns for ns in values.keys() | self._values.keys()
                   if values.get(ns) != self._values.get(ns)}
        await self._apply(values, changed)

    async def _events(self, events: list[WatchEvent]) -> None:
        values = dict(self._values or {})
        for e in events:
            ns = keys.namespace_from_policies_key(e.key)
            if ns is None:
                continue
            if e.type == "put":
                values[ns] = e.value
            else:
                values.pop(ns, None)
        changed = {ns for ns in values.keys() | (self._values or {}).keys()
                   if values.get(ns) != (self._values or {}).get(ns)}
        await self._apply(values, changed)

    async def _apply(self, values: dict[str, bytes], changed: set[str] | None) -> None:
        if changed is not None and not changed:
            self._values = values
            return
        for ns in (changed if changed is not None else values.keys()):
            self._changes[ns] = self._changes.get(ns, 0) + 1
        await self._on_change(changed)  # raises: not taken; the next list offers it again
        self._values = values
