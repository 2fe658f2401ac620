"""The broker's authentication: a server interceptor that authenticates every call before
its handler runs (source/security/authentication.py says how), and the audit log.

- A call that does not authenticate ends with UNAUTHENTICATED and its reason (reason
  `Unauthenticated`, the one error table) before the handler sees a byte of it; the handler
  never runs. The health service is exempt (probes carry no credentials), and so is
  reflection when it is on (`--grpc-reflection`).
- The handler runs with the caller's `Principal` in `PRINCIPAL` (a context variable).
- A stream opened with a token that expires ends with UNAUTHENTICATED ("token expired") at
  the expiry: it never goes on unauthenticated. The client opens a new stream with a fresh
  token (its `auth_token` callable or file is asked again).
- Audit (logger `shadowtopic.broker.authenticate.audit`): one line per Admin call, with the
  role and the method, and one per refused call, with the peer and the reason; never the
  token.
"""
from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import AsyncIterator

import grpc

from shadowtopic.broker.rpc import abort_stream
from shadowtopic.core import errors
from shadowtopic.security.authentication import ANONYMOUS, Authenticator, Principal

audit = logging.getLogger(__name__ + ".audit")  # shadowtopic.broker.authenticate.audit

#: the principal of the call being handled (ANONYMOUS when authentication is off)
PRINCIPAL: contextvars.ContextVar[Principal] = contextvars.ContextVar("principal",
                                                                      default=ANONYMOUS)

EXEMPT = ("/grpc.health.v1.Health/", "/grpc.reflection.")
ADMIN = "/shadowtopic.v1.Admin/"


class Authenticate(grpc.aio.ServerInterceptor):
    def __init__(self, authenticator: Authenticator):
        self.authenticator = authenticator

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
        authenticator = self.authenticator

        async def admit(context: grpc.aio.ServicerContext) -> Principal:
            try:
                principal = authenticator.authenticate(context.invocation_metadata(),
                                                       context.auth_context())
            except errors.Unauthenticated as exc:
                audit.warning("refused %s from %s: %s", method, context.peer(), exc.message)
                await abort_stream(context, exc)
                raise  # (abort raised already)
            if method.startswith(ADMIN):
                audit.info("%s by role %r (%s)", method, principal.role, principal.method)
            return principal

        def watch(principal: Principal) -> tuple[asyncio.TimerHandle | None, list[bool]]:
            """A stream ends when its token expires: the handler's task is cancelled."""
            expired = [False]
            if not streaming or principal.expires_at is None:
                return None, expired
            task = asyncio.current_task()
            assert task is not None

            def expire() -> None:
                expired[0] = True
                task.cancel()
            delay = max(0.0, principal.expires_at - time.time())
            return asyncio.get_running_loop().call_later(delay, expire), expired

        def expired_error() -> errors.ShadowTopicError:
            return errors.Unauthenticated("token expired while the stream was open: open it "
                                          "again with a fresh token")

        async def guarded_gen(request: object, context: grpc.aio.ServicerContext
                              ) -> AsyncIterator[object]:
            principal = await admit(context)
            reset = PRINCIPAL.set(principal)
            timer, expired = watch(principal)
            try:
                async for item in behavior(request, context):
                    yield item
            except asyncio.CancelledError:
                if not expired[0]:
                    raise
                await abort_stream(context, expired_error())
            finally:
                if timer is not None:
                    timer.cancel()
                PRINCIPAL.reset(reset)

        async def guarded(request: object, context: grpc.aio.ServicerContext) -> object:
            principal = await admit(context)
            reset = PRINCIPAL.set(principal)
            timer, expired = watch(principal)
            try:
                return await behavior(request, context)
            except asyncio.CancelledError:
                if not expired[0]:
                    raise
                err = expired_error()
                await abort_stream(context, err)
                raise err from None  # (not reached: the abort raised)
            finally:
                if timer is not None:
                    timer.cancel()
                PRINCIPAL.reset(reset)

        wrapped = guarded_gen if inspect.isasyncgenfunction(behavior) else guarded
        return handler._replace(**{kind: wrapped})
