"""Consumer.Connect: the wire adapter of the read engine (source/read/engine.py).

One stream per client carries many handles. Up come `ClientMessage`s, each a batch of
commands for any handles (subscribe, flow, seek, close, ...); down go `ServerMessage`s, each
a batch of frames, where a frame carries entries once for every handle of the stream they
are for, or an event. This module turns commands into engine calls (protobuf becomes domain
types here) and what the engine queues into stream messages; it holds no read logic.

A handle is a reader (an empty subscription name: the read engine) or a consumer of a
durable subscription (the topic's `TopicSubscriptions`, source/subscriptions/). Consecutive
subscribes of one stream message run together, so their new subscriptions are written to
etcd in one batch. A failing handle (topic gone, checksum error, bad command) gets an
`Event.error` frame and stops; a failing ack or nack gets `Event.warning` and the handle goes
on; the stream and its other handles go on either way. A message that does not parse ends
the stream with INVALID_ARGUMENT.
"""
from __future__ import annotations

import asyncio
import itertools
from collections import deque
from typing import Callable

from source import wire
from source.broker.rpc import abort_stream
from source.broker.topics import TopicManager
from source.core import errors
from source.core.errors import error_status, typed
from source.core.message_id import MessageId
from source.core.names import TopicName, check_subscription
from source.pb.v1 import common_pb2, consumer_pb2, consumer_pb2_grpc
from source.read.engine import ReadEngine, Reader
from source.read.positions import EARLIEST, LATEST, PUBLISH_TIME, Start
from source.subscriptions import (EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED, ActiveChanged,
                                  CursorMoved, SubConsumer, TopicSubscriptions)

MAX_ID = (1 << 63) - 1  # ledger and entry ids are int64 inside
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


TYPES = {consumer_pb2.EXCLUSIVE: EXCLUSIVE, consumer_pb2.SHARED: SHARED,
         consumer_pb2.FAILOVER: FAILOVER, consumer_pb2.KEY_SHARED: KEY_SHARED}
_RESERVED = object()  # a handle whose subscribe is running


def ids_from_pb(ids) -> list[MessageId]:
    return [MessageId.checked(i.ledger_id, i.entry_id) for i in ids]


def packed_from_pb(ids) -> list[int]:
    """Acked ids as packed positions (source.cursors.state.pack), range-checked."""
    out = []
    for i in ids:
        if i.ledger_id > MAX_ID or i.entry_id > MAX_ID:
            raise errors.InvalidMessageId(f"message id out of range: {i.ledger_id}:{i.entry_id}")
        out.append((i.ledger_id << 64) + i.entry_id)
    return out


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
        self.errored: set[int] = set()  # handles told an error since the stream last looked

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
        self.errored.add(handle)

    def send_event(self, handle: int, **event) -> None:
        self._put(event_frame(handle, **event))

    def send_notice(self, handle: int, notice: ActiveChanged | CursorMoved) -> None:
        if isinstance(notice, ActiveChanged):
            self.send_event(handle, active_consumer_changed=consumer_pb2.ActiveConsumerChanged(
                is_active=notice.is_active))
        else:
            self.send_event(handle, seek_done=consumer_pb2.SeekDone(
                position=notice.position.to_pb(), clamped=notice.clamped,
                by_admin=notice.by_admin))

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
        self.topics = topics
        self.engine = ReadEngine(topics.view, topics.counters_for, topics.compacted_view)
        self._streams: set[StreamOutbox] = set()

    def shutdown(self) -> None:
        """End every Connect stream (graceful broker stop)."""
        for outbox in list(self._streams):
            outbox.close()

    async def Connect(self, request_iterator, context):
        outbox = StreamOutbox()
        handles: dict[int, object] = {}  # handle -> Reader | (TopicSubscriptions, SubConsumer)
        failure: list[errors.ShadowTopicError] = []  # why the command stream broke, if it did
        self._streams.add(outbox)
        peer = context.peer() if context is not None else ""

        async def one(cmd) -> None:
            try:
                await self._command(cmd, outbox, handles, peer)
            except Exception as exc:  # noqa: BLE001 - in-band, per handle
                kind = cmd.WhichOneof("command")
                if kind in ("ack", "nack", "redeliver", "flow") and isinstance(
                        handles.get(cmd.handle), tuple):
                    outbox.send_event(cmd.handle, warning=error_status(
                        typed(exc, "Connect"), command=kind))
                else:
                    if handles.get(cmd.handle) is _RESERVED:
                        del handles[cmd.handle]
                    outbox.send_error(cmd.handle, typed(exc, "Connect"))

        async def commands() -> None:
            try:
                async for message in request_iterator:
                    await outbox.wait_for_room()
                    cmds = list(message.commands)
                    i = 0
                    while i < len(cmds):
                        j = i
                        while j < len(cmds) and cmds[j].WhichOneof("command") == "subscribe":
                            j += 1
                        if j > i:  # a run of subscribes: together (one etcd batch)
                            await asyncio.gather(*(one(c) for c in cmds[i:j]))
                            i = j
                        else:
                            await one(cmds[i])
                            i += 1
            except Exception as exc:  # noqa: BLE001 - reading the stream failed: it ends
                failure.append(typed(exc, "Connect"))
            finally:
                outbox.close()

        task = asyncio.create_task(commands())
        try:
            while (message := await outbox.take()) is not None:
                if outbox.errored:
                    self._prune(outbox, handles)
                yield message
            if failure:
                await abort_stream(context, failure[0])
        finally:
            self._streams.discard(outbox)
            task.cancel()
            for item in handles.values():
                self._close(item)

    @staticmethod
    def _prune(outbox: StreamOutbox, handles: dict[int, object]) -> None:
        """Forget handles the broker ended (a consumer of a deleted subscription, a reader
        whose topic failed): the handle can be subscribed again, and nothing keeps their
        topic alive. A handle that was only told a command failed stays."""
        for h in outbox.errored:
            item = handles.get(h)
            if isinstance(item, Reader) and item.closed or \
                    isinstance(item, tuple) and item[1].closed:
                del handles[h]
        outbox.errored.clear()

    def _close(self, item) -> None:
        if isinstance(item, Reader):
            self.engine.close(item)
        elif isinstance(item, tuple):
            ts, consumer = item
            ts.close_consumer(consumer)

    def _fan_in(self, cmd: consumer_pb2.ClientCommand, outbox: StreamOutbox,
                handles: dict[int, object]) -> None:
        """One Ack or Flow for `cmd.handle` and every handle in `cmd.also` (a broadcast
        message acknowledged by thousands of subscriptions of a stream): the ids are parsed
        once; a handle that fails hears a warning of its own, the others go on."""
        kind = cmd.WhichOneof("command")
        if kind not in ("ack", "flow"):
            raise errors.InvalidArgument(f"`also` goes with ack or flow, not {kind}")
        ps = packed_from_pb(cmd.ack.ids) if kind == "ack" else []
        cumulative, permits = cmd.ack.cumulative, cmd.flow.permits
        if kind == "ack" and ps:  # subscriptions by topic, each topic's acks in one go
            by_topic: dict[TopicSubscriptions, list[SubConsumer]] = {}
            for h in itertools.chain((cmd.handle,), cmd.also):
                item = handles.get(h)
                if isinstance(item, tuple):
                    by_topic.setdefault(item[0], []).append(item[1])
                elif not isinstance(item, Reader):  # (readers keep no cursor: ignored)
                    outbox.send_event(h, warning=error_status(
                        errors.InvalidArgument(f"unknown handle {h}"), command=kind))
            for ts, consumers in by_topic.items():
                for c, exc in ts.ack_many(consumers, ps, cumulative):
                    outbox.send_event(c.handle, warning=error_status(typed(exc, "Connect"),
                                                                     command=kind))
            return
        for h in itertools.chain((cmd.handle,), cmd.also):
            item = handles.get(h)
            try:
                if isinstance(item, tuple):
                    if kind == "ack":
                        item[0].ack_packed(item[1], ps, cumulative)
                    else:
                        item[0].flow(item[1], permits)
                elif isinstance(item, Reader):
                    if kind == "flow":
                        self.engine.flow(item, permits)
                elif kind == "ack":  # (a flow may cross a close: nothing to do then)
                    raise errors.InvalidArgument(f"unknown handle {h}")
            except Exception as exc:  # noqa: BLE001 - in-band, per handle
                outbox.send_event(h, warning=error_status(typed(exc, "Connect"), command=kind))

    async def _command(self, cmd: consumer_pb2.ClientCommand, outbox: StreamOutbox,
                       handles: dict[int, object], peer: str) -> None:
        if cmd.also:
            self._fan_in(cmd, outbox, handles)
            return
        kind = cmd.WhichOneof("command")
        handle = cmd.handle
        item = handles.get(handle)
        if kind == "flow":
            if isinstance(item, Reader):  # a flow may cross a close: nothing to do then
                self.engine.flow(item, cmd.flow.permits)
            elif isinstance(item, tuple):
                item[0].flow(item[1], cmd.flow.permits)
        elif kind == "subscribe":
            ended = isinstance(item, Reader) and item.closed or \
                isinstance(item, tuple) and item[1].closed
            if item is not None and not ended:
                raise errors.InvalidArgument(f"handle {handle} is already in use")
            handles[handle] = _RESERVED
            sub = cmd.subscribe
            topic = TopicName.parse(sub.topic)
            if sub.subscription:
                await self._subscribe(cmd, topic, outbox, handles, peer)
                return
            start = start_from_pb(sub.start, sub.start_inclusive)
            await self.topics.topic(topic, fresh=True)  # never an incarnation deleted since
            reader, last = await self.engine.open(outbox, handle, topic, start,
                                                  compacted=sub.read_compacted)
            handles[handle] = reader
            outbox.send_event(handle, subscribed=consumer_pb2.Subscribed(
                topic=str(topic), last_message_id=last.to_pb() if last else None))
        elif kind == "close":
            item = handles.pop(handle, None)
            self._close(item)
            outbox.send_event(handle, closed=consumer_pb2.HandleClosed())
        elif kind in ("seek", "ack", "nack", "redeliver", "unsubscribe"):
            if isinstance(item, tuple):
                await self._consumer_command(kind, cmd, outbox, handles, *item)
                return
            if item is None or item is _RESERVED or item.closed:
                raise errors.InvalidArgument(f"unknown handle {handle}")
            if kind == "seek":
                position = await self.engine.seek(item, start_from_pb(cmd.seek.position, True))
                item.permits = 0  # the client drops what it holds and flows afresh
                outbox.send_event(handle, seek_done=consumer_pb2.SeekDone(
                    position=position.to_pb()))
            # readers keep no cursor: acks and the like are accepted and ignored
        else:
            raise errors.InvalidArgument("empty client command")

    async def _subscribe(self, cmd, topic: TopicName, outbox: StreamOutbox,
                         handles: dict[int, object], peer: str) -> None:
        sub = cmd.subscribe
        check_subscription(sub.subscription)
        type_ = TYPES.get(sub.type)
        if type_ is None:
            raise errors.InvalidArgument(f"unknown subscription type {sub.type}")
        start = (start_from_pb(sub.start, sub.start_inclusive) if sub.HasField("start")
                 else Start(LATEST))  # Pulsar's default initial position
        t = await self.topics.topic(topic, fresh=True)  # never an incarnation deleted since
        ts: TopicSubscriptions = t.subscriptions
        view = t.ledger
        if sub.read_compacted:
            view = await self.topics.compacted_view(topic)
            ts.use_compacted(view)
        consumer, created, position = await ts.subscribe(
            outbox, cmd.handle, sub.subscription, type_, start, sub.consumer_name,
            sub.priority, peer, read_compacted=sub.read_compacted)
        if handles.get(cmd.handle) is not _RESERVED:  # the stream ended meanwhile
            ts.close_consumer(consumer)
            return
        handles[cmd.handle] = (ts, consumer)
        last = view.last_confirmed()
        outbox.send_event(cmd.handle, subscribed=consumer_pb2.Subscribed(
            topic=str(topic), last_message_id=last.to_pb() if last else None,
            position=position.to_pb(), created=created))

    async def _consumer_command(self, kind: str, cmd, outbox: StreamOutbox,
                                handles: dict[int, object], ts: TopicSubscriptions,
                                consumer: SubConsumer) -> None:
        if kind == "ack":
            ts.ack_packed(consumer, packed_from_pb(cmd.ack.ids), cmd.ack.cumulative)
        elif kind == "nack":
            ts.nack(consumer, ids_from_pb(cmd.nack.ids), cmd.nack.delay_ms)
        elif kind == "redeliver":
            ts.redeliver(consumer)
        elif kind == "seek":
            await ts.seek(consumer, start_from_pb(cmd.seek.position, True))
            # the consumer hears where it landed as a seek_done (CursorMoved) notice
        elif kind == "unsubscribe":
            await ts.unsubscribe(consumer)
            handles.pop(cmd.handle, None)
            outbox.send_event(cmd.handle, closed=consumer_pb2.HandleClosed())
