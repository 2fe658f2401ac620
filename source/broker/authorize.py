"""The broker's authorization (docs/SECURITY.md, "Authorization"): may this role do this?

On when the broker runs with `--authorization` (which needs an authentication provider:
roles come from source/security/authentication.py). Off, every check passes.

Who may do what:
- a **superuser** role (`--superuser-roles`) may do everything, `replicate` included;
- an **admin role of a tenant** (its `admin_roles`) administers the tenant's namespaces and
  topics (create, delete, policies, grants, truncate, compact) and may produce, consume and
  shadow there, but not replicate;
- any other role may do what its grants say (source/metadata/grants.py): the actions
  granted on the topic's namespace or on the topic itself (a partition's: its partitioned
  topic's). A shadow's grants are its own: consuming a source grants nothing on its
  shadows, nor the reverse.

Which call needs what is source/broker/access_rules.py (every RPC is named there: a method
it does not know is refused). A call's role is checked before its handler touches anything
(unary calls: by the interceptor from the request; streams: by the service as each topic is
named in them), so a denied call changes nothing. A refusal is `PermissionDenied` naming
the role, the action and the target, and one audit line.

Grants are followed through a watch on etcd (`GrantsFollower`). Until they were listed once
nothing that needs a grant is allowed (`ServiceUnavailable`, retriable). A stream remembers
what it was allowed (`Call.holds`); after every change of the grants each open stream is
checked again and one that lost a permission ends with PERMISSION_DENIED within the time
the watch takes to deliver the change.
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable

from shadowtopic.broker.audit import audit
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.core.permissions import Action
from shadowtopic.metadata.base import MetadataStore
from shadowtopic.metadata.grants import GrantsFollower, GrantTable
from shadowtopic.security.authentication import ANONYMOUS, Principal

log = logging.getLogger(__name__)


class Call:
    """One call being served: who makes it and, for a stream, how to end it early."""

    __slots__ = ("principal", "task", "ended", "holds")

    def __init__(self, principal: Principal, task: asyncio.Task | None = None):
        self.principal = principal
        self.task = task  # the handler's task (streams); None: a unary call
        self.ended: errors.ShadowTopicError | None = None
        self.holds: set[tuple[Action, TopicName]] = set()

    def end(self, err: errors.ShadowTopicError) -> None:
        """End the stream with `err` (its handler is cancelled; the first reason wins)."""
        if self.ended is None and self.task is not None:
            self.ended = err
            self.task.cancel()


#: the metadata key of the role a broker forwards a call for (source/broker/authenticate.py)
ORIGINAL_ROLE = "x-shadowtopic-original-role"


def forwarded_for() -> tuple[tuple[str, str], ...]:
    """The metadata a call forwarded to another broker carries for its caller's role."""
    role = current_principal().role
    return ((ORIGINAL_ROLE, role),) if role else ()


#: the call being handled (None outside a call, or when authentication is off)
CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar("call", default=None)


def current_principal() -> Principal:
    call = CALL.get()
    return ANONYMOUS if call is None else call.principal


class Authorizer:
    """The decisions and the streams to recheck (module doc)."""

    def __init__(self, store: MetadataStore | None = None, superusers: frozenset[str] = frozenset(),
                 enabled: bool = False,
                 source_of: Callable[[TopicName], Awaitable[TopicName | None]] | None = None):
        self.enabled = enabled and store is not None
        self.superusers = superusers
        self.table = GrantTable()
        self._calls: set[Call] = set()
        self._source_of = source_of
        self.follower = GrantsFollower(store, self._changed) \
            if self.enabled and store is not None else None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.follower is not None:
            self._task = asyncio.get_running_loop().create_task(
                self.follower.start_retrying(), name="follow grants")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.follower is not None:
            await self.follower.close()

    # ---- decisions -------------------------------------------------------------------------

    def is_superuser(self, p: Principal) -> bool:
        return p.role in self.superusers

    def is_admin(self, p: Principal, tenant: str) -> bool:
        return self.is_superuser(p) or p.role in self.table.admins_of(tenant)

    def allows(self, p: Principal, action: Action, topic: TopicName) -> bool:
        if self.is_superuser(p):
            return True
        if action is not Action.REPLICATE and p.role in self.table.admins_of(topic.tenant):
            return True
        return action in self.table.actions(p.role, topic)

    # ---- checks: each raises PermissionDenied (nothing when authorization is off) ----------

    def _loaded(self) -> None:
        if not self.table.loaded:
            raise errors.ServiceUnavailable("the broker has not loaded the permissions yet "
                                            "(etcd unreachable?); try again")

    def _deny(self, p: Principal, what: str) -> errors.ShadowTopicError:
        audit.warning("denied: role %r (%s) may not %s", p.role, p.method, what)
        return errors.PermissionDenied(f"role {p.role!r} may not {what}")

    def require(self, action: Action, topic: TopicName) -> None:
        """The caller may do `action` on `topic`; a stream keeps it, to be checked again."""
        if not self.enabled:
            return
        call = CALL.get()
        p = ANONYMOUS if call is None else call.principal
        if call is not None and (action, topic) in call.holds:
            return
        self._loaded()
        if not self.allows(p, action, topic):
            raise self._deny(p, f"{action} on {topic}")
        if call is not None and call.task is not None:
            call.holds.add((action, topic))

    def require_lookup(self, topic: TopicName) -> None:
        """The caller may produce to or consume `topic` (metadata, stats, lookups)."""
        if not self.enabled:
            return
        p = current_principal()
        self._loaded()
        if not (self.allows(p, Action.PRODUCE, topic) or self.allows(p, Action.CONSUME, topic)):
            raise self._deny(p, f"look up {topic} (it needs produce or consume)")

    def require_admin(self, tenant: str, what: str) -> None:
        """The caller administers `tenant` (or is a superuser)."""
        if not self.enabled:
            return
        p = current_principal()
        self._loaded()
        if not self.is_admin(p, tenant):
            raise self._deny(p, f"{what} (it needs an admin role of tenant {tenant})")

    def require_superuser(self, what: str) -> None:
        if not self.enabled:
            return
        p = current_principal()
        if not self.is_superuser(p):
            raise self._deny(p, f"{what} (it needs a superuser role)")

    async def require_shadow(self, shadow: TopicName, source: TopicName | None) -> None:
        """Create or delete `shadow` of `source`: `shadow` on the source and admin of the
        shadow's tenant (`source` None: read from the shadow's metadata, if it exists)."""
        if not self.enabled:
            return
        self.require_admin(shadow.tenant, f"create or delete the shadow {shadow}")
        if source is None and self._source_of is not None:
            source = await self._source_of(shadow)
        if source is not None:
            p = current_principal()
            if not self.allows(p, Action.SHADOW, source):
                raise self._deny(p, f"shadow {source} (create or delete {shadow})")

    # ---- open streams ----------------------------------------------------------------------

    def opened(self, call: Call) -> None:
        if self.enabled and call.task is not None:
            self._calls.add(call)

    def closed(self, call: Call) -> None:
        self._calls.discard(call)

    def _changed(self, table: GrantTable) -> None:
        self.table = table
        for call in list(self._calls):
            for action, topic in list(call.holds):
                if not self.allows(call.principal, action, topic):
                    what = f"{action} on {topic}"
                    audit.warning("revoked: role %r may no longer %s: its stream ends",
                                  call.principal.role, what)
                    call.end(errors.PermissionDenied(
                        f"role {call.principal.role!r} may no longer {what} (revoked)"))
                    break


#: the authorizer of a broker without authorization (every check passes)
OPEN = Authorizer()
