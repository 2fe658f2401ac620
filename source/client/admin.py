"""Admin client: topics, shadow topics, policies (a topic's, a namespace's), stats, ledgers,
subscriptions. Returns domain types and plain dicts (stats print with Pulsar's camelCase
names, through protobuf's JSON mapping).

Every call retries temporary errors within the client's operation timeout; the calls that
are not idempotent (creates, deletes, skip, clear_backlog, truncate, roll_ledger, compact)
only errors that guarantee nothing was applied: source/client/retry.py says which and why.

`position_pb` is the one parser of user positions ("earliest", "latest", a MessageId, its
"L:E" text, or publish time in ms since the epoch) for subscriptions, seeks and cursor resets."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message as PbMessage

from shadowtopic.client.connection import Connection, M, R, Unary
from shadowtopic.client.message import Message
from shadowtopic.client.retry import Deadline, not_applied, retriable
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import (
    TopicName,
    canonical,
    check_subscription,
    check_tenant,
    parse_namespace,
)
from shadowtopic.core.permissions import check_role, parse_actions, parse_target
from shadowtopic.core.policies import Policies, validate_partitions, validate_properties
from shadowtopic.pb.v1 import admin_pb2 as apb
from shadowtopic.pb.v1 import common_pb2


@dataclass(frozen=True)
class TopicMetadata:
    topic: str
    kind: str                 # "source" | "shadow"
    partitions: int
    source: str = ""
    properties: dict[str, str] = field(default_factory=dict)
    policies: Policies = field(default_factory=Policies)

    @classmethod
    def from_pb(cls, pb: apb.TopicMetadata) -> TopicMetadata:
        return cls(topic=pb.topic, kind=apb.TopicKind.Name(pb.kind).lower(),
                   partitions=pb.partitions, source=pb.source, properties=dict(pb.properties),
                   policies=Policies.from_pb(pb.policies))

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "kind": self.kind, "partitions": self.partitions,
                "source": self.source, "properties": self.properties,
                "policies": self.policies.as_dict()}


@dataclass(frozen=True)
class CompactionStatus:
    """A compaction job's record (Compact, GetCompactionStatus, WatchCompaction)."""
    job_id: str
    topic: str
    # pending | sealing | scanning_keys | writing | committing | done | failed
    phase: str
    entries_total: int = 0    # input entries planned
    entries_read: int = 0
    entries_written: int = 0
    keys: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    tasks_done: int = 0       # Spark's progress in the running phase
    tasks_total: int = 0
    horizon: MessageId | None = None
    start_ms: int = 0
    end_ms: int = 0
    trigger: str = ""
    previous_job_id: str = ""
    peak_rss_bytes: int = 0
    #: deletes published at or after it (ms since epoch) stay in the compacted ledger (0: none)
    tombstone_cutoff_ms: int = 0
    #: the Spark job's time (ms): the rest of start_ms..end_ms is etcd and planning
    compute_ms: int = 0
    error: errors.ShadowTopicError | None = None

    @property
    def done(self) -> bool:
        return self.phase in ("done", "failed")

    @classmethod
    def from_pb(cls, pb: apb.CompactionJob) -> CompactionStatus:
        err = None
        if pb.phase == apb.FAILED:
            err = errors.from_reason(pb.error.reason or "Internal",
                                     pb.error.message or "compaction failed", pb.error.code)
        return cls(job_id=pb.job_id, topic=pb.topic,
                   phase=apb.CompactionPhase.Name(pb.phase).lower()
                   if pb.phase else "unknown",
                   entries_total=pb.entries_total, entries_read=pb.entries_read,
                   entries_written=pb.entries_written, keys=pb.keys, bytes_read=pb.bytes_read,
                   bytes_written=pb.bytes_written, tasks_done=pb.tasks_done,
                   tasks_total=pb.tasks_total,
                   horizon=MessageId.from_pb(pb.horizon) if pb.HasField("horizon") else None,
                   start_ms=pb.start_time, end_ms=pb.end_time, trigger=pb.trigger,
                   previous_job_id=pb.previous_job_id, peak_rss_bytes=pb.peak_rss_bytes,
                   tombstone_cutoff_ms=pb.tombstone_cutoff_ms, compute_ms=pb.compute_ms,
                   error=err)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "error"}
        d["horizon"] = str(self.horizon) if self.horizon is not None else None
        if self.error is not None:
            d["error"] = {"reason": self.error.reason, "message": self.error.message}
        return d


_MAX_INT64 = (1 << 63) - 1
_MAX_UINT64 = (1 << 64) - 1


def position_pb(position: str | MessageId | int,
                what: str = "position") -> common_pb2.StartPosition:
    """A StartPosition from "earliest" / "latest" (any case), a MessageId, its text form
    ("L:E" or "L:E:P"; the partition is not sent: a handle or topic names it) or an int of
    publish time in ms since the epoch (the first message published at or after it).
    Anything else raises `InvalidArgument` (`InvalidMessageId` for a bad id)."""
    if isinstance(position, bool):
        raise errors.InvalidArgument(f"{what} must be earliest, latest, a message id or a "
                                     f"publish time in ms, got {position!r}")
    if isinstance(position, int):
        if not 0 <= position <= _MAX_INT64:
            raise errors.InvalidArgument(f"{what}: publish time must be ms since the epoch "
                                         f">= 0, got {position}")
        return common_pb2.StartPosition(publish_time=position)
    if isinstance(position, str):
        word = position.strip().lower()
        if word == "earliest":
            return common_pb2.StartPosition(earliest=True)
        if word == "latest":
            return common_pb2.StartPosition(latest=True)
        position = MessageId.parse(position)
    if isinstance(position, MessageId):
        mid = MessageId.checked(position.ledger_id, position.entry_id)
        return common_pb2.StartPosition(message_id=mid.to_pb())
    raise errors.InvalidArgument(f"{what} must be earliest, latest, a message id or a publish "
                                 f"time in ms, got {position!r}")


def _count(value: object, what: str, low: int = 0, high: int = _MAX_UINT64) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise errors.InvalidArgument(f"{what} must be an integer in {low}..{high}, got {value!r}")
    return value


_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}


def to_dict(msg: PbMessage) -> dict[str, Any]:
    """protobuf's JSON mapping, except that 64-bit counters stay numbers (as Pulsar prints
    them) instead of strings."""
    # (protobuf's stubs say a DESCRIPTOR may be upb's Descriptor, a class of its own there;
    # at runtime it is an instance of descriptor.Descriptor, as isinstance says)
    desc: Descriptor = msg.DESCRIPTOR  # type: ignore[assignment]
    return _numbers(desc, MessageToDict(msg, always_print_fields_with_no_presence=True))


def _numbers(desc: Descriptor, data: dict[str, Any]) -> dict[str, Any]:
    for f in desc.fields:
        if f.json_name not in data:
            continue
        v = data[f.json_name]
        if f.type in _INT64:
            data[f.json_name] = [int(x) for x in v] if isinstance(v, list) else int(v)
        elif f.message_type is not None:
            if f.message_type.GetOptions().map_entry:
                vf = f.message_type.fields_by_name["value"]
                if vf.message_type is not None:
                    for k in v:
                        _numbers(vf.message_type, v[k])
                elif vf.type in _INT64:
                    data[f.json_name] = {k: int(x) for k, x in v.items()}
            elif isinstance(v, list):
                for x in v:
                    _numbers(f.message_type, x)
            elif isinstance(v, dict):
                _numbers(f.message_type, v)
    return data


def _target(text: str) -> str:
    """A grant's target as sent: "tenant/namespace", or a topic's full name."""
    t = parse_target(text)
    return t if isinstance(t, str) else str(t)


class _JobStream(Protocol):
    """WatchCompaction's call: the jobs as they come (gRPC's streaming call object)."""

    def __iter__(self) -> Iterator[apb.CompactionJob]:
        ...

    def cancel(self) -> bool:
        ...


class _Watch(Protocol):
    def __call__(self, request: apb.TopicRequest, timeout: float | None = None) -> _JobStream:
        ...


class _AdminStub(Protocol):
    """The Admin service's methods (`Connection.admin`: the generated stub is untyped)."""

    CreateTopic: Unary[apb.CreateTopicRequest, apb.TopicMetadata]
    DeleteTopic: Unary[apb.DeleteTopicRequest, apb.Empty]
    ListTopics: Unary[apb.ListTopicsRequest, apb.ListTopicsResponse]
    GetTopicMetadata: Unary[apb.TopicRequest, apb.TopicMetadata]
    GetPolicies: Unary[apb.TopicRequest, common_pb2.Policies]
    SetPolicies: Unary[apb.SetPoliciesRequest, common_pb2.Policies]
    GetTopicStats: Unary[apb.TopicRequest, apb.TopicStats]
    GetInternalStats: Unary[apb.TopicRequest, apb.InternalStats]
    Lookup: Unary[apb.TopicRequest, apb.LookupResponse]
    RollLedger: Unary[apb.TopicRequest, apb.LedgerStats]
    Truncate: Unary[apb.TopicRequest, apb.TruncateResponse]
    GetLastMessageId: Unary[apb.GetLastMessageIdRequest, common_pb2.MessageIdData]
    GetNamespacePolicies: Unary[apb.NamespaceRequest, apb.NamespacePolicies]
    SetNamespacePolicies: Unary[apb.SetNamespacePoliciesRequest, apb.NamespacePolicies]
    CreateShadowTopic: Unary[apb.CreateShadowTopicRequest, apb.TopicMetadata]
    DeleteShadowTopic: Unary[apb.TopicRequest, apb.Empty]
    GetShadowTopics: Unary[apb.TopicRequest, apb.ShadowTopicsResponse]
    GetShadowSource: Unary[apb.TopicRequest, apb.ShadowSourceResponse]
    CreateSubscription: Unary[apb.CreateSubscriptionRequest, apb.Empty]
    DeleteSubscription: Unary[apb.DeleteSubscriptionRequest, apb.SubscriptionChange]
    ListSubscriptions: Unary[apb.ListSubscriptionsRequest, apb.ListSubscriptionsResponse]
    ResetCursor: Unary[apb.ResetCursorRequest, apb.ResetCursorResponse]
    Skip: Unary[apb.SkipRequest, apb.SubscriptionChange]
    ClearBacklog: Unary[apb.ClearBacklogRequest, apb.SubscriptionChange]
    PeekMessages: Unary[apb.PeekMessagesRequest, apb.PeekMessagesResponse]
    Compact: Unary[apb.TopicRequest, apb.CompactResponse]
    GetCompactionStatus: Unary[apb.TopicRequest, apb.CompactionJob]
    WatchCompaction: _Watch
    GrantPermission: Unary[apb.PermissionRequest, apb.Empty]
    RevokePermission: Unary[apb.PermissionRequest, apb.Empty]
    GetPermissions: Unary[apb.TopicRequest, apb.PermissionsResponse]
    CreateTenant: Unary[apb.TenantRequest, apb.Empty]
    DeleteTenant: Unary[apb.TenantRequest, apb.Empty]
    ListTenants: Unary[apb.ListTenantsRequest, apb.ListTenantsResponse]
    CreateNamespace: Unary[apb.NamespaceRequest, apb.Empty]
    DeleteNamespace: Unary[apb.NamespaceRequest, apb.Empty]
    ListNamespaces: Unary[apb.ListNamespacesRequest, apb.ListNamespacesResponse]


class Admin:
    def __init__(self, conn: Connection, deadline: Deadline | None = None):
        """Use `Client.admin`. With `deadline` (the client's opening calls, which retry as
        a whole), each call is made once, within the time the deadline leaves."""
        self._c = conn
        self._stub: _AdminStub = conn.admin
        self._deadline = deadline

    def _call(self, method: Unary[M, R], request: M, idempotent: bool = True) -> R:
        """One unary call, retried as source/client/retry.py says (`idempotent=False`: only
        errors that guarantee the call was not applied)."""
        conn = self._c
        if self._deadline is not None:
            return conn.call(method, request, timeout=self._deadline.budget(conn.timeout))
        return conn.retry.run(
            lambda deadline: conn.call(method, request, timeout=deadline.budget(conn.timeout)),
            retriable if idempotent else not_applied)

    def create_topic(self, topic: str, partitions: int = 0, policies: Policies | None = None,
                     properties: dict[str, str] | None = None) -> TopicMetadata:
        """Raises InvalidTopicName / InvalidArgument / InvalidPolicies before sending when an
        argument is out of range (see shadowtopic.core.policies for the ranges)."""
        req = apb.CreateTopicRequest(topic=canonical(topic),
                                     partitions=validate_partitions(partitions),
                                     policies=(policies or Policies()).to_pb(),
                                     properties=validate_properties(properties or {}))
        return TopicMetadata.from_pb(self._call(self._stub.CreateTopic, req, idempotent=False))

    def delete_topic(self, topic: str, force: bool = False) -> None:
        self._call(self._stub.DeleteTopic, apb.DeleteTopicRequest(topic=canonical(topic),
                                                                  force=force),
                   idempotent=False)

    def list_topics(self, namespace: str = "") -> list[TopicMetadata]:
        out, token = [], ""
        while True:
            resp = self._call(self._stub.ListTopics, apb.ListTopicsRequest(
                namespace=namespace, page=common_pb2.PageRequest(page_token=token)))
            out += [TopicMetadata.from_pb(t) for t in resp.topics]
            token = resp.next_page_token
            if not token:
                return out

    def get_topic(self, topic: str) -> TopicMetadata:
        return TopicMetadata.from_pb(self._call(
            self._stub.GetTopicMetadata, apb.TopicRequest(topic=canonical(topic))))

    def get_policies(self, topic: str) -> Policies:
        return Policies.from_pb(self._call(self._stub.GetPolicies,
                                             apb.TopicRequest(topic=canonical(topic))))

    def set_policies(self, topic: str, policies: Policies) -> Policies:
        return Policies.from_pb(self._call(self._stub.SetPolicies, apb.SetPoliciesRequest(
            topic=canonical(topic), policies=policies.to_pb())))

    def get_namespace_policies(self, namespace: str) -> Policies:
        """The policies set on `namespace` ("tenant/namespace"): only those fields; every
        topic of it without its own value of a field takes the namespace's."""
        return Policies.from_pb(self._call(
            self._stub.GetNamespacePolicies,
            apb.NamespaceRequest(namespace=parse_namespace(namespace))).policies)

    def set_namespace_policies(self, namespace: str, policies: Policies | None = None,
                               remove: Iterable[str] = ()) -> Policies:
        """Set the fields `policies` sets and unset the fields named in `remove` (e.g.
        "message_ttl_seconds") on `namespace`; returns its policies after that. Raises
        InvalidTopicName / InvalidPolicies before sending when an argument is wrong."""
        remove = list(remove)
        Policies().without(remove)  # InvalidPolicies for a name that is no policy
        return Policies.from_pb(self._call(
            self._stub.SetNamespacePolicies, apb.SetNamespacePoliciesRequest(
                namespace=parse_namespace(namespace),
                policies=(policies or Policies()).to_pb(), remove=remove)).policies)

    # ---- tenants, namespaces, permissions (docs/SECURITY.md, "Authorization") -------------

    def create_tenant(self, tenant: str, admin_roles: Iterable[str] = ()) -> None:
        """A tenant whose namespaces and topics `admin_roles` administer (a superuser's
        call; `TenantAlreadyExists`)."""
        self._call(self._stub.CreateTenant, apb.TenantRequest(
            tenant=check_tenant(tenant), admin_roles=[check_role(r) for r in admin_roles]),
            idempotent=False)

    def delete_tenant(self, tenant: str) -> None:
        """`NotEmpty` while it has namespaces."""
        self._call(self._stub.DeleteTenant, apb.TenantRequest(tenant=check_tenant(tenant)),
                   idempotent=False)

    def list_tenants(self) -> dict[str, list[str]]:
        """Every tenant, with its admin roles."""
        resp = self._call(self._stub.ListTenants, apb.ListTenantsRequest())
        return {t.tenant: list(t.admin_roles) for t in resp.tenants}

    def create_namespace(self, namespace: str) -> None:
        """`tenant/namespace` (its tenant must exist; `NamespaceAlreadyExists`)."""
        self._call(self._stub.CreateNamespace, apb.NamespaceRequest(
            namespace=parse_namespace(namespace)), idempotent=False)

    def delete_namespace(self, namespace: str) -> None:
        """With its policies and grants; `NotEmpty` while it has topics."""
        self._call(self._stub.DeleteNamespace, apb.NamespaceRequest(
            namespace=parse_namespace(namespace)), idempotent=False)

    def list_namespaces(self, tenant: str) -> list[str]:
        return list(self._call(self._stub.ListNamespaces, apb.ListNamespacesRequest(
            tenant=check_tenant(tenant))).namespaces)

    def grant_permission(self, target: str, role: str, actions: Iterable[str]) -> None:
        """Set `role`'s actions on `target` (a topic, or "tenant/namespace") to `actions`:
        produce, consume, shadow, replicate. InvalidArgument before sending for an unknown
        action."""
        names = sorted(str(a) for a in parse_actions(actions))
        self._call(self._stub.GrantPermission, apb.PermissionRequest(
            topic=_target(target), role=check_role(role), actions=names))

    def revoke_permission(self, target: str, role: str) -> None:
        """Take every action of `role` on `target` (open streams that relied on it end)."""
        self._call(self._stub.RevokePermission, apb.PermissionRequest(
            topic=_target(target), role=check_role(role)))

    def get_permissions(self, target: str) -> dict[str, list[str]]:
        """The roles granted on `target` itself, with their actions."""
        resp = self._call(self._stub.GetPermissions, apb.TopicRequest(topic=_target(target)))
        return {role: list(a.actions) for role, a in sorted(resp.roles.items())}

    def stats(self, topic: str) -> dict[str, Any]:
        return to_dict(self._call(self._stub.GetTopicStats,
                                    apb.TopicRequest(topic=canonical(topic))))

    def internal_stats(self, topic: str) -> dict[str, Any]:
        return to_dict(self._call(self._stub.GetInternalStats,
                                    apb.TopicRequest(topic=canonical(topic))))

    def lookup(self, topic: str) -> dict[str, Any]:
        return to_dict(self._call(self._stub.Lookup, apb.TopicRequest(topic=canonical(topic))))

    def roll_ledger(self, topic: str) -> dict[str, Any]:
        return to_dict(self._call(self._stub.RollLedger,
                                  apb.TopicRequest(topic=canonical(topic)), idempotent=False))

    def truncate(self, topic: str) -> dict[str, Any]:
        return to_dict(self._call(self._stub.Truncate, apb.TopicRequest(topic=canonical(topic)),
                                  idempotent=False))

    def last_message_id(self, topic: str, read_compacted: bool = False) -> MessageId | None:
        """The newest message's id, or None when the topic holds no message; with
        `read_compacted`, the newest one a compacted reader can read."""
        pb = self._call(self._stub.GetLastMessageId, apb.GetLastMessageIdRequest(
            topic=canonical(topic), read_compacted=read_compacted))
        return MessageId.from_pb(pb) if pb.ledger_id else None

    # ---- compaction (PIP-14) ----------------------------------------------------------------

    def compact(self, topic: str) -> str:
        """Ask for a compaction of `topic` (every partition of a partitioned one): the open
        ledger is sealed now, so the job covers everything produced before this call; a
        compaction worker runs it. Returns the job id; `CompactionInProgress` while one
        runs, `NotAllowed` for a shadow (its source is what gets compacted)."""
        return self._call(self._stub.Compact, apb.TopicRequest(topic=canonical(topic)),
                          idempotent=False).job_id

    def compaction_status(self, topic: str) -> CompactionStatus:
        """The newest compaction job's record (`CompactionNotFound`: never compacted)."""
        return CompactionStatus.from_pb(self._call(
            self._stub.GetCompactionStatus, apb.TopicRequest(topic=canonical(topic))))

    def watch_compaction(self, topic: str, timeout: float | None = None
                         ) -> Iterator[CompactionStatus]:
        """The newest job's record now and at each change until the job ends."""
        if self._c.closed:
            raise errors.AlreadyClosed("client is closed")
        stream = self._stub.WatchCompaction(apb.TopicRequest(topic=canonical(topic)),
                                            timeout=timeout)
        try:
            for pb in stream:
                yield CompactionStatus.from_pb(pb)
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None
        finally:
            stream.cancel()

    # ---- shadow topics (PIP-180) ------------------------------------------------------------

    def create_shadow_topic(self, shadow: str, source: str,
                            properties: dict[str, str] | None = None) -> TopicMetadata:
        """Create `shadow`, a read-only shadow of the existing source topic `source`: it
        shares the source's ledgers (nothing is copied) and has subscriptions of its own; a
        shadow of a partitioned source gets the same partitions. The link cannot change.
        `TopicNotFound` (no source), `TopicAlreadyExists`, `InvalidArgument` (a partition
        name, itself), `NotAllowed` (the source is a shadow)."""
        req = apb.CreateShadowTopicRequest(shadow=canonical(shadow), source=canonical(source),
                                           properties=validate_properties(properties or {}))
        return TopicMetadata.from_pb(self._call(self._stub.CreateShadowTopic, req,
                                                idempotent=False))

    def get_shadow_topics(self, source: str) -> list[str]:
        """The shadows of `source` (canonical names; empty when it has none)."""
        resp = self._call(self._stub.GetShadowTopics,
                            apb.TopicRequest(topic=canonical(source)))
        return list(resp.shadows)

    def get_shadow_source(self, shadow: str) -> str:
        """The source topic of `shadow` (`NotAllowed` when it is not a shadow)."""
        return self._call(self._stub.GetShadowSource,
                            apb.TopicRequest(topic=canonical(shadow))).source

    def delete_shadow_topic(self, shadow: str) -> None:
        """Delete a shadow, its subscriptions and their cursors; never any of its source's
        data (`NotAllowed` when `shadow` is not a shadow)."""
        self._call(self._stub.DeleteShadowTopic, apb.TopicRequest(topic=canonical(shadow)),
                   idempotent=False)

    # ---- subscriptions ------------------------------------------------------------------

    def create_subscription(self, topic: str, subscription: str,
                            start: str | MessageId | int = "latest") -> None:
        """Create a durable subscription positioned at `start` ("earliest", "latest", a
        MessageId / "L:E", or publish time in ms). `SubscriptionAlreadyExists` if it exists."""
        req = apb.CreateSubscriptionRequest(topic=canonical(topic),
                                            subscription=check_subscription(subscription),
                                            start=position_pb(start, "start"))
        self._call(self._stub.CreateSubscription, req, idempotent=False)

    def delete_subscription(self, topic: str, subscription: str, force: bool = False,
                            dry_run: bool = False) -> dict[str, Any]:
        """Delete a subscription (`force`: also when consumers are attached; they are
        disconnected). Returns what changed (or would, with `dry_run`): markDeletePosition,
        msgBacklog, entriesAcked, consumers, dryRun."""
        return to_dict(self._call(self._stub.DeleteSubscription, apb.DeleteSubscriptionRequest(
            topic=canonical(topic), subscription=check_subscription(subscription),
            force=bool(force), dry_run=bool(dry_run)), idempotent=bool(dry_run)))

    def list_subscriptions(self, topic: str) -> list[str]:
        out, token = [], ""
        while True:
            resp = self._call(self._stub.ListSubscriptions, apb.ListSubscriptionsRequest(
                topic=canonical(topic), page=common_pb2.PageRequest(page_token=token)))
            out += list(resp.subscriptions)
            token = resp.next_page_token
            if not token:
                return out

    def reset_cursor(self, topic: str, subscription: str, position: str | MessageId | int,
                     dry_run: bool = False) -> tuple[MessageId, bool]:
        """Move the subscription's cursor to a MessageId ("L:E") or a publish time (int, ms
        since the epoch). Returns where it landed (or would, with `dry_run`) and whether the
        position was clamped to the first or last message."""
        resp = self._call(self._stub.ResetCursor, apb.ResetCursorRequest(
            topic=canonical(topic), subscription=check_subscription(subscription),
            position=position_pb(position), dry_run=bool(dry_run)))
        return MessageId.from_pb(resp.position), resp.clamped

    def skip(self, topic: str, subscription: str, count: int,
             dry_run: bool = False) -> dict[str, Any]:
        """Acknowledge the next `count` messages of the subscription's backlog."""
        return to_dict(self._call(self._stub.Skip, apb.SkipRequest(
            topic=canonical(topic), subscription=check_subscription(subscription),
            count=_count(count, "count"), dry_run=bool(dry_run)), idempotent=bool(dry_run)))

    def clear_backlog(self, topic: str, subscription: str, dry_run: bool = False) -> dict[str, Any]:
        """Acknowledge the subscription's whole backlog."""
        return to_dict(self._call(self._stub.ClearBacklog, apb.ClearBacklogRequest(
            topic=canonical(topic), subscription=check_subscription(subscription),
            dry_run=bool(dry_run)), idempotent=bool(dry_run)))

    def peek_messages(self, topic: str, subscription: str, count: int = 1) -> list[Message]:
        """The next `count` messages of the subscription's backlog, without consuming them."""
        name = canonical(topic)
        resp = self._call(self._stub.PeekMessages, apb.PeekMessagesRequest(
            topic=name, subscription=check_subscription(subscription),
            count=_count(count, "count", 1, (1 << 32) - 1)))
        partition = TopicName.parse(name).partition_index
        return [Message.from_entry(name, partition, e) for e in resp.entries]
