"""The broker's authentication and the door of its authorization: a server interceptor that
authenticates every call before its handler runs (source/security/authentication.py says
how), then checks the call's rule (source/broker/access_rules.py, the decisions in
source/broker/authorize.py).

- A call that does not authenticate ends with UNAUTHENTICATED and its reason (reason
  `Unauthenticated`, the one error table) before the handler sees a byte of it; the handler
  never runs. The health service is exempt (probes carry no credentials), and so is
  reflection when it is on (`--grpc-reflection`).
- **Original principal** (Pulsar's): a call a broker forwards for a user (stats,
  subscription admin) carries that user's role in the metadata `x-shadowtopic-original-role`.
  With authorization on, the role of the call is then that user's, and only when the
  caller's own role is one of `--proxy-roles`; from any other role such a call is refused
  (PERMISSION_DENIED). Without authorization the header changes nothing.
- A unary call (and a call streaming out from one request) is authorized from its request
  before the handler runs: a denied call ends with PERMISSION_DENIED and changes nothing.
- The handler runs with its `Call` (the principal; for a stream, a way to end it) in
  `authorize.CALL`.
- A stream ends early, with the reason, when its token expires (UNAUTHENTICATED, "token
  expired") or when a grant it relies on is revoked (PERMISSION_DENIED): it never goes on
  unauthenticated or unauthorized. The client opens a new stream with a fresh token (its
  `auth_token` callable or file is asked again).
- Audit (source/broker/audit.py): one line per Admin call, with the role and the method,
  and one per refused call, with the peer and the reason; never the token.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator

import grpc

from shadowtopic.broker import access_rules
from shadowtopic.broker.audit import audit
from shadowtopic.broker.authorize import CALL, OPEN, ORIGINAL_ROLE, Authorizer, Call
from shadowtopic.broker.rpc import abort_stream
from shadowtopic.core import errors
from shadowtopic.security.authentication import Authenticator, Principal

EXEMPT = ("/grpc.health.v1.Health/", "/grpc.reflection.")
ADMIN = "/shadowtopic.v1.Admin/"


def acting(principal: Principal, metadata, proxy_roles: frozenset[str]) -> Principal:
    """The principal a call acts as: its own, or the original caller's when a proxy role
    forwards it (module doc)."""
    original = next((v for k, v in metadata or () if k == ORIGINAL_ROLE), None)
    if original is None:
        return principal
    if principal.role not in proxy_roles:
        raise errors.PermissionDenied(f"role {principal.role!r} is not a proxy role: it may "
                                      f"not act for role {str(original)[:64]!r}")
    return Principal(str(original), f"{principal.method} via proxy {principal.role}",
                     principal.expires_at)


class Authenticate(grpc.aio.ServerInterceptor):
    def __init__(self, authenticator: Authenticator, authz: Authorizer = OPEN,
                 proxy_roles: frozenset[str] = frozenset()):
        self.authenticator = authenticator
        self.authz = authz
        self.proxy_roles = proxy_roles

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or not self.authenticator.enabled or method.startswith(EXEMPT):
            return handler
        if handler.request_streaming and handler.response_streaming:
            kind, behavior = "stream_stream", handler.stream_stream
        elif handler.request_streaming:
            kind, behavior = "stream_unary", handler.stream_unary
        elif handler.response_streaming:
            kind, behavior = "unary_stream", handler.unary_stream
        else:
            kind, behavior = "unary_unary", handler.unary_unary
        streaming = handler.request_streaming or handler.response_streaming
        authenticator, authz, proxies = self.authenticator, self.authz, self.proxy_roles

        async def admit(request: object, context: grpc.aio.ServicerContext) -> Call:
            """The call, authenticated and (from its request) authorized, or aborted."""
            metadata = context.invocation_metadata()
            try:
                principal = authenticator.authenticate(metadata, context.auth_context())
                if authz.enabled:  # (without authorization whom a call acts for matters not)
                    principal = acting(principal, metadata, proxies)
            except errors.ShadowTopicError as exc:
                audit.warning("refused %s from %s: %s", method, context.peer(), exc.message)
                await abort_stream(context, exc)
                raise  # (abort raised already)
            if method.startswith(ADMIN):
                audit.info("%s by role %r (%s)", method, principal.role, principal.method)
            call = Call(principal, asyncio.current_task() if streaming else None)
            token = CALL.set(call)
            try:
                await access_rules.check(authz, method,
                                         None if handler.request_streaming else request)
            except errors.ShadowTopicError as exc:
                CALL.reset(token)
                await abort_stream(context, exc)
                raise
            return call

        def watch(call: Call) -> asyncio.TimerHandle | None:
            """A stream ends when its token expires; it is rechecked when grants change."""
            authz.opened(call)
            expires_at = call.principal.expires_at
            if call.task is None or expires_at is None:
                return None
            return asyncio.get_running_loop().call_later(
                max(0.0, expires_at - time.time()), call.end, errors.Unauthenticated(
                    "token expired while the stream was open: open it again with a fresh "
                    "token"))

        async def guarded_gen(request: object, context: grpc.aio.ServicerContext
                              ) -> AsyncIterator[object]:
            call = await admit(request, context)
            timer = watch(call)
            try:
                async for item in behavior(request, context):
                    yield item
            except asyncio.CancelledError:
                if call.ended is None:
                    raise
                await abort_stream(context, call.ended)
            finally:
                if timer is not None:
                    timer.cancel()
                authz.closed(call)

        async def guarded(request: object, context: grpc.aio.ServicerContext) -> object:
            call = await admit(request, context)
            timer = watch(call)
            try:
                return await behavior(request, context)
            except asyncio.CancelledError:
                if call.ended is None:
                    raise
                await abort_stream(context, call.ended)
                raise call.ended from None  # (not reached: the abort raised)
            finally:
                if timer is not None:
                    timer.cancel()
                authz.closed(call)

        wrapped = guarded_gen if inspect.isasyncgenfunction(behavior) else guarded
        return handler._replace(**{kind: wrapped})
