"""Tenants and namespaces in etcd, as Pulsar's `tenants` and `namespaces` (docs/SECURITY.md,
"Tenants and namespaces").

    /shadowtopic/tenants/<tenant>                      TenantInfo (its admin roles)
    /shadowtopic/namespaces/<tenant>/<namespace>/info  NamespaceInfo (it exists)

- A namespace belongs to a tenant that exists; a tenant is deleted only once it has no
  namespace, a namespace only once it has no topic (`NotEmpty`). Deleting a namespace
  deletes its policies and its grants; deleting a tenant, what is left under its name.
- A topic's namespace must exist before the topic is created. A broker without
  authorization creates it (and its tenant) on the topic's first creation
  (`ensure_namespace`): an open cluster works as before, and lists what it holds.
- `public` and `public/default` exist from the start: `create_defaults` makes them once per
  cluster (the marker `keys.migration("default-namespace")`), so deleting them sticks.
"""
from __future__ import annotations

import time

from google.protobuf.message import DecodeError

from shadowtopic.core import errors
from shadowtopic.core.names import DEFAULT_NAMESPACE, DEFAULT_TENANT
from shadowtopic.core.permissions import check_role
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import Compare, Delete, MetadataStore, Put
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

DEFAULTS_MARKER = keys.migration("default-namespace")


def decode_tenant(value: bytes) -> frozenset[str]:
    """A TenantInfo's admin roles (a value that does not decode: none)."""
    try:
        return frozenset(mpb.TenantInfo.FromString(value).admin_roles)
    except DecodeError:
        return frozenset()


def _tenant_record(admin_roles: list[str]) -> bytes:
    roles = sorted({check_role(r) for r in admin_roles})
    return mpb.TenantInfo(admin_roles=roles).SerializeToString()


def _namespace_record() -> bytes:
    return mpb.NamespaceInfo(created_ms=int(time.time() * 1000)).SerializeToString()


async def create_tenant(store: MetadataStore, tenant: str, admin_roles: list[str]) -> None:
    if not await store.create(keys.tenant(tenant), _tenant_record(admin_roles)):
        raise errors.TenantAlreadyExists(f"tenant {tenant} already exists")


async def list_tenants(store: MetadataStore) -> dict[str, list[str]]:
    """Every tenant with its admin roles, by name."""
    snap = await store.get_prefix(keys.TENANTS_PREFIX)
    out = {}
    for kv in snap.items:
        name = kv.key[len(keys.TENANTS_PREFIX):]
        if name and "/" not in name:
            out[name] = sorted(decode_tenant(kv.value))
    return dict(sorted(out.items()))


async def list_namespaces(store: MetadataStore, tenant: str) -> list[str]:
    """The namespaces of `tenant` ("tenant/namespace"), sorted (`TenantNotFound`)."""
    if await store.get(keys.tenant(tenant)) is None:
        raise errors.TenantNotFound(f"tenant {tenant} does not exist")
    snap = await store.get_prefix(f"{keys.NAMESPACES_PREFIX}{tenant}/")
    found = (keys.namespace_from_info_key(kv.key) for kv in snap.items)
    return sorted(ns for ns in found if ns is not None)


async def delete_tenant(store: MetadataStore, tenant: str) -> None:
    kv = await store.get(keys.tenant(tenant))
    if kv is None:
        raise errors.TenantNotFound(f"tenant {tenant} does not exist")
    left = await list_namespaces(store, tenant)
    if left:
        raise errors.NotEmpty(f"tenant {tenant} still has namespaces ({', '.join(left[:5])}"
                              f"{', ...' if len(left) > 5 else ''}): delete them first")
    ns_grants, topic_grants = keys.grants_of_tenant_prefixes(tenant)
    res = await store.txn([Compare(kv.key, "mod_revision", "==", kv.mod_revision)],
                          [Delete(kv.key), Delete(f"{keys.NAMESPACES_PREFIX}{tenant}/", True),
                           Delete(ns_grants, True), Delete(topic_grants, True)])
    if not res.succeeded:
        raise errors.ServiceUnavailable(f"tenant {tenant} changed meanwhile; try again")


async def namespace_exists(store: MetadataStore, namespace: str) -> bool:
    return await store.get(keys.namespace_info(namespace)) is not None


async def create_namespace(store: MetadataStore, namespace: str) -> None:
    tenant = namespace.split("/", 1)[0]
    key = keys.namespace_info(namespace)
    res = await store.txn([Compare(keys.tenant(tenant), "version", ">", 0),
                           Compare(key, "version", "==", 0)], [Put(key, _namespace_record())])
    if res.succeeded:
        return
    if await store.get(keys.tenant(tenant)) is None:
        raise errors.TenantNotFound(f"tenant {tenant} does not exist: create it first "
                                    f"(shadowtopic tenants create {tenant})")
    raise errors.NamespaceAlreadyExists(f"namespace {namespace} already exists")


async def require_namespace(store: MetadataStore, namespace: str) -> None:
    """`NamespaceNotFound` unless `namespace` exists."""
    if not await namespace_exists(store, namespace):
        raise errors.NamespaceNotFound(
            f"namespace {namespace} does not exist: create it first "
            f"(shadowtopic namespaces create {namespace})")


async def ensure_namespace(store: MetadataStore, namespace: str) -> None:
    """Create `namespace` and its tenant unless they exist (a broker without authorization,
    on a topic's creation)."""
    if await namespace_exists(store, namespace):
        return
    tenant = namespace.split("/", 1)[0]
    await store.create(keys.tenant(tenant), _tenant_record([]))
    await store.create(keys.namespace_info(namespace), _namespace_record())


async def delete_namespace(store: MetadataStore, namespace: str) -> None:
    kv = await store.get(keys.namespace_info(namespace))
    if kv is None:
        raise errors.NamespaceNotFound(f"namespace {namespace} does not exist")
    if await store.get_keys(keys.topics_prefix(namespace), limit=1):
        raise errors.NotEmpty(f"namespace {namespace} still has topics: delete them first")
    res = await store.txn([Compare(kv.key, "mod_revision", "==", kv.mod_revision)],
                          [Delete(keys.namespace_prefix(namespace), True),
                           Delete(keys.namespace_grants(namespace)),
                           Delete(keys.grants_of_namespace_prefix(namespace), True)])
    if not res.succeeded:
        raise errors.ServiceUnavailable(f"namespace {namespace} changed meanwhile; try again")


async def create_defaults(store: MetadataStore) -> None:
    """`public` and `public/default`, once per cluster (module doc)."""
    if await store.get(DEFAULTS_MARKER) is not None:
        return
    await ensure_namespace(store, f"{DEFAULT_TENANT}/{DEFAULT_NAMESPACE}")
    await store.create(DEFAULTS_MARKER, b"done")


async def prepare_namespace(store: MetadataStore, namespace: str, auto_create: bool) -> None:
    """Before a topic is created in `namespace`: create it when `auto_create` (a broker
    without authorization), else refuse unless it exists (`NamespaceNotFound`)."""
    if auto_create:
        await ensure_namespace(store, namespace)
    else:
        await require_namespace(store, namespace)
