"""What each RPC needs (docs/SECURITY.md, "Authorization"), checked by the interceptor
(source/broker/authenticate.py) from the request before the handler runs, as Pulsar's
topic and namespace operations map to produce, consume, lookup or admin.

Kinds of rule (`Rule.field` names the request field that holds the target):
- `produce`, `consume`, `replicate`: that action on the topic;
- `lookup`: produce or consume on the topic (metadata, stats, lookups);
- `admin`: an admin role of the target's tenant (the field holds a topic, a namespace
  "tenant/namespace", or, for permissions, either);
- `tenant_admin`: an admin role of the tenant the field names;
- `superuser`;
- `listing`: topics of a namespace need its tenant's admin; of every namespace, a
  superuser;
- `shadow`: `shadow` on the source and admin of the shadow's tenant;
- `in_stream`: a stream whose requests name their topics: the service checks each
  (Produce: produce; Connect: consume; Replicate: replicate on the shadow).

A method of a service named here that has no rule is refused (tests pin that every RPC of
the contract has one, and that each rule's fields are fields of its request type).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shadowtopic.broker.authorize import Authorizer
from shadowtopic.core.names import TopicName, parse_namespace
from shadowtopic.core.permissions import Action, parse_target

Kind = Literal["produce", "consume", "replicate", "lookup", "admin", "tenant_admin",
               "superuser", "listing", "shadow", "in_stream"]


@dataclass(frozen=True)
class Rule:
    kind: Kind
    field: str = "topic"  # the request's field that names the target ("": none)
    source: str = ""      # `shadow`: the field that names the source ("": read the shadow's)


ADMIN, LOOKUP, CONSUME = Rule("admin"), Rule("lookup"), Rule("consume")

RULES: dict[str, Rule] = {
    # topics
    "/shadowtopic.v1.Admin/CreateTopic": ADMIN,
    "/shadowtopic.v1.Admin/DeleteTopic": ADMIN,
    "/shadowtopic.v1.Admin/ListTopics": Rule("listing", "namespace"),
    "/shadowtopic.v1.Admin/GetTopicMetadata": LOOKUP,
    "/shadowtopic.v1.Admin/GetPolicies": LOOKUP,
    "/shadowtopic.v1.Admin/SetPolicies": ADMIN,
    "/shadowtopic.v1.Admin/GetTopicStats": LOOKUP,
    "/shadowtopic.v1.Admin/GetInternalStats": LOOKUP,
    "/shadowtopic.v1.Admin/Lookup": LOOKUP,
    "/shadowtopic.v1.Admin/RollLedger": ADMIN,
    "/shadowtopic.v1.Admin/Truncate": ADMIN,
    "/shadowtopic.v1.Admin/GetLastMessageId": CONSUME,
    "/shadowtopic.v1.Admin/GetNamespacePolicies": Rule("admin", "namespace"),
    "/shadowtopic.v1.Admin/SetNamespacePolicies": Rule("admin", "namespace"),
    # shadows
    "/shadowtopic.v1.Admin/CreateShadowTopic": Rule("shadow", "shadow", source="source"),
    "/shadowtopic.v1.Admin/DeleteShadowTopic": Rule("shadow"),
    "/shadowtopic.v1.Admin/GetShadowTopics": LOOKUP,
    "/shadowtopic.v1.Admin/GetShadowSource": LOOKUP,
    # subscriptions
    "/shadowtopic.v1.Admin/CreateSubscription": CONSUME,
    "/shadowtopic.v1.Admin/DeleteSubscription": CONSUME,
    "/shadowtopic.v1.Admin/ListSubscriptions": CONSUME,
    "/shadowtopic.v1.Admin/ResetCursor": CONSUME,
    "/shadowtopic.v1.Admin/Skip": CONSUME,
    "/shadowtopic.v1.Admin/ClearBacklog": CONSUME,
    "/shadowtopic.v1.Admin/PeekMessages": CONSUME,
    # compaction
    "/shadowtopic.v1.Admin/Compact": ADMIN,
    "/shadowtopic.v1.Admin/GetCompactionStatus": LOOKUP,
    "/shadowtopic.v1.Admin/WatchCompaction": LOOKUP,
    # permissions, tenants, namespaces
    "/shadowtopic.v1.Admin/GrantPermission": ADMIN,
    "/shadowtopic.v1.Admin/RevokePermission": ADMIN,
    "/shadowtopic.v1.Admin/GetPermissions": ADMIN,
    "/shadowtopic.v1.Admin/CreateTenant": Rule("superuser", "tenant"),
    "/shadowtopic.v1.Admin/DeleteTenant": Rule("superuser", "tenant"),
    "/shadowtopic.v1.Admin/ListTenants": Rule("superuser", ""),
    "/shadowtopic.v1.Admin/CreateNamespace": Rule("admin", "namespace"),
    "/shadowtopic.v1.Admin/DeleteNamespace": Rule("admin", "namespace"),
    "/shadowtopic.v1.Admin/ListNamespaces": Rule("tenant_admin", "tenant"),
    # data
    "/shadowtopic.v1.Producer/Produce": Rule("in_stream"),
    "/shadowtopic.v1.Consumer/Connect": Rule("in_stream"),
    "/shadowtopic.v1.Replication/Replicate": Rule("in_stream"),
    "/shadowtopic.v1.Storage/ReadEntries": Rule("replicate"),
    "/shadowtopic.v1.Tables/ReadArrow": CONSUME,
}


def _tenant(text: str) -> str:
    t = parse_target(text)
    return t.split("/", 1)[0] if isinstance(t, str) else t.tenant


async def check(authz: Authorizer, method: str, request: object) -> None:
    """Refuse the call (`PermissionDenied`) unless the caller may make it; `request` is
    None for a call whose requests stream in."""
    if not authz.enabled:
        return
    rule = RULES.get(method)
    if rule is None:
        authz.require_superuser(f"call {method} (no rule names it)")
        return
    kind = rule.kind
    name = method.rsplit("/", 1)[-1]
    text = getattr(request, rule.field) if rule.field and request is not None else ""
    if kind == "in_stream":
        return
    if kind == "superuser":
        authz.require_superuser(f"call {name}")
    elif kind == "tenant_admin":
        authz.require_admin(text, f"call {name} on tenant {text}")
    elif kind == "admin":
        authz.require_admin(_tenant(text), f"call {name} on {text}")
    elif kind == "listing":
        if text:
            ns = parse_namespace(text)
            authz.require_admin(ns.split("/", 1)[0], f"list the topics of {ns}")
        else:
            authz.require_superuser("list the topics of every namespace")
    elif kind == "lookup":
        authz.require_lookup(TopicName.parse(text))
    elif kind == "shadow":
        source = getattr(request, rule.source) if rule.source else ""
        await authz.require_shadow(TopicName.parse(text),
                                   TopicName.parse(source) if source else None)
    else:
        authz.require(Action(kind), TopicName.parse(text))
