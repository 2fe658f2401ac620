"""The HTTP endpoint a process serves beside its gRPC port: Prometheus text and health.

    GET /metrics   Prometheus text format 0.0.4 (gzip when the scraper accepts it)
    GET /healthz   200 "ok": the process is alive (its event loop answers)
    GET /readyz    200 "ready", or 503 "not ready: <reason>; <reason>" (one line)

A small asyncio HTTP/1.0-style server in the process's own event loop: one request per
connection (`Connection: close`), GET and HEAD only, the request head bounded in size and
time. The registry is collected on the loop, where the state the collectors read lives (no
locks, no dict changing under a thread); the text is then formatted and compressed in a
thread, so a large scrape holds the loop only while the numbers are read. Two series tell
what the previous scrape cost: `shadowtopic_scrape_collect_seconds` (time the loop was
held) and `shadowtopic_scrape_bytes` (its uncompressed size).

Port (each role's --metrics-port): a fixed port (refused at start when taken), 0 for any
free one, -1 (`OFF`) for none, or by default the role's gRPC port + 1000 (`default_port`),
which falls back to a free port when taken (`fallback`). Binds the role's --host
(127.0.0.1 by default).
"""
from __future__ import annotations

import asyncio
import gzip
import logging
import os
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, exposition, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

log = logging.getLogger("shadowtopic.http")

#: the default HTTP port of a role: its gRPC port plus this
PORT_OFFSET = 1000
#: --metrics-port value that turns the endpoint off
OFF = -1
HEAD_LIMIT = 16 << 10   # bytes of request line and headers
HEAD_TIMEOUT = 10.0     # seconds to send them

#: the text format every Prometheus reads (newer prometheus-client say 1.0.0 by default)
CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST)
#: () -> the reasons the process is not ready ([]: ready)
Readiness = Callable[[], list[str]]


def default_port(grpc_port: int) -> int:
    """The role's default HTTP port (0, any free port, when past the last port)."""
    port = grpc_port + PORT_OFFSET
    return port if 0 < port <= 65535 else 0


class _Collected:
    """Metric families already read, in the shape `generate_latest` formats."""

    def __init__(self, families: list[Metric]):
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def render(families: list[Metric]) -> bytes:
    return generate_latest(_Collected(families))


class _ScrapeCost:
    """The previous scrape's cost, as series of the next one."""

    def __init__(self) -> None:
        self.collect_s = 0.0
        self.size = 0

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily("shadowtopic_scrape_collect_seconds",
                                "time the previous scrape held the event loop",
                                value=self.collect_s)
        yield GaugeMetricFamily("shadowtopic_scrape_bytes",
                                "uncompressed size of the previous scrape", value=self.size)


class HttpEndpoint:
    """`/metrics` from `registry`, `/healthz`, `/readyz` from `ready`."""

    def __init__(self, registry: CollectorRegistry, ready: Readiness, host: str, port: int,
                 fallback: bool = False):
        self.registry = registry
        self.ready = ready
        self.host = host
        self.port = port
        self.fallback = fallback   # the port was not asked for: a free one when it is taken
        self._server: asyncio.base_events.Server | None = None
        self.cost = _ScrapeCost()
        registry.register(self.cost)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._handle, self.host, self.port,
                                                      reuse_address=True)
        except OSError as exc:
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            if not self.fallback:
                raise OSError(f"cannot bind the metrics port {self.host}:{self.port}: "
                              f"{why}") from None
            log.warning("metrics port %s:%d cannot be bound (%s); using a free port",
                        self.host, self.port, why)
            self._server = await asyncio.start_server(self._handle, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def scrape(self, gzipped: bool = False) -> bytes:
        started = time.perf_counter()
        families = list(self.registry.collect())  # on the loop: the state is read here
        self.cost.collect_s = time.perf_counter() - started
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(None, render, families)
        self.cost.size = len(body)
        return await loop.run_in_executor(None, gzip.compress, body, 6) if gzipped else body

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                      ) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError):
            writer.close()
            return
        try:
            if len(head) > HEAD_LIMIT:
                await self._answer(writer, 431, b"request head too large\n")
                return
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split()
            if len(parts) != 3:
                await self._answer(writer, 400, b"bad request line\n")
                return
            method, target = parts[0], parts[1]
            headers = {k.strip().lower(): v.strip() for k, _, v in
                       (h.partition(":") for h in lines[1:] if h)}
            if method not in ("GET", "HEAD"):
                await self._answer(writer, 405, b"only GET and HEAD\n")
                return
            path = target.split("?", 1)[0]
            body_too = method == "GET"
            if path == "/metrics":
                gz = "gzip" in headers.get("accept-encoding", "")
                body = await self.scrape(gz)
                extra = {"Content-Encoding": "gzip"} if gz else {}
                await self._answer(writer, 200, body, CONTENT_TYPE, extra, body_too)
            elif path == "/healthz":
                await self._answer(writer, 200, b"ok\n", body=body_too)
            elif path == "/readyz":
                reasons = self.ready()
                if reasons:
                    text = f"not ready: {'; '.join(reasons)}\n".encode()
                    await self._answer(writer, 503, text, body=body_too)
                else:
                    await self._answer(writer, 200, b"ready\n", body=body_too)
            else:
                await self._answer(writer, 404, b"not found: try /metrics, /healthz, /readyz\n",
                                   body=body_too)
        except ConnectionError:
            pass
        except Exception:  # noqa: BLE001 - a failed scrape answers 500, the process goes on
            log.exception("HTTP request failed")
            try:
                await self._answer(writer, 500, b"internal error\n")
            except ConnectionError:
                pass
        finally:
            writer.close()

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, status: int, payload: bytes,
                      ctype: str = "text/plain; charset=utf-8",
                      extra: dict[str, str] | None = None, body: bool = True) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  431: "Request Header Fields Too Large", 500: "Internal Server Error",
                  503: "Service Unavailable"}[status]
        head = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {ctype}",
                f"Content-Length: {len(payload)}", "Connection: close"]
        head += [f"{k}: {v}" for k, v in (extra or {}).items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        if body:
            writer.write(payload)
        await writer.drain()
