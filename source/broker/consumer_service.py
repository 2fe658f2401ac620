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

Acks (consumer.proto's `Ack`): ids and inclusive ranges of one ledger's entries
(`acks_from_pb`), every one checked before any is applied, so a bad one (past MAX_ID, first
after last, longer than MAX_ACK_RANGE) refuses the command with a warning and acknowledges
nothing. A range is applied as one: one insertion into the cursor's acknowledged ranges, and
only the held entries it covers looked up (subscription.py). An Ack with a `request_id` is
answered once applied AND its cursor written (`TopicSubscriptions.persist_acks`, concurrent
ones sharing a write) with `Event.ack_receipt`, or refused with the warning, its details
carrying the request id; that write runs in a task of the stream (`StreamOutbox.tasks`), so
the stream's other commands do not wait for it.

Memory (source/broker/memory.py): the frames a stream has queued and the message gRPC is
writing to it count in the broker's `ClientMemory`; at its cap outboxes take no more frames
and subscribes are refused (`BrokerMemoryFull`), and a stream that takes nothing for the
broker's stall bound is cut. A client message arrives as bytes and is processed in slices:
one of more than SLICE_BYTES is parsed a piece at a time (cut at its fields), and the loop
is given back every SLICE_COMMANDS commands, so a message of millions of tiny commands
(64 MiB of Flows: 8 million) never holds the event loop for more than a few ms.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TypeAlias

import grpc

from shadowtopic import wire
from shadowtopic.broker.authorize import OPEN, Authorizer
from shadowtopic.broker.memory import IN_FLIGHT_FACTOR, STREAM_BYTES, ClientMemory, reader
from shadowtopic.broker.rpc import abort_stream
from shadowtopic.broker.topics import TopicManager
from shadowtopic.core import errors
from shadowtopic.core.errors import error_status, typed
from shadowtopic.core.message_id import MAX_ACK_RANGE, MessageId
from shadowtopic.core.names import TopicName, check_subscription
from shadowtopic.core.permissions import Action
from shadowtopic.ledger.view import LedgerView
from shadowtopic.pb.v1 import common_pb2, consumer_pb2, consumer_pb2_grpc
from shadowtopic.read.engine import ReadEngine, Reader
from shadowtopic.read.positions import EARLIEST, LATEST, PUBLISH_TIME, Start
from shadowtopic.subscriptions import (
    EXCLUSIVE,
    FAILOVER,
    KEY_SHARED,
    SHARED,
    ActiveChanged,
    CursorMoved,
    SubConsumer,
    TopicSubscriptions,
)

MAX_ID = (1 << 63) - 1  # ledger and entry ids are int64 inside
OUTBOX_BYTES = 8 << 20      # a stream's queued frames; past this its readers wait
MESSAGE_BYTES = 4 << 20     # frames per ServerMessage, at most about this many bytes
SLICE_BYTES = 16 << 10      # a client message is parsed this much at a time
SLICE_COMMANDS = 256        # commands run between two turns of the event loop
log = logging.getLogger(__name__)


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


class _Reserved:
    """What a handle holds while its subscribe runs."""


_RESERVED = _Reserved()
#: what a stream's handle holds: a reader, a consumer of a subscription, or a reservation
Handle: TypeAlias = Reader | tuple[TopicSubscriptions, SubConsumer] | _Reserved


def ids_from_pb(ids) -> list[MessageId]:
    return [MessageId.checked(i.ledger_id, i.entry_id) for i in ids]


def packed_from_pb(ids) -> list[int]:
    """Acked ids as packed positions (shadowtopic.cursors.state.pack), range-checked."""
    out = []
    for i in ids:
        if i.ledger_id > MAX_ID or i.entry_id > MAX_ID:
            raise errors.InvalidMessageId(f"message id out of range: {i.ledger_id}:{i.entry_id}")
        out.append((i.ledger_id << 64) + i.entry_id)
    return out


def acks_from_pb(ack: consumer_pb2.Ack) -> tuple[list[int], list[tuple[int, int]]]:
    """An Ack's ids and ranges as packed positions and inclusive packed (first, last) ranges
    (one-entry ranges join the positions), all checked first: `InvalidMessageId` for an id
    or range out of range, a range whose first entry is after its last, or one of more than
    MAX_ACK_RANGE entries (a client cannot make the broker walk or hold 2^60 entries)."""
    ps = packed_from_pb(ack.ids) if ack.ids else []
    ranges: list[tuple[int, int]] = []
    for r in ack.ranges:
        ledger, first, last = r.ledger_id, r.first_entry, r.last_entry
        if ledger > MAX_ID or last > MAX_ID:
            raise errors.InvalidMessageId(f"ack range out of range: {ledger}:{first}..{last}")
        if first > last:
            raise errors.InvalidMessageId(f"ack range {ledger}:{first}..{last}: its first entry "
                                          f"is after its last")
        if last - first >= MAX_ACK_RANGE:
            raise errors.InvalidMessageId(
                f"ack range {ledger}:{first}..{last} covers {last - first + 1} entries, more "
                f"than {MAX_ACK_RANGE} (split it)")
        if first == last:
            ps.append((ledger << 64) + first)
        else:
            ranges.append(((ledger << 64) + first, (ledger << 64) + last))
    return ps, ranges


def ack_warning(exc: BaseException, kind: str, cmd: consumer_pb2.ClientCommand
                ) -> common_pb2.ErrorStatus:
    """The warning for a failed command of a consumer; an Ack's names its request id."""
    if kind == "ack" and cmd.ack.request_id:
        return error_status(typed(exc, "Connect"), command=kind,
                            request_id=str(cmd.ack.request_id))
    return error_status(typed(exc, "Connect"), command=kind)


def event_frame(handle: int, **event) -> bytes:
    return consumer_pb2.ServerFrame(handles=[handle],
                                    event=consumer_pb2.Event(**event)).SerializeToString()


def split_fields(data: bytes, limit: int = SLICE_BYTES) -> Iterator[bytes]:
    """A serialized message cut at field boundaries into pieces of about `limit` bytes;
    each piece parses on its own (repeated fields concatenate). `wire.WireError` (a
    `DecodeError`: INVALID_ARGUMENT for the client) for bytes that are not a message."""
    start = 0
    for _number, _kind, _value, _at, stop in wire.walk(data):
        if stop - start >= limit:
            yield data[start:stop]
            start = stop
    if start < len(data):
        yield data[start:]


def command_slices(message) -> Iterator[list]:
    """The commands of one client message (bytes, or a parsed ClientMessage), in lists of
    at most SLICE_COMMANDS."""
    if isinstance(message, (bytes, bytearray, memoryview)):
        data = bytes(message)
        pieces = [data] if len(data) <= SLICE_BYTES else split_fields(data)
        for piece in pieces:
            cmds = consumer_pb2.ClientMessage.FromString(piece).commands
            for i in range(0, len(cmds), SLICE_COMMANDS):
                yield list(cmds[i:i + SLICE_COMMANDS])
    else:
        cmds = message.commands
        for i in range(0, len(cmds), SLICE_COMMANDS):
            yield list(cmds[i:i + SLICE_COMMANDS])


class StreamOutbox:
    """The frames waiting to go down one stream (the engine's `Outbox`), bounded in bytes,
    and counted in the broker's `ClientMemory` with the message being written."""

    def __init__(self, limit: int = OUTBOX_BYTES, memory: ClientMemory | None = None):
        self._frames: deque[bytes] = deque()
        self._bytes = 0
        self._limit = limit
        self._memory = memory if memory is not None else ClientMemory()
        self._in_flight = 0     # counted for the message handed to gRPC last
        self._progress = time.monotonic()  # when the stream last took a message
        self._ready = asyncio.Event()
        self._room_callbacks: dict[Callable[[], None], None] = {}
        self._closed = False
        self._disposed = False
        self.task: asyncio.Task | None = None  # the call's task (cut cancels it)
        self.cut_reason: errors.ShadowTopicError | None = None  # why it was cut
        self.peer = ""
        self.errored: set[int] = set()  # handles told an error since the stream last looked
        self.tasks: set[asyncio.Task] = set()  # ack receipts waiting for their cursor write

    def has_room(self) -> bool:
        return self._bytes < self._limit and self._memory.has_room()

    async def wait_for_room(self) -> None:
        """Until the queued frames fit (a client that sends commands but reads nothing
        stops being served, instead of growing this queue with their answers)."""
        while self._bytes >= self._limit and not self._closed:
            room = asyncio.Event()
            self.call_when_room(room.set)
            await room.wait()

    def call_when_room(self, callback: Callable[[], None]) -> None:
        if not self._room_callbacks and self._bytes < self._limit:
            self._memory.call_when_room(self._room)  # the broker's cap holds it
        self._room_callbacks[callback] = None

    def _room(self) -> None:
        if self._bytes < self._limit:
            callbacks, self._room_callbacks = self._room_callbacks, {}
            for callback in callbacks:
                callback()

    def send_entries(self, handles: list[int], encoded: list[bytes], size: int) -> None:
        self._put(wire.entries_frame(handles, encoded))

    def send_error(self, handle: int, error: errors.ShadowTopicError) -> None:
        self._put(event_frame(handle, error=error_status(error)))
        self.errored.add(handle)

    def send_event(self, handle: int, **event) -> None:
        self._put(event_frame(handle, **event))

    def receipt(self, waits: list[tuple[int, Awaitable[None]]],
                cmd: consumer_pb2.ClientCommand) -> None:
        """Answer `cmd`'s Ack (its `request_id`) on each handle once its write is done: an
        `ack_receipt`, or the warning of the write's failure. In a task of this stream, so
        the commands after it do not wait for the write."""
        request_id = cmd.ack.request_id

        async def answer(handle: int, write: Awaitable[None]) -> None:
            try:
                await write
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - in-band, per handle
                self.send_event(handle, warning=ack_warning(exc, "ack", cmd))
            else:
                self.send_event(handle, ack_receipt=consumer_pb2.AckReceipt(
                    request_id=request_id))

        for handle, write in waits:
            if self._disposed:
                if asyncio.iscoroutine(write):
                    write.close()
                continue
            task = asyncio.create_task(answer(handle, write))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def send_notice(self, handle: int, notice: ActiveChanged | CursorMoved) -> None:
        if isinstance(notice, ActiveChanged):
            self.send_event(handle, active_consumer_changed=consumer_pb2.ActiveConsumerChanged(
                is_active=notice.is_active))
        else:
            self.send_event(handle, seek_done=consumer_pb2.SeekDone(
                position=notice.position.to_pb(), clamped=notice.clamped,
                by_admin=notice.by_admin))

    def _put(self, frame: bytes) -> None:
        if self._disposed:
            return  # the stream is gone: nobody will take it
        if not self._frames and not self._in_flight:
            self._progress = time.monotonic()  # it waits for data from now on
        self._frames.append(frame)
        self._bytes += len(frame)
        self._memory.take(len(frame))
        self._ready.set()

    def close(self) -> None:
        """No more frames will be queued: `take` ends once the queued ones are out."""
        self._closed = True
        self._ready.set()
        callbacks, self._room_callbacks = self._room_callbacks, {}
        for callback in callbacks:
            callback()

    def dispose(self) -> None:
        """The stream ended: what it still holds is dropped and released."""
        self.close()
        self._disposed = True
        for task in self.tasks:
            task.cancel()
        self._memory.unwatch(self)
        self._memory.release(self._bytes + self._in_flight)
        self._frames.clear()
        self._bytes = self._in_flight = 0

    def stalled_since(self) -> float | None:
        """Since when the stream has not taken data it has waiting (None: none waits)."""
        return self._progress if (self._frames or self._in_flight) else None

    def cut(self, reason: errors.ShadowTopicError) -> None:
        """End a stream that does not read and drop what it holds: the call's task is
        cancelled (its pending write with it) and `Connect` ends the call with `reason` as
        its status, which the client reads after what gRPC had already buffered for it."""
        log.warning("%s: consumer stream cut (%s, holding %d bytes): %s", self.peer or "?",
                    reason.reason, self._bytes + self._in_flight, reason.message)
        self.cut_reason = reason
        task = self.task
        self.dispose()
        if task is not None:
            task.cancel()

    async def take(self) -> bytes | None:
        """The next ServerMessage (every queued frame, up to MESSAGE_BYTES), or None. The
        message stays counted until the next call (gRPC has written it by then)."""
        self._progress = time.monotonic()
        if self._in_flight:
            self._memory.release(self._in_flight)
            self._in_flight = 0
        while not self._frames:
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        batch: list[bytes] = []
        size = 0
        while self._frames and (not batch or size + len(self._frames[0]) <= MESSAGE_BYTES):
            frame = self._frames.popleft()
            batch.append(frame)
            size += len(frame)
        self._bytes -= size
        message = wire.server_message(batch)
        self._in_flight = IN_FLIGHT_FACTOR * len(message)
        self._memory.take(self._in_flight)
        self._memory.release(size)
        if self._room_callbacks and self._bytes < self._limit // 2:
            callbacks, self._room_callbacks = self._room_callbacks, {}
            for callback in callbacks:
                callback()
        return message


class ConsumerService(consumer_pb2_grpc.ConsumerServicer):
    def __init__(self, topics: TopicManager, memory: ClientMemory | None = None,
                 authz: Authorizer = OPEN):
        self.topics = topics
        self.memory = memory if memory is not None else ClientMemory()
        self.authz = authz
        self.engine = ReadEngine(topics.view, topics.counters_for, topics.compacted_view,
                                 topics.encodings)
        self._streams: set[StreamOutbox] = set()

    def shutdown(self) -> None:
        """End every Connect stream (graceful broker stop)."""
        for outbox in list(self._streams):
            outbox.close()

    async def Connect(self, request_iterator, context):
        """The gRPC handler: writes each message of `stream` with `context.write`, so a
        stream cut for not reading (`StreamOutbox.cut` cancels this task) ends with its
        reason as the call's status. (Cancelling a handler that yields does not end the
        call on the wire: its client waited until the server stopped.)"""
        outbox = StreamOutbox(memory=self.memory)
        async with contextlib.aclosing(self.stream(request_iterator, context, outbox)) as out:
            try:
                async for message in out:
                    await context.write(message)
            except asyncio.CancelledError:
                if outbox.cut_reason is None:
                    raise
                await abort_stream(context, outbox.cut_reason)

    async def stream(self, request_iterator: AsyncIterator[bytes],
                     context: grpc.aio.ServicerContext | None,
                     outbox: StreamOutbox | None = None):
        """The ServerMessages of one Connect stream, its requests read from `context` (Connect)
        or, with None, from `request_iterator` (tests drive this with plain iterators; a
        failure of the command stream is then raised, there being no call to end)."""
        outbox = outbox if outbox is not None else StreamOutbox(memory=self.memory)
        handles: dict[int, Handle] = {}  # handle -> Reader | (TopicSubscriptions, SubConsumer)
        failure: list[errors.ShadowTopicError] = []  # why the command stream broke, if it did
        self._streams.add(outbox)
        peer = context.peer() if context is not None else ""
        outbox.peer = peer
        outbox.task = asyncio.current_task()
        self.memory.watch(outbox)
        self.memory.take(STREAM_BYTES)

        async def one(cmd) -> None:
            try:
                await self._command(cmd, outbox, handles, peer)
            except Exception as exc:  # noqa: BLE001 - in-band, per handle
                kind = cmd.WhichOneof("command")
                if kind in ("ack", "nack", "redeliver", "flow") and isinstance(
                        handles.get(cmd.handle), tuple):
                    outbox.send_event(cmd.handle, warning=ack_warning(exc, kind, cmd))
                else:
                    if handles.get(cmd.handle) is _RESERVED:
                        del handles[cmd.handle]
                    outbox.send_error(cmd.handle, typed(exc, "Connect"))

        async def run(cmds: list) -> None:
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

        next_message = reader(request_iterator, context)

        async def commands() -> None:
            try:
                while (message := await next_message()) is not None:
                    await outbox.wait_for_room()
                    held = len(message) if isinstance(message, bytes) else 0
                    self.memory.take(held)
                    try:
                        first = True
                        for cmds in command_slices(message):
                            if not first:  # a long message: let the others run
                                await asyncio.sleep(0)
                            first = False
                            await run(cmds)
                    finally:
                        self.memory.release(held)
                    message, cmds = None, []  # (held no longer while the next is read)
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
                if context is None:
                    raise failure[0]
                await abort_stream(context, failure[0])
        finally:
            self._streams.discard(outbox)
            task.cancel()
            for item in handles.values():
                self._close(item)
            outbox.dispose()
            self.memory.release(STREAM_BYTES)

    @staticmethod
    def _prune(outbox: StreamOutbox, handles: dict[int, Handle]) -> None:
        """Forget handles the broker ended (a consumer of a deleted subscription, a reader
        whose topic failed): the handle can be subscribed again, and nothing keeps their
        topic alive. A handle that was only told a command failed stays."""
        for h in outbox.errored:
            item = handles.get(h)
            if isinstance(item, Reader) and item.closed or \
                    isinstance(item, tuple) and item[1].closed:
                del handles[h]
        outbox.errored.clear()

    def _close(self, item: Handle | None) -> None:
        if isinstance(item, Reader):
            self.engine.close(item)
        elif isinstance(item, tuple):
            ts, consumer = item
            ts.close_consumer(consumer)

    def _fan_in(self, cmd: consumer_pb2.ClientCommand, outbox: StreamOutbox,
                handles: dict[int, Handle]) -> None:
        """One Ack or Flow for `cmd.handle` and every handle in `cmd.also` (a broadcast
        message acknowledged by thousands of subscriptions of a stream): the ids are parsed
        once; a handle that fails hears a warning of its own, the others go on."""
        kind = cmd.WhichOneof("command")
        if kind not in ("ack", "flow"):
            raise errors.InvalidArgument(f"`also` goes with ack or flow, not {kind}")
        ps, ranges = acks_from_pb(cmd.ack) if kind == "ack" else ([], [])
        cumulative, permits = cmd.ack.cumulative, cmd.flow.permits
        if kind == "ack" and (ps or ranges or cmd.ack.request_id):
            # subscriptions by topic, each topic's acks in one go
            by_topic: dict[TopicSubscriptions, list[SubConsumer]] = {}
            last: TopicSubscriptions | None = None
            bucket: list[SubConsumer] = []
            for h in itertools.chain((cmd.handle,), cmd.also):
                item = handles.get(h)
                if isinstance(item, tuple):
                    if item[0] is not last:  # (one topic, almost always: no lookup each)
                        last = item[0]
                        bucket = by_topic.setdefault(last, [])
                    bucket.append(item[1])
                elif not isinstance(item, Reader):  # (readers keep no cursor: ignored)
                    outbox.send_event(h, warning=ack_warning(
                        errors.InvalidArgument(f"unknown handle {h}"), kind, cmd))
            waits: list[tuple[int, Awaitable[None]]] = []
            for ts, consumers in by_topic.items():
                failed = ts.ack_many(consumers, ps, cumulative, ranges)
                for c, exc in failed:
                    outbox.send_event(c.handle, warning=ack_warning(exc, kind, cmd))
                if cmd.ack.request_id:
                    bad = {id(c) for c, _exc in failed}
                    waits += [(c.handle, ts.persist_acks(c)) for c in consumers
                              if id(c) not in bad]
            if waits:
                outbox.receipt(waits, cmd)
            return
        for h in itertools.chain((cmd.handle,), cmd.also):
            item = handles.get(h)
            try:
                if isinstance(item, tuple):
                    if kind == "ack":
                        item[0].ack_packed(item[1], ps, cumulative, ranges)
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
                       handles: dict[int, Handle], peer: str) -> None:
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
            if not self.memory.has_room():
                self.memory.refused += 1
                raise errors.BrokerMemoryFull(
                    f"subscribe refused: the broker holds {self.memory.used} bytes for "
                    f"clients, its limit is {self.memory.limit} (--client-memory-bytes); "
                    f"retry later")
            handles[handle] = _RESERVED
            sub = cmd.subscribe
            topic = TopicName.parse(sub.topic)
            self.authz.require(Action.CONSUME, topic)  # readers too (a revoke ends the stream)
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
            if item is None or isinstance(item, _Reserved) or item.closed:
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
                         handles: dict[int, Handle], peer: str) -> None:
        sub = cmd.subscribe
        check_subscription(sub.subscription)
        type_ = TYPES.get(sub.type)
        if type_ is None:
            raise errors.InvalidArgument(f"unknown subscription type {sub.type}")
        start = (start_from_pb(sub.start, sub.start_inclusive) if sub.HasField("start")
                 else Start(LATEST))  # Pulsar's default initial position
        t = await self.topics.topic(topic, fresh=True)  # never an incarnation deleted since
        ts = t.subscriptions
        if ts is None:  # (every topic a broker loads has them: only a bug gets here)
            raise errors.Internal(f"{topic} was loaded without its subscriptions")
        view: LedgerView = t.ledger
        if sub.read_compacted:
            compacted = await self.topics.compacted_view(topic)
            ts.use_compacted(compacted)
            view = compacted
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
                                handles: dict[int, Handle], ts: TopicSubscriptions,
                                consumer: SubConsumer) -> None:
        if kind == "ack":
            ps, ranges = acks_from_pb(cmd.ack)
            ts.ack_packed(consumer, ps, cmd.ack.cumulative, ranges)
            if cmd.ack.request_id:
                outbox.receipt([(cmd.handle, ts.persist_acks(consumer))], cmd)
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
