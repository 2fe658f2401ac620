"""Consumer.Connect: one stream per client, many handles on it.

This foundation serves non-durable readers (a `Subscribe` with an empty subscription name):
a reader starts at earliest / latest / a MessageId (inclusive or not), gets entries as flow
permits allow, in frames of pre-encoded entries, and follows the topic's tail. Durable
subscriptions (Exclusive, Shared, Failover, Key_Shared) arrive with the subscriptions issue;
until then such a Subscribe is answered with an in-band `Unimplemented` error.

A failing handle (topic gone, checksum error) gets an `Event.error` frame and stops; the
stream and its other handles go on. A bad command (invalid topic or message id, unknown
handle) gets an `Event.error` frame too; only a command that does not parse ends the stream,
with INVALID_ARGUMENT.
"""
from __future__ import annotations

import asyncio
import logging

from source import wire
from source.broker.rpc import abort_stream, error_status, typed
from source.broker.topics import TopicManager
from source.core import errors
from source.core.message_id import EARLIEST, MessageId
from source.core.names import TopicName, check_subscription
from source.ledger.managed import ManagedLedger
from source.pb.v1 import common_pb2, consumer_pb2, consumer_pb2_grpc

log = logging.getLogger(__name__)
MAX_FRAME_ENTRIES = 500
MAX_FRAME_BYTES = 2 << 20
IDLE_WAIT_S = 1.0


def event_frame(handle: int, **event) -> bytes:
    return consumer_pb2.ServerFrame(handle=handle,
                                    event=consumer_pb2.Event(**event)).SerializeToString()


class _Reader:
    """One handle's state: where it reads next and how many entries it may still send."""

    def __init__(self, handle: int, topic: TopicName, ml: ManagedLedger, position: MessageId):
        self.handle = handle
        self.topic = topic
        self.ml = ml
        self.position = position
        self.permits = 0
        self.generation = 0  # bumped by seek: a read begun before a seek is dropped
        self.permit_event = asyncio.Event()
        self.task: asyncio.Task | None = None


def resolve_start(ml: ManagedLedger, start: common_pb2.StartPosition, inclusive: bool
                  ) -> MessageId:
    kind = start.WhichOneof("position")
    if kind is None or kind == "earliest":
        return EARLIEST
    if kind == "latest":
        last = ml.last_confirmed()
        if inclusive and last is not None:
            return last
        return ml.next_position()
    if kind == "message_id":
        mid = MessageId.checked(start.message_id.ledger_id, start.message_id.entry_id)
        return mid if inclusive else MessageId(mid.ledger_id, mid.entry_id + 1)
    raise errors.Unimplemented("starting a reader by publish time is not supported yet")


class ConsumerService(consumer_pb2_grpc.ConsumerServicer):
    def __init__(self, topics: TopicManager):
        self.topics = topics
        self._streams: set[asyncio.Queue] = set()

    def shutdown(self) -> None:
        """End every Connect stream (graceful broker stop)."""
        for out in list(self._streams):
            try:
                out.put_nowait(None)
            except asyncio.QueueFull:
                out.get_nowait()
                out.put_nowait(None)

    async def Connect(self, request_iterator, context):
        out: asyncio.Queue = asyncio.Queue(maxsize=32)
        readers: dict[int, _Reader] = {}
        failure: list[errors.ShadowTopicError] = []  # why the command stream broke, if it did
        self._streams.add(out)

        async def pump(r: _Reader) -> None:
            counters = self.topics.counters_for(r.topic)
            try:
                while True:
                    if r.ml.fenced is not None:
                        # this broker closed or lost the ledger: follow its reload (or
                        # report why not) instead of waiting on a dead object forever
                        r.ml = await self.topics.ledger(r.topic)
                        continue
                    if r.permits <= 0:
                        r.permit_event.clear()
                        await r.permit_event.wait()
                        continue
                    generation = r.generation
                    entries = await r.ml.read(r.position, min(r.permits, MAX_FRAME_ENTRIES),
                                              MAX_FRAME_BYTES)
                    if generation != r.generation:
                        continue
                    if not entries:
                        await r.ml.wait_for_entries(r.position, IDLE_WAIT_S)
                        continue
                    enc = wire.encode_entry
                    frame = wire.entries_frame(r.handle, [enc(e.ledger_id, e.entry_id,
                                                              e.publish_ms, e.raw)
                                                          for e in entries])
                    await out.put(frame)
                    if generation != r.generation:
                        continue
                    last = entries[-1]
                    r.position = MessageId(last.ledger_id, last.entry_id + 1)
                    r.permits -= len(entries)
                    counters.add_out(len(entries), sum(len(e.raw) for e in entries))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reported on this handle only
                await out.put(event_frame(r.handle, error=error_status(exc)))
                readers.pop(r.handle, None)

        async def subscribe(handle: int, sub: consumer_pb2.Subscribe) -> None:
            if handle in readers:
                raise errors.InvalidArgument(f"handle {handle} is already in use")
            topic = TopicName.parse(sub.topic)
            if sub.subscription:
                check_subscription(sub.subscription)
                raise errors.Unimplemented(
                    "durable subscriptions are not available yet; use a reader "
                    "(empty subscription name)")
            ml = await self.topics.ledger(topic)
            r = _Reader(handle, topic, ml, resolve_start(ml, sub.start, sub.start_inclusive))
            readers[handle] = r
            last = ml.last_confirmed()
            await out.put(event_frame(handle, subscribed=consumer_pb2.Subscribed(
                topic=str(topic), last_message_id=last.to_pb() if last else None)))
            r.task = asyncio.create_task(pump(r))

        async def handle_commands() -> None:
            try:
                async for cmd in request_iterator:
                    kind = cmd.WhichOneof("command")
                    try:
                        if kind == "subscribe":
                            await subscribe(cmd.handle, cmd.subscribe)
                        elif kind == "flow":
                            r = readers.get(cmd.handle)
                            if r is not None:
                                r.permits += cmd.flow.permits
                                r.permit_event.set()
                        elif kind == "close":
                            r = readers.pop(cmd.handle, None)
                            if r is not None and r.task:
                                r.task.cancel()
                            await out.put(event_frame(cmd.handle,
                                                      closed=consumer_pb2.HandleClosed()))
                        elif kind in ("ack", "nack", "redeliver", "unsubscribe", "seek"):
                            if cmd.handle not in readers:
                                raise errors.InvalidArgument(f"unknown handle {cmd.handle}")
                            if kind == "seek":
                                r = readers[cmd.handle]
                                r.generation += 1
                                r.position = resolve_start(r.ml, cmd.seek.position, True)
                                await out.put(event_frame(cmd.handle, seek_done=consumer_pb2.SeekDone(
                                    position=r.position.to_pb())))
                            # readers keep no cursor: acks are accepted and ignored
                        else:
                            raise errors.InvalidArgument("empty client command")
                    except Exception as exc:  # noqa: BLE001 - in-band, per handle
                        await out.put(event_frame(cmd.handle, error=error_status(exc)))
            except Exception as exc:  # noqa: BLE001 - reading the stream failed: it ends
                failure.append(typed(exc, "Connect"))
            finally:
                await out.put(None)

        commands = asyncio.create_task(handle_commands())
        try:
            while True:
                frame = await out.get()
                if frame is None:
                    break
                yield frame
            if failure:
                await abort_stream(context, failure[0])
        finally:
            self._streams.discard(out)
            commands.cancel()
            for r in readers.values():
                if r.task:
                    r.task.cancel()
