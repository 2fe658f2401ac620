"""gRPC request series of a server: a `grpc.aio` server interceptor.

    grpc_server_handled_total{method, code}     calls finished, by status code
    grpc_server_handling_seconds{method}        time from the call's start to its end
                                                (a stream: its whole life)

`method` is the full method name (`/shadowtopic.v1.Admin/CreateTopic`); `code` the gRPC
status name (OK, NOT_FOUND, ...): the one the handler aborted with, CANCELLED for a call
the client gave up, UNKNOWN for an exception. Only methods the server has are counted (an
unknown method name is not a label value). Put it first in the interceptor list, so calls
refused by the interceptors after it are counted too.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

BUCKETS = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60,
           300, float("inf"))
KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def _code(context: grpc.aio.ServicerContext, exc: BaseException | None) -> str:
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 - an older grpc without context.code()
        code = None
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int):
        for c in grpc.StatusCode:
            if c.value[0] == code:
                return c.name
    if exc is None:
        return "OK"
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return "CANCELLED"
    return "UNKNOWN"


class RpcMetrics(grpc.aio.ServerInterceptor):
    def __init__(self, registry: CollectorRegistry):
        self.handled = Counter("grpc_server_handled", "gRPC calls finished, by status code",
                               ["method", "code"], registry=registry)
        self.seconds = Histogram("grpc_server_handling_seconds",
                                 "gRPC call duration (a stream: its whole life)", ["method"],
                                 buckets=BUCKETS, registry=registry)

    def _done(self, method: str, started: float, context, exc: BaseException | None) -> None:
        self.seconds.labels(method).observe(time.perf_counter() - started)
        self.handled.labels(method, _code(context, exc)).inc()

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        kind = next(k for k in KINDS if getattr(handler, k) is not None)
        behavior = getattr(handler, kind)
        done = self._done

        measured: Callable[..., object]
        if inspect.isasyncgenfunction(behavior):
            async def measured_stream(request, context):
                started, exc = time.perf_counter(), None
                try:
                    async for item in behavior(request, context):
                        yield item
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    done(method, started, context, exc)
            measured = measured_stream
        elif inspect.iscoroutinefunction(behavior):
            async def measured_unary(request, context):
                started, exc = time.perf_counter(), None
                try:
                    return await behavior(request, context)
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    done(method, started, context, exc)
            measured = measured_unary
        else:  # a plain function: left as it is (none of ours)
            return handler
        return handler._replace(**{kind: measured})
