"""Memory a broker holds for its clients, under one cap (F12), and the gRPC server options
that close dead and half-open connections.

What is counted (`ClientMemory.used`), all clients together:

- a produce request, from when the broker reads it until its task ends (stored or refused):
  PRODUCE_FACTOR times its size (the bytes gRPC hands over, the parsed view, the messages cut
  from it for the write);
- a client message of a Consumer stream while its commands are processed (its size);
- each open Produce or Connect stream: STREAM_BYTES (gRPC's buffers and the stream's state);
- the frames queued in a Consumer stream's outbox, and the message gRPC is writing to it
  (IN_FLIGHT_FACTOR times its size: the broker's bytes, gRPC's copy and the frames it was
  joined from, which the allocator gives back only at the next trim; held until the
  client's flow-control window takes it).

The cap is `--client-memory-bytes` (default DEFAULT_BYTES, 1 GiB). At the cap new work is
refused with RESOURCE_EXHAUSTED, reason `BrokerMemoryFull` (retriable): a produce request
gets it in its receipt (nothing of it is kept), a subscribe gets it as the handle's error.
Outboxes queue no more frames once QUEUE_SHARE of the cap is held (their readers and
consumers wait, as when their own outbox is full) until memory is released: the rest of the
cap is for work already under way (a read that passed the check cutting its frames, queued
frames becoming the message being written). With these counts the broker's RSS stayed
under its baseline plus the cap with 300 streams that do not read and 200 refused 1 MiB
requests (tests/test_integration/test_memory_limits.py); counting the in-flight message
twice and queueing up to the whole cap had it 256 MiB over a 256 MiB cap.

A Consumer stream that has frames queued or in flight and has taken none of them for
`--client-stall-seconds` (default DEFAULT_STALL_SECONDS) is cut: the broker cancels its
pending write and ends the call with RESOURCE_EXHAUSTED, reason `SlowConsumer` (the client
reads it after what gRPC had already buffered for it), and logs why (the peer, the bytes it
held).

Nothing keeps a request once it is done: the services read their streams with `reader`
(gRPC's request iterator keeps the last request it gave until the next one arrives: a
refused 64 MiB request stayed for as long as its stream did).

Freed memory goes back to the system: past TRIM_BYTES released since the last time (or
anything released, TRIM_IDLE_SECONDS after the last time), the sweeper (every SWEEP_SECONDS)
asks glibc to return free pages (`malloc_trim`), so a refused 64 MiB request does not stay
in the heap. (glibc's mmap threshold is left dynamic: fixing it at 1 MiB mapped and
unmapped every large server message and cost 5% of consume throughput, bench/ab.py --only
consume, 3 pairs.)

`server_options`: keepalive pings every `keepalive_seconds` (also on connections without
calls; a peer that does not answer within KEEPALIVE_TIMEOUT_MS is closed), clients may ping
every MIN_CLIENT_PING_MS without data and no ping is ever held against them (no GOAWAY
"too_many_pings": the client's keepalive must never cut a stream), and a connection that
has not sent its HTTP/2 preface and settings within `handshake_seconds` (a half-open TCP
connection) is closed.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, TypeVar

import grpc

from shadowtopic.core import errors

R = TypeVar("R")  # a stream's request

log = logging.getLogger(__name__)

DEFAULT_BYTES = 1 << 30
DEFAULT_STALL_SECONDS = 30.0
DEFAULT_HANDSHAKE_SECONDS = 10.0
DEFAULT_KEEPALIVE_SECONDS = 30.0
KEEPALIVE_TIMEOUT_MS = 10_000
MIN_CLIENT_PING_MS = 5_000  # half the client's keepalive (source/client/connection.py)
PRODUCE_FACTOR = 3
STREAM_BYTES = 64 << 10
IN_FLIGHT_FACTOR = 3
QUEUE_SHARE = 0.75
SWEEP_SECONDS = 0.5
TRIM_BYTES = 32 << 20
TRIM_IDLE_SECONDS = 5.0


class Stream(Protocol):
    """A client stream the sweeper watches (the Consumer service's outbox)."""

    def stalled_since(self) -> float | None:
        """When the stream last took a message while it had data waiting (None: it waits
        for nothing)."""

    def cut(self, reason: errors.ShadowTopicError) -> None:
        """End the stream now."""


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


class ClientMemory:
    """The broker's one budget for client memory (the module docstring says what counts)."""

    def __init__(self, limit: int = DEFAULT_BYTES,
                 stall_seconds: float = DEFAULT_STALL_SECONDS):
        self.limit = limit
        self.stall_seconds = stall_seconds
        self.used = 0
        self.refused = 0      # requests refused at the cap
        self.cut_streams = 0  # streams cut for not reading
        self._released = 0    # since the last trim
        self._trimmed = 0.0   # when the last trim ran (time.monotonic)
        self._room: dict[Callable[[], None], None] = {}
        self._streams: dict[Stream, None] = {}
        self._task: asyncio.Task | None = None
        self._libc = _libc()

    def has_room(self) -> bool:
        """Whether new frames may be queued: while what is held is under QUEUE_SHARE of the
        cap (the rest is for work already under way: the frames a read that passed this
        check is cutting, a queued message becoming the one gRPC writes)."""
        return self.used < self.limit * QUEUE_SHARE

    def admit(self, size: int, what: str) -> None:
        """Count `size` bytes for new work, or raise `BrokerMemoryFull` when they do not fit
        under the cap (nothing is counted then)."""
        if self.used + size > self.limit:
            self.refused += 1
            raise errors.BrokerMemoryFull(
                f"{what} refused: the broker holds {self.used} bytes for clients, its limit "
                f"is {self.limit} (--client-memory-bytes); retry later")
        self.used += size

    def take(self, size: int) -> None:
        """Count `size` bytes that are held whatever the cap (frames already read)."""
        self.used += size

    def release(self, size: int) -> None:
        self.used -= size
        self._released += size
        if self._room and self.has_room():
            callbacks, self._room = self._room, {}
            for callback in callbacks:
                callback()

    def call_when_room(self, callback: Callable[[], None]) -> None:
        """Call `callback` once, when the broker is under its cap again."""
        self._room[callback] = None

    def watch(self, stream: Stream) -> None:
        self._streams[stream] = None

    def unwatch(self, stream: Stream) -> None:
        self._streams.pop(stream, None)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sweep(),
                                                            name="client-memory")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                self.sweep(time.monotonic())
                now = time.monotonic()
                if self._libc is not None and (
                        self._released >= TRIM_BYTES
                        or self._released and now - self._trimmed >= TRIM_IDLE_SECONDS):
                    self._released, self._trimmed = 0, now
                    await asyncio.get_running_loop().run_in_executor(None, self._trim)
            except Exception:  # noqa: BLE001 - the next sweep tries again
                log.exception("client memory sweep failed")

    def sweep(self, now: float) -> list[Stream]:
        """Cut every stream stalled for longer than `stall_seconds`; returns them."""
        cut = []
        for stream in list(self._streams):
            since = stream.stalled_since()
            if since is not None and now - since > self.stall_seconds:
                self.unwatch(stream)
                stream.cut(errors.SlowConsumer(
                    f"the stream took no data for {now - since:.0f} s "
                    f"(--client-stall-seconds {self.stall_seconds:g}): cut"))
                self.cut_streams += 1
                cut.append(stream)
        return cut

    def _trim(self) -> None:
        if hasattr(self._libc, "malloc_trim"):
            self._libc.malloc_trim(0)


def reader(request_iterator: AsyncIterator[R], context: grpc.aio.ServicerContext | None
           ) -> Callable[[], Awaitable[R | None]]:
    """A function that returns a stream's next request, or None at its end: read from the
    gRPC `context` directly when there is one (nothing kept between two requests), else from
    `request_iterator` (tests that drive the services with plain iterators pass None)."""
    if context is not None:
        async def read():
            data = await context.read()
            return None if data is grpc.aio.EOF else data
        return read
    it = request_iterator.__aiter__()

    async def step():
        try:
            return await it.__anext__()
        except StopAsyncIteration:
            return None
    return step


def server_options(handshake_seconds: float = DEFAULT_HANDSHAKE_SECONDS,
                   keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS
                   ) -> list[tuple[str, int]]:
    """gRPC server channel arguments that close dead and half-open connections."""
    return [("grpc.server_handshake_timeout_ms", max(1, int(handshake_seconds * 1000))),
            ("grpc.keepalive_time_ms", max(1, int(keepalive_seconds * 1000))),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            # any unanswered ping, not only keepalive's (gRPC's default is 60 s)
            ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_CLIENT_PING_MS),
            # 0: pings are never strikes. With 2, a client's keepalive (every 10 s, source/
            # client/connection.py) on a long idle stream (WatchCompaction) still got GOAWAY
            # "too_many_pings" now and then, though above the 5 s minimum (make test, F15)
            ("grpc.http2.max_ping_strikes", 0)]
