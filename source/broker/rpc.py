"""Service-side error handling, so that every failure a client sees is typed.

- `unary`: a handler's ShadowTopicError becomes a gRPC status with its reason in trailing
  metadata (the one table in shadowtopic.core.errors); any other exception becomes what
  `errors.typed` says (a request that does not parse is
  `InvalidArgument`, anything else `Internal`, logged); messages are cut by `errors.bounded`.
- `abort_stream` ends a stream with a typed status (per-item errors inside a stream are
  `errors.error_status`).
- `RejectMalformed`: a server interceptor that answers a unary request whose bytes do not
  parse with INVALID_ARGUMENT and its reason (gRPC's own answer is UNKNOWN plus a logged
  traceback). Streamed requests are parsed while the handler reads them, which reports
  them itself (`typed`).
"""
from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator

import grpc

from shadowtopic.core import errors
from shadowtopic.core.errors import bounded, typed

log = logging.getLogger(__name__)


async def abort_stream(context: grpc.aio.ServicerContext, exc: errors.ShadowTopicError
                       ) -> None:
    code, details, md = errors.to_status(exc)
    context.set_trailing_metadata(md)
    await context.abort(code, bounded(details))


def unary(handler):
    @functools.wraps(handler)
    async def wrapper(self, request, context: grpc.aio.ServicerContext):
        try:
            return await handler(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - the server keeps serving others
            await abort_stream(context, typed(exc, handler.__name__))
    return wrapper


class _Malformed:
    """What a request that does not parse is deserialized to."""

    def __init__(self, exc: Exception):
        self.error = errors.InvalidArgument(f"malformed request: {exc}")


class RejectMalformed(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        parse = handler.request_deserializer
        kind = "unary_stream" if handler.response_streaming else "unary_unary"
        behavior = handler.unary_stream if handler.response_streaming else handler.unary_unary

        def deserialize(data: bytes) -> object:
            try:
                return parse(data)
            except Exception as exc:  # noqa: BLE001 - DecodeError and protobuf's kin
                return _Malformed(exc)

        async def checked_stream(request: object, context: grpc.aio.ServicerContext
                                 ) -> AsyncIterator[object]:
            if isinstance(request, _Malformed):
                await abort_stream(context, request.error)
            async for item in behavior(request, context):
                yield item

        async def checked_unary(request: object, context: grpc.aio.ServicerContext) -> object:
            if isinstance(request, _Malformed):
                await abort_stream(context, request.error)
            return await behavior(request, context)

        checked = checked_stream if inspect.isasyncgenfunction(behavior) else checked_unary
        return handler._replace(request_deserializer=deserialize, **{kind: checked})
