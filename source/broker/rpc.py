"""Service-side error handling: every handler's ShadowTopicError becomes a gRPC status with
its reason in trailing metadata (the table in source.core.errors); anything else becomes
INTERNAL and is logged. Streams report per-item errors in-band with `error_status`."""
from __future__ import annotations

import functools
import logging

import grpc

from source.core import errors
from source.pb.v1 import common_pb2

log = logging.getLogger(__name__)


def unary(handler):
    @functools.wraps(handler)
    async def wrapper(self, request, context: grpc.aio.ServicerContext):
        try:
            return await handler(self, request, context)
        except errors.ShadowTopicError as exc:
            code, details, md = errors.to_status(exc)
            context.set_trailing_metadata(md)
            await context.abort(code, details)
        except Exception as exc:  # noqa: BLE001 - the server keeps serving others
            if isinstance(exc, grpc.aio.AbortError):
                raise
            log.exception("%s failed", handler.__name__)
            context.set_trailing_metadata(((errors.REASON_KEY, "Internal"),))
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc}")
    return wrapper


def error_status(exc: BaseException) -> common_pb2.ErrorStatus:
    if not isinstance(exc, errors.ShadowTopicError):
        log.error("unexpected error", exc_info=exc)
        exc = errors.Internal(f"internal error: {exc}")
    return common_pb2.ErrorStatus(code=exc.code.name, reason=exc.reason, message=exc.message)


async def abort_stream(context: grpc.aio.ServicerContext, exc: errors.ShadowTopicError):
    code, details, md = errors.to_status(exc)
    context.set_trailing_metadata(md)
    await context.abort(code, details)
