"""etcd's own auth for shadowtopic: the users and roles, with key-prefix grants, that the
brokers and the compaction worker run as (docs/SECURITY.md, "etcd"), set up through etcd's
Auth API.

    user root         role root: etcd's administrator (sets users and roles up; no
                      shadowtopic process runs as root)
    user broker       role broker: readwrite /shadowtopic/  (every key of the schema,
                      source/metadata/keys.py)
    user compaction   role compaction: read /shadowtopic/, and readwrite
                        /shadowtopic/clusters/<c>/compaction/  the requests it ends and its
                                                               claims, for each cluster <c>
                        /shadowtopic/topics/                   each topic's compaction
                                                               pointer and job records
                        /shadowtopic/migrations/               the marks of the schema
                                                               migrations it runs at start
                                                               (source/metadata/migrate.py)

etcd grants a key or a key range (a prefix), never a pattern such as
`/shadowtopic/topics/*/compaction`: a topic's compaction pointer and job records live under
`/shadowtopic/topics/<topic-path>/`, beside its ledger list and cursors, so the compaction
role may write every key of every topic. What it cannot write: broker registrations,
ownership, the ledger id counter, tenants, namespaces, grants (compaction/commit.py and
compaction/jobs.py write what the list above names, nothing else).

`set_up(endpoints, root_password, users)` makes it so and turns auth on. It is idempotent: it
reads what etcd holds and adds only what is missing (a role, a permission, a user, a user's
role), and sets a user's password only when etcd refuses it; it never takes a permission or
a role away (`etcdctl role revoke-permission` does). A run on a cluster already set up
changes nothing, which matters: a new password ends the user's tokens, and with JWT tokens
(which carry the auth store's revision) any change makes etcd refuse the tokens given before
it, so processes must authenticate again. Before auth is on it works anonymously, after as
root (with `root_password`).
"""
from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from etcd3 import etcdrpc
from etcd3 import utils as etcd_utils
from etcd3.etcdrpc import auth_pb2

from .etcd import EtcdClient, authenticate, make_client, map_error
from .etcd_options import EtcdOptions
from .keys import MIGRATIONS_PREFIX, ROOT

ROOT_USER = "root"
BROKER = "broker"
COMPACTION = "compaction"
#: the roles shadowtopic's processes run as; each is also the name of its user
ROLES = (BROKER, COMPACTION)
_PERMISSIONS = {"read": auth_pb2.Permission.READ, "write": auth_pb2.Permission.WRITE,
                "readwrite": auth_pb2.Permission.READWRITE}


@dataclass(frozen=True)
class Grant:
    """A role's permission on every key under `prefix`."""

    prefix: str
    permission: str  # read | write | readwrite

    def key(self) -> tuple[int, bytes, bytes]:
        """(type, key, range_end) as etcd holds it."""
        start = self.prefix.encode()
        return _PERMISSIONS[self.permission], start, etcd_utils.prefix_range_end(start)


def grants(role: str, clusters: Sequence[str] = ("standalone",)) -> list[Grant]:
    """The permissions of `role` (module doc) for the compaction workers of `clusters`."""
    if role == BROKER:
        return [Grant(f"{ROOT}/", "readwrite")]
    if role == COMPACTION:
        return [Grant(f"{ROOT}/", "read"),
                *[Grant(f"{ROOT}/clusters/{c}/compaction/", "readwrite") for c in clusters],
                Grant(f"{ROOT}/topics/", "readwrite"), Grant(MIGRATIONS_PREFIX, "readwrite")]
    raise ValueError(f"unknown role {role!r}: expected one of {', '.join(ROLES)}")


def generate_password() -> str:
    """A random password (32 URL-safe characters, 192 bits)."""
    return secrets.token_urlsafe(24)


@dataclass(frozen=True)
class EtcdAuth:
    """What an etcd gets set up (`set_up`): root's password, a password for each role's user
    (`ROLES`), and the clusters whose compaction keys the compaction role writes."""

    root_password: str = field(repr=False)
    users: Mapping[str, str] = field(default_factory=dict, repr=False)
    clusters: tuple[str, ...] = ("standalone",)

    @classmethod
    def generated(cls, clusters: Sequence[str] = ("standalone",)) -> EtcdAuth:
        """Random passwords for root and every role's user."""
        return cls(generate_password(), {role: generate_password() for role in ROLES},
                   tuple(clusters))


class _Setup:
    """One run of `set_up` over one client (its token root's once auth is on)."""

    def __init__(self, client: EtcdClient, timeout: float, enabled: bool):
        self.client = client
        self.timeout = timeout
        self.enabled = enabled
        self.changes: list[str] = []

    def rpc(self, method: Callable[..., Any], request: object) -> Any:
        """`method` of etcd's Auth service (the stub's), as root once auth is on."""
        try:
            return method(request, self.timeout, metadata=self.client.metadata)
        except grpc.RpcError as exc:
            raise map_error(exc, ROOT_USER if self.enabled else None) from None

    def _absent(self, method: Callable[..., Any], request: object, missing: str) -> Any:
        """`method`'s answer, or None when etcd says `missing` (not found)."""
        try:
            return self.rpc(method, request)
        except Exception as exc:
            if missing in str(exc):
                return None
            raise

    def role(self, name: str, wanted: list[Grant]) -> None:
        auth = self.client.authstub
        got = self._absent(auth.RoleGet, etcdrpc.AuthRoleGetRequest(role=name),
                           "role name not found")
        if got is None:
            self.rpc(auth.RoleAdd, etcdrpc.AuthRoleAddRequest(name=name))
            self.changes.append(f"role {name} added")
        held = {(p.permType, p.key, p.range_end) for p in (got.perm if got else ())}
        for g in wanted:
            if g.key() in held:
                continue
            kind, key, end = g.key()
            self.rpc(auth.RoleGrantPermission, etcdrpc.AuthRoleGrantPermissionRequest(
                name=name, perm=auth_pb2.Permission(permType=kind, key=key, range_end=end)))
            self.changes.append(f"role {name} granted {g.permission} on {g.prefix}")

    def user(self, name: str, password: str, role: str) -> None:
        auth = self.client.authstub
        got = self._absent(auth.UserGet, etcdrpc.AuthUserGetRequest(name=name),
                           "user name not found")
        if got is None:
            self.rpc(auth.UserAdd, etcdrpc.AuthUserAddRequest(name=name, password=password))
            self.changes.append(f"user {name} added")
        elif not self._password_taken(name, password):
            self.rpc(auth.UserChangePassword,
                     etcdrpc.AuthUserChangePasswordRequest(name=name, password=password))
            self.changes.append(f"user {name}: password set")
        if got is None or role not in got.roles:
            self.rpc(auth.UserGrantRole, etcdrpc.AuthUserGrantRoleRequest(user=name, role=role))
            self.changes.append(f"user {name} granted role {role}")

    def _password_taken(self, name: str, password: str) -> bool:
        """etcd takes `password` for `name` (False while auth is off: it cannot tell)."""
        if not self.enabled:
            return False
        try:
            authenticate(self.client, name, password, self.timeout)
        except Exception as exc:
            if "refused" in str(exc):
                return False
            raise
        return True

    def enable(self) -> None:
        if not self.enabled:
            self.rpc(self.client.authstub.AuthEnable, etcdrpc.AuthEnableRequest())
            self.changes.append("auth enabled")


def set_up(endpoints: str, root_password: str, users: Mapping[str, str],
           clusters: Sequence[str] = ("standalone",), options: EtcdOptions | None = None,
           timeout: float = 5.0) -> list[str]:
    """Users `root` and, for each role named in `users` (`ROLES`), a user of that name with
    its password and role (module doc); then auth on. `options`: TLS to etcd (its user is
    not used: this runs as root). Returns what it changed ([]: all in place already).
    Raises `MetadataUnauthenticated` when etcd's auth is on and refuses root's password,
    `MetadataUnavailable` when etcd does not answer, ValueError for an unknown role."""
    for role in users:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}: expected one of {', '.join(ROLES)}")
    if not root_password:
        raise ValueError("root's password is empty")
    tls = options or EtcdOptions()
    client = make_client(endpoints, timeout, EtcdOptions(ca_file=tls.ca_file,
                                                         cert_file=tls.cert_file,
                                                         key_file=tls.key_file))
    try:
        try:
            token = authenticate(client, ROOT_USER, root_password, timeout)
        except Exception as exc:
            mapped = map_error(exc)
            if mapped is exc:
                raise
            raise mapped from None
        client.use_token(token)
        setup = _Setup(client, timeout, enabled=token is not None)
        setup.user(ROOT_USER, root_password, ROOT_USER)
        for role, password in users.items():
            setup.role(role, grants(role, clusters))
            setup.user(role, password, role)
        setup.enable()
        return setup.changes
    finally:
        client.close()
