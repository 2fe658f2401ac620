"""`shadowtopic tenants`, and the namespace and topic commands of access (docs/SECURITY.md,
"Authorization"), as Pulsar's:

    shadowtopic tenants create <tenant> [--admin-roles R,R] | list | delete <tenant>
    shadowtopic namespaces create <tenant/ns> | list <tenant> | delete <tenant/ns>
    shadowtopic namespaces grant-permission <tenant/ns> --role R --actions produce,consume
    shadowtopic namespaces revoke-permission <tenant/ns> --role R
    shadowtopic namespaces permissions <tenant/ns>
    shadowtopic topics grant-permission|revoke-permission|permissions <topic> ...

Actions: produce, consume, shadow, replicate (a grant sets the role's actions to those).
Each runs through the client's admin (`Admin.create_tenant` and the like)."""
from __future__ import annotations

import argparse
from collections.abc import Callable

from shadowtopic.cli.commands import connect, done
from shadowtopic.cli.output import emit

Common = Callable[[argparse.ArgumentParser], None]


def _roles(text: str) -> list[str]:
    return [r.strip() for r in text.split(",") if r.strip()]


def add_tenants(sub, common: Common) -> None:
    """`tenants ...` under the CLI's subcommands."""
    group = sub.add_parser("tenants", help="tenants: who administers their namespaces") \
        .add_subparsers(dest="action", required=True)
    p = group.add_parser("create", help="create a tenant (a superuser's command)")
    p.add_argument("tenant")
    p.add_argument("--admin-roles", type=_roles, default=[], metavar="ROLE,ROLE",
                   help="roles that administer its namespaces and topics")
    common(p)
    p.set_defaults(func=tenants_create)
    p = group.add_parser("list", help="every tenant and its admin roles")
    common(p)
    p.set_defaults(func=tenants_list)
    p = group.add_parser("delete", help="delete a tenant without namespaces")
    p.add_argument("tenant")
    common(p)
    p.set_defaults(func=tenants_delete)


def _grant_parsers(group, what: str, common: Common) -> None:
    p = group.add_parser("grant-permission", help=f"set a role's actions on a {what}")
    p.add_argument("target", metavar=what.upper())
    p.add_argument("--role", required=True)
    p.add_argument("--actions", type=_roles, required=True, metavar="ACTION,ACTION",
                   help="produce, consume, shadow, replicate")
    common(p)
    p.set_defaults(func=grant_permission)
    p = group.add_parser("revoke-permission", help=f"take every action of a role on a {what}")
    p.add_argument("target", metavar=what.upper())
    p.add_argument("--role", required=True)
    common(p)
    p.set_defaults(func=revoke_permission)
    p = group.add_parser("permissions", help=f"the roles granted on a {what} and their actions")
    p.add_argument("target", metavar=what.upper())
    common(p)
    p.set_defaults(func=permissions)


def add_namespace_actions(group, common: Common) -> None:
    """`namespaces create|list|delete|grant-permission|revoke-permission|permissions`."""
    p = group.add_parser("create", help="create a namespace (its tenant must exist)")
    p.add_argument("namespace", help="tenant/namespace")
    common(p)
    p.set_defaults(func=namespaces_create)
    p = group.add_parser("list", help="the namespaces of a tenant")
    p.add_argument("tenant")
    common(p)
    p.set_defaults(func=namespaces_list)
    p = group.add_parser("delete", help="delete a namespace without topics (its policies "
                                        "and grants too)")
    p.add_argument("namespace", help="tenant/namespace")
    common(p)
    p.set_defaults(func=namespaces_delete)
    _grant_parsers(group, "namespace", common)


def add_topic_actions(group, common: Common) -> None:
    """`topics grant-permission|revoke-permission|permissions`."""
    _grant_parsers(group, "topic", common)


def tenants_create(args) -> int:
    with connect(args) as c:
        c.admin.create_tenant(args.tenant, args.admin_roles)
    done({"tenant": args.tenant, "admin_roles": args.admin_roles, "created": True},
         args.output, f"created tenant {args.tenant}")
    return 0


def tenants_list(args) -> int:
    with connect(args) as c:
        found = c.admin.list_tenants()
    emit([{"tenant": t, "admin_roles": ",".join(r)} for t, r in found.items()]
         if args.output != "json" else
         [{"tenant": t, "admin_roles": r} for t, r in found.items()], args.output,
         columns=["tenant", "admin_roles"])
    return 0


def tenants_delete(args) -> int:
    with connect(args) as c:
        c.admin.delete_tenant(args.tenant)
    done({"tenant": args.tenant, "deleted": True}, args.output, f"deleted tenant {args.tenant}")
    return 0


def namespaces_create(args) -> int:
    with connect(args) as c:
        c.admin.create_namespace(args.namespace)
    done({"namespace": args.namespace, "created": True}, args.output,
         f"created namespace {args.namespace}")
    return 0


def namespaces_list(args) -> int:
    with connect(args) as c:
        names = c.admin.list_namespaces(args.tenant)
    if args.output == "json":
        emit(names, "json")
    else:
        emit([{"namespace": n} for n in names], args.output, columns=["namespace"])
    return 0


def namespaces_delete(args) -> int:
    with connect(args) as c:
        c.admin.delete_namespace(args.namespace)
    done({"namespace": args.namespace, "deleted": True}, args.output,
         f"deleted namespace {args.namespace}")
    return 0


def grant_permission(args) -> int:
    with connect(args) as c:
        c.admin.grant_permission(args.target, args.role, args.actions)
    done({"target": args.target, "role": args.role, "actions": sorted(args.actions)},
         args.output, f"granted {','.join(sorted(args.actions))} on {args.target} to "
                      f"{args.role}")
    return 0


def revoke_permission(args) -> int:
    with connect(args) as c:
        c.admin.revoke_permission(args.target, args.role)
    done({"target": args.target, "role": args.role, "revoked": True}, args.output,
         f"revoked every action of {args.role} on {args.target}")
    return 0


def permissions(args) -> int:
    with connect(args) as c:
        roles = c.admin.get_permissions(args.target)
    if args.output == "json":
        emit(roles, "json")
    else:
        emit([{"role": r, "actions": ",".join(a)} for r, a in roles.items()], args.output,
             columns=["role", "actions"])
    return 0
