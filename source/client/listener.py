"""Message listeners for many subscriptions at once (`Client.subscribe_many`).

The broker sends a broadcast entry once per stream with the list of handles it is for. A
`Listeners` keeps it that way up to the user: for each message it calls
`callback(message, recipients)` once, `recipients` being every consumer of the call that
got it in that frame, and `recipients.acknowledge(message)` acknowledges it for all of them
in one command (the Ack's `also` handles). So 25,000 subscriptions of one process cost one
decode, one callback and one command per message, plus a few list operations each.

Threads: the stream's receive thread only queues `(handles, epochs, delivery)` (`put_many`;
events such as seek_done still go to each consumer at once, on that thread); one listener
thread per call decodes and calls back, in stream order. A message a consumer received
before its own seek (an older epoch) or after it ended is not passed. Permits: each
consumer's `consumed` count is kept here, and the Flows of consumers that reach half their
queue together go up as one command.

A consumer whose partition reconnects (source/client/reconnect.py) moves that partition to
a new handle, perhaps on a new stream (`remove`, then `add`); each frame's acks and flows go
up the stream its handles are on now (a frame's handles are all on one stream).

A callback that raises is logged and the next message goes on (as Pulsar's
MessageListener); a slow callback holds back this call's consumers, never the stream's
others (each consumer's backlog here is bounded by its permits).
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Protocol

from shadowtopic.client.acks import one_range
from shadowtopic.client.consumer_part import Part
from shadowtopic.client.message import Message
from shadowtopic.client.stream import Delivery, Multiplexer, Sink
from shadowtopic.core import errors
from shadowtopic.pb.v1 import consumer_pb2

log = logging.getLogger(__name__)


class ItemSink(Sink, Protocol):
    """What a consumer gives its `Listeners` (`add`), one per consumer: the stream's `Sink`
    of its handles (`put` takes a handle's event frames and the stream's end, on the
    stream's receive thread) and what the listener thread reads of it."""

    @property
    def consumer(self) -> object:
        """What `Recipients` lists for this consumer: the user's consumer object."""
    #: the consumer's `receiver_queue_size`: permits go up again once half were called back
    queue_size: int
    #: the consumer was closed: the listener passes it nothing more (a plain attribute: it is
    #: read for every handle of every message)
    closed: bool


class Recipients(list[object]):
    """The consumers (of one `subscribe_many` call) that got one message in one frame."""

    __slots__ = ("_mux", "_handles", "_cumulative")

    def __init__(self, consumers: Iterable[object], handles: list[int], mux: Multiplexer,
                 cumulative: bool = True):
        super().__init__(consumers)
        self._mux = mux
        self._handles = handles
        self._cumulative = cumulative  # False: Shared / Key_Shared subscriptions

    def _handles_of(self, consumers: Iterable[object] | None, what: str) -> list[int]:
        if consumers is None:
            return self._handles
        mine = {id(c): h for c, h in zip(self, self._handles, strict=True)}
        try:
            return [mine[id(c)] for c in consumers]
        except KeyError:
            raise errors.InvalidArgument(f"{what}: a consumer that did not get this "
                                         "message") from None

    def acknowledge(self, message: Message, consumers: Iterable[object] | None = None
                    ) -> None:
        """Acknowledge `message` for every recipient (or for `consumers`, some of them) in
        one command. Fire-and-forget, as `Consumer.acknowledge`."""
        handles = self._handles_of(consumers, "acknowledge")
        if not handles:
            return
        mid = message.message_id
        self._mux.send(consumer_pb2.ClientCommand(
            handle=handles[0], also=handles[1:],
            ack=consumer_pb2.Ack(ranges=one_range(mid.ledger_id, mid.entry_id))))

    def acknowledge_cumulative(self, message: Message,
                               consumers: Iterable[object] | None = None) -> None:
        """Acknowledge every message up to and including `message` for every recipient (or
        for `consumers`) in one command: a frame listener acknowledges a whole frame with
        its last message. Refused (`NotAllowed`, nothing sent) on Shared and Key_Shared
        subscriptions, as `Consumer.acknowledge_cumulative`. Fire-and-forget."""
        if not self._cumulative:
            raise errors.NotAllowed("cumulative acknowledgement is not allowed on a shared "
                                    "or key_shared subscription")
        handles = self._handles_of(consumers, "acknowledge_cumulative")
        if not handles:
            return
        self._mux.send(consumer_pb2.ClientCommand(
            handle=handles[0], also=handles[1:],
            ack=consumer_pb2.Ack(ids=[message.message_id.to_pb()], cumulative=True)))


    def relabel(self, consumers: Iterable[object]) -> Recipients:
        """The same recipients listed as other objects, one for one (the asyncio face lists
        its own consumers)."""
        return Recipients(consumers, self._handles, self._mux, self._cumulative)


Callback = Callable[[Message, Recipients], None]
#: a frame listener's: every message of one frame, at once, with their recipients
FrameCallback = Callable[[list[Message], Recipients], None]


class Listeners:
    def __init__(self, callback: Callback | None, mux: Multiplexer,
                 frames: FrameCallback | None = None, cumulative: bool = True):
        """`callback(message, recipients)` per message, or `frames(messages, recipients)`
        per frame (one of the two); `cumulative`: the subscriptions take cumulative acks
        (not Shared or Key_Shared)."""
        self._cumulative = cumulative
        self._callback = callback
        self._frames = frames
        self._mux = mux
        self._by_handle: dict[int, tuple[ItemSink, Part]] = {}  # handle -> (sink, part)
        # (handles, their epochs, the frame); None: the end
        self._items: queue.SimpleQueue[tuple[list[int], list[int], Delivery] | None] = (
            queue.SimpleQueue())
        self._thread = threading.Thread(target=self._run, daemon=True, name="consumer-listener")
        self._thread.start()

    def add(self, sink: ItemSink, part: Part) -> None:
        """`part`, a handle of the consumer that `sink` stands for, is this call's."""
        self._by_handle[part.handle] = (sink, part)

    def remove(self, handle: int) -> None:
        """`handle` is no longer this call's (its partition reconnected on another one)."""
        self._by_handle.pop(handle, None)

    # ---- the stream's receive thread ---------------------------------------------------

    def put_many(self, handles: list[int], delivery: Delivery) -> None:
        frame = delivery.frame
        if frame.HasField("event") or not len(frame.entries):
            for h in handles:  # events act at once, per consumer
                item = self._by_handle.get(h)
                if item is not None:
                    item[0].put((h, delivery))
            return
        by_handle = self._by_handle
        epochs = [by_handle[h][1].epoch if h in by_handle else -1 for h in handles]
        self._items.put((handles, epochs, delivery))

    def put(self, item: tuple[int, Delivery | Exception]) -> None:
        """One handle's frame or the stream's end (an exception)."""
        handle, what = item
        if isinstance(what, Exception):
            entry = self._by_handle.get(handle)
            if entry is not None:
                entry[0].put(item)
            return
        self.put_many([handle], what)

    def close(self) -> None:
        self._items.put(None)

    # ---- the listener thread -----------------------------------------------------------

    def _run(self) -> None:
        while (item := self._items.get()) is not None:
            try:
                self._deliver(*item)
            except Exception:  # noqa: BLE001 - the listener thread must go on
                log.exception("message listener dispatch failed")

    def _deliver(self, handles: list[int], epochs: list[int], delivery: Delivery) -> None:
        by_handle = self._by_handle
        consumers: list[object] = []
        mine: list[int] = []
        flows: dict[int, list[int]] = {}  # permits -> the handles that get them
        alone: list[tuple[object, int, Part]] = []
        msgs: list[Message] | None = None  # decoded once, for the first handle that takes it
        mux = self._mux  # the stream the frame came on: its handles' parts say which
        n = len(delivery.frame.entries)
        redelivered = {r.handle for r in delivery.frame.redeliveries}
        for h, epoch in zip(handles, epochs, strict=True):
            entry = by_handle.get(h)
            if entry is None:
                continue
            s, p = entry
            if p.epoch != epoch or p.state != "open" or s.closed:
                continue
            mux = p.mux or mux
            p.consumed += n
            if h in redelivered:  # counts differ per handle: a call of its own
                alone.append((s.consumer, h, p))
            else:
                if msgs is None:
                    msgs = delivery.messages(p.topic, p.index)
                consumers.append(s.consumer)
                mine.append(h)
            if p.consumed >= max(1, s.queue_size // 2):
                flows.setdefault(p.consumed, []).append(h)
                p.consumed = 0
        for permits, hs in flows.items():
            try:
                mux.send(consumer_pb2.ClientCommand(
                    handle=hs[0], also=hs[1:], flow=consumer_pb2.Flow(permits=permits)))
            except errors.ShadowTopicError:  # the stream is gone: the consumers hear it
                pass
        if msgs is not None:  # (decoded as the first of `consumers` was taken)
            self._call(msgs, Recipients(consumers, mine, mux, self._cumulative))
        for c, h, p in alone:
            counted = list(delivery.messages(p.topic, p.index))
            for r in delivery.frame.redeliveries:
                if r.handle == h and r.entry_index < len(counted):
                    counted[r.entry_index] = counted[r.entry_index].replace(
                        redelivery_count=r.count)
            self._call(counted, Recipients([c], [h], mux, self._cumulative))

    def _call(self, msgs: list[Message], recipients: Recipients) -> None:
        if self._frames is not None:
            try:
                self._frames(msgs, recipients)
            except Exception:  # noqa: BLE001 - a user callback must not stop the others
                log.exception("frame listener failed on %s..", msgs[0].message_id)
            return
        assert self._callback is not None  # (one of the two: __init__)
        for msg in msgs:
            try:
                self._callback(msg, recipients)
            except Exception:  # noqa: BLE001 - a user callback must not stop the others
                log.exception("message listener failed on %s", msg.message_id)
