"""Consumer.Connect: the wire adapter of the read engine (source/read/engine.py).

One stream per client carries many handles. Up come `ClientMessage`s, each a batch of
commands for any handles (subscribe, flow, seek, close, ...); down go `ServerMessage`s, each
a batch of frames, where a frame carries entries once for every handle of the stream they
are for, or an event. This module turns commands into engine calls (protobuf becomes domain
types here) and what the engine queues into stream messages; it holds no read logic.

Readers are non-durable (an empty subscription name). Durable subscriptions arrive with the
subscriptions issue and are answered with an in-band `Unimplemented` error until then. A
failing handle (topic gone, checksum error, bad command) gets an `Event.error` frame and
stops; the stream and its other handles go on. A message that does not parse ends the
stream with INVALID_ARGUMENT.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable

from source import wire
from source.broker.rpc import abort_stream, error_status, typed
from source.broker.topics import TopicManager
from source.core import errors
from source.core.message_id import MessageId
from source.core.names import TopicName, check_subscription
from source.pb.v1 import common_pb2, consumer_pb2, consumer_pb2_grpc
from source.read.engine import ReadEngine, Reader
from source.read.positions import EARLIEST, LATEST, PUBLISH_TIME, Start

OUTBOX_BYTES = 8 << 20      # a stream's queued frames; past this its readers wait
MESSAGE_BYTES = 4 << 20     # frames per ServerMessage, at most about this many bytes


def start_from_pb(pb: common_pb2.StartPosition, inclusive: bool) -> Start:
    kind = pb.WhichOneof("position")
    if kind == "latest":
        return Start(LATEST, inclusive=inclusive)
    if kind == "message_id":
        return Start.at(MessageId.checked(pb.message_id.ledger_id, pb.message_id.entry_id),
                        inclusive)
    if kind == "publish_time":
        return Start(PUBLISH_TIME, publish_ms=pb.publish_time)
    return Start(EARLIEST)


def event_frame(handle: int, **event) -> bytes:
    return consumer_pb2.ServerFrame(handles=[handle],
                                    event=consumer_pb2.Event(**event)).SerializeToString()


class StreamOutbox:
    """The frames waiting to go down one stream (the engine's `Outbox`), bounded in bytes."""

    def __init__(self, limit: int = OUTBOX_BYTES):
        self._frames: deque[bytes] = deque()
        self._bytes = 0
        self._limit = limit
        self._ready = asyncio.Event()
        self._room_callbacks: dict[Callable[[], None], None] = {}
        self._closed = False

    def has_room(self) -> bool:
        return self._bytes < self._limit

    async def wait_for_room(self) -> None:
        """Until the queued frames fit (a client that sends commands but reads nothing
        stops being served, instead of growing this queue with their answers)."""
        while not self.has_room() and not self._closed:
            room = asyncio.Event()
            self.call_when_room(room.set)
            await room.wait()

    def call_when_room(self, callback: Callable[[], None]) -> None:
        self._room_callbacks[callback] = None

    def send_entries(self, handles: list[int], encoded: list[bytes], size: int) -> None:
        self._put(wire.entries_frame(handles, encoded))

    def send_error(self, handle: int, error: errors.ShadowTopicError) -> None:
        self._put(event_frame(handle, error=error_status(error)))

    def send_event(self, handle: int, **event) -> None:
        self._put(event_frame(handle, **event))

    def _put(self, frame: bytes) -> None:
        self._frames.append(frame)
        self._bytes += len(frame)
        self._ready.set()

    def close(self) -> None:
        """No more frames will be queued: `take` ends once the queued ones are out."""
        self._closed = True
        self._ready.set()
        callbacks, self._room_callbacks = self._room_callbacks, {}
        for callback in callbacks:
            callback()

    async def take(self) -> bytes | None:
        """The next ServerMessage (every queued frame, up to MESSAGE_BYTES), or None."""
        while not self._frames:
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        batch, size = [], 0
        while self._frames and (not batch or size + len(self._frames[0]) <= MESSAGE_BYTES):
            frame = self._frames.popleft()
            batch.append(frame)
            size += len(frame)
        self._bytes -= size
        if self._room_callbacks and self._bytes < self._limit // 2:
            callbacks, self._room_callbacks = self._room_callbacks, {}
            for callback in callbacks:
                callback()
        return wire.server_message(batch)


class ConsumerService(consumer_pb2_grpc.ConsumerServicer):
    def __init__(self, topics: TopicManager):
        self.engine = ReadEngine(topics.view, topics.counters_for)
        self._streams: set[StreamOutbox] = set()

    def shutdown(self) -> None:
        """End every Connect stream (graceful broker stop)."""
        for outbox in list(self._streams):
            outbox.close()

    async def Connect(self, request_iterator, context):
        outbox = StreamOutbox()
        readers: dict[int, Reader] = {}
        failure: list[errors.ShadowTopicError] = []  # why the command stream broke, if it did
        self._streams.add(outbox)

        async def commands() -> None:
            try:
                async for message in request_iterator:
                    await outbox.wait_for_room()
                    for cmd in message.commands:
                        try:
                            await self._command(cmd, outbox, readers)
                        except Exception as exc:  # noqa: BLE001 - in-band, per handle
                            outbox.send_error(cmd.handle, typed(exc, "Connect"))
            except Exception as exc:  # noqa: BLE001 - reading the stream failed: it ends
                failure.append(typed(exc, "Connect"))
            finally:
                outbox.close()

        task = asyncio.create_task(commands())
        try:
            while (message := await outbox.take()) is not None:
                yield message
            if failure:
                await abort_stream(context, failure[0])
        finally:
            self._streams.discard(outbox)
            task.cancel()
            for reader in readers.values():
                self.engine.close(reader)

    async def _command(self, cmd: consumer_pb2.ClientCommand, outbox: StreamOutbox,
                       readers: dict[int, Reader]) -> None:
        kind = cmd.WhichOneof("command")
        handle = cmd.handle
        if kind == "flow":
            reader = readers.get(handle)
            if reader is not None:  # a flow may cross a close: nothing to do then
                self.engine.flow(reader, cmd.flow.permits)
        elif kind == "subscribe":
            old = readers.get(handle)
            if old is not None and not old.closed:
                raise errors.InvalidArgument(f"handle {handle} is already in use")
            sub = cmd.subscribe
            topic = TopicName.parse(sub.topic)
            if sub.subscription:
                check_subscription(sub.subscription)
                raise errors.Unimplemented("durable subscriptions are not available yet; use "
                                           "a reader (empty subscription name)")
            start = start_from_pb(sub.start, sub.start_inclusive)
            reader, last = await self.engine.open(outbox, handle, topic, start)
            readers[handle] = reader
            outbox.send_event(handle, subscribed=consumer_pb2.Subscribed(
                topic=str(topic), last_message_id=last.to_pb() if last else None))
        elif kind == "close":
            reader = readers.pop(handle, None)
            if reader is not None:
                self.engine.close(reader)
            outbox.send_event(handle, closed=consumer_pb2.HandleClosed())
        elif kind in ("seek", "ack", "nack", "redeliver", "unsubscribe"):
            reader = readers.get(handle)
            if reader is None or reader.closed:
                raise errors.InvalidArgument(f"unknown handle {handle}")
            if kind == "seek":
                position = await self.engine.seek(reader, start_from_pb(cmd.seek.position, True))
                outbox.send_event(handle, seek_done=consumer_pb2.SeekDone(
                    position=position.to_pb()))
            # readers keep no cursor: acks and the like are accepted and ignored
        else:
            raise errors.InvalidArgument("empty client command")
