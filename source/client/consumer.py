"""Sync consumer of a durable subscription (Exclusive, Shared, Failover, Key_Shared), and,
with `durable=False`, of no subscription: the machinery of a `Reader` (reader.py), as in
Pulsar, where a reader is a non-durable consumer.

    with client.subscribe("orders", "billing", consumer_type="shared") as consumer:
        for msg in consumer:                 # blocks for the next message; ends once closed
            handle(msg)
            consumer.acknowledge(msg)

A consumer rides on the client's one Consumer.Connect stream (`stream.Multiplexer`), one
handle per partition. Unlike a `Reader`, whose frames wait in a queue until `read_next`
looks at them, a consumer's frames are taken by `_Sink.put` on the stream's receive thread
as they arrive, so events act at once and in stream order:

- `seek_done` (this consumer's `seek`, another consumer's, or an admin's reset-cursor): the
  broker has set the handle's permits to 0. Everything the handle received before the event
  is dropped (each partition has an epoch; a message of an older epoch is never returned)
  and a fresh Flow(receiver_queue_size) goes up at once.
- `active_consumer_changed` updates `is_active` (and calls `on_active_change` on a thread of
  the consumer's own, never on the stream's receive thread).
- `warning`: a command of this handle failed, the handle goes on (`last_warning`, logged).
- `error`: the broker ended the handle (topic deleted, subscription force-deleted, ...):
  `receive` raises that typed error from then on; except when it answers this consumer's
  pending `seek` or `unsubscribe`: that call raises it and the consumer goes on; and except
  a retriable one (`TopicNotOwned`, `Fenced`), after which the partition reconnects.

A partition whose stream breaks, or that the broker ends with a retriable error, subscribes
again by itself (consumer_resume.py; the design and the at-least-once window: reconnect.py).
Acknowledgements leave through the consumer's `AckSender` (consumer_acks.py), which waits for
receipts and remembers acks for a reconnect; its partitions and their handles are its
`Handles` (consumer_handles.py).

Frames wait in an `Inbox` (inbox.py), decoded one at a time, fields parsed on access
(message.py); `receive` takes a message of the current frame without the lock.
Permits: `receiver_queue_size` per partition at first, topped up once half of them were
returned to the user (counted a frame at a time).

With `ack_timeout_ms` or a `dead_letter_policy`, a `Redelivery` (redelivery.py) is told what
the application received, acknowledged, nacked and what a seek dropped; the ack timeout and
the dead-letter forwarding are its (ack_timeout.py, dead_letter.py), not this module's.
With `retry_enable`, a `RetryLetters` (retry_letter.py) owns the retry-letter topic's
consumer: due letters are returned before this consumer's own messages, a letter's acks and
nacks go to it, and `reconsume_later` is its.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Unpack

from shadowtopic.client.ack_timeout import AckTimer, check_ack_timeout
from shadowtopic.client.acks import ReceiptCallback, wait_for_receipt
from shadowtopic.client.admin import position_pb
from shadowtopic.client.connection import Connection
from shadowtopic.client.consumer_acks import AckSender
from shadowtopic.client.consumer_handles import Handles
from shadowtopic.client.consumer_part import WAIT_SLICE_S, Command, Part, wait_answers
from shadowtopic.client.consumer_resume import ResumeHooks, Resumer
from shadowtopic.client.dead_letter import DeadLetters
from shadowtopic.client.inbox import Batch, Inbox
from shadowtopic.client.listener import Listeners
from shadowtopic.client.message import Message
from shadowtopic.client.options import check_max_messages, check_options, parse_consumer_type
from shadowtopic.client.read_position import ReadPosition
from shadowtopic.client.reconnect import Reconnector
from shadowtopic.client.redelivery import Redelivery
from shadowtopic.client.retry_letter import RetryLetters
from shadowtopic.client.seek import SeekResult, seek_targets
from shadowtopic.client.stream import CLOSE_TIMEOUT_S, Delivery, Multiplexer
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.pb.v1 import common_pb2, consumer_pb2

log = logging.getLogger(__name__)


def _call_active_change(callback: Callable[[bool], None], active: bool) -> None:
    """On the consumer's events thread: the user's `on_active_change`."""
    try:
        callback(active)
    except Exception:  # noqa: BLE001 - a user callback must not end the consumer
        log.exception("on_active_change callback failed")


def _typed(status: common_pb2.ErrorStatus) -> errors.ShadowTopicError:
    return errors.from_reason(status.reason, status.message, status.code)


class _Sink:
    """This consumer's end of the stream, on the stream's receive thread: the `stream.Sink`
    its handles are registered with or, with a message listener (which is registered
    instead and passes events on), the `listener.ItemSink` the listener is given."""

    __slots__ = ("consumer", "queue_size", "closed", "_on_item")

    def __init__(self, consumer: Consumer, queue_size: int,
                 on_item: Callable[[int, Delivery | Exception], None]):
        self.consumer = consumer
        self.queue_size = queue_size
        self.closed = False  # the consumer's `_closed`, here where a listener reads it fast
        self._on_item = on_item  # the consumer's: takes one handle's frame or the stream's end

    def put(self, item: tuple[int, Delivery | Exception]) -> None:
        self._on_item(*item)

    def put_many(self, handles: list[int], delivery: Delivery) -> None:
        for handle in handles:
            self._on_item(handle, delivery)


@dataclass(frozen=True)
class ConsumerControl:
    """The client's hold on a consumer it opened, beside the user's object (not the user's
    API): finish the subscribes of a consumer made with `wait=False` (so many consumers
    subscribe with one wait), and close many consumers with one wait."""

    consumer: Consumer
    #: wait (until a monotonic deadline) for the subscribes' answers, then flow
    await_subscribed: Callable[[float], None]
    #: send the closes; what was sent goes to `finish_close` (None: closed already)
    start_close: Callable[[], list[Part] | None]
    #: wait (until a monotonic deadline) for the closes' answers
    finish_close: Callable[[list[Part] | None, float], None]


class Consumer:
    def __init__(self, conn: Connection, mux: Multiplexer, topic: str, partitions: int,
                 subscription_name: str, consumer_type: str = "exclusive",
                 initial_position: str | MessageId | int = "latest", consumer_name: str = "",
                 receiver_queue_size: int = 1000, priority: int = 0,
                 negative_ack_redelivery_delay_ms: int = 1000,
                 on_active_change: Callable[[bool], None] | None = None,
                 message_listener: Listeners | None = None, wait: bool = True,
                 read_compacted: bool = False, reconnector: Reconnector | None = None,
                 controls: list[ConsumerControl] | None = None, ack_timeout_ms: int = 0,
                 dead_letters: DeadLetters | None = None, ack_timer: AckTimer | None = None,
                 ack_receipt: bool = False, durable: bool = True, inclusive: bool = False,
                 retry_letters: RetryLetters | None = None):
        """Use `Client.subscribe` (or `Client.subscribe_many`). Subscribes every partition
        and waits for the broker's answers; raises the first typed error (ConsumerBusy,
        TooManyConsumers, SubscriptionNotFound, ...) after leaving the partitions that did
        subscribe. `wait=False` only sends the subscribes: the `ConsumerControl` appended to
        `controls` finishes (`await_subscribed`). With a `reconnector` (the client's), a
        partition that breaks reconnects. `ack_timer`: the client's (ack_timeout.py).
        `ack_receipt`: acknowledgements wait for the broker's receipt (acks.py).

        `durable=False`: a reader (`reader.Reader` is its face), a consumer of no
        subscription: the broker keeps no cursor; each partition's `ReadPosition`
        (read_position.py) says where it is, and a reconnect resumes there. It starts at
        `initial_position` ("earliest", "latest", an id: `inclusive` or not).

        `retry_letters`: the retry-letter topic's consumer and its held letters
        (retry_letter.py; `subscribe(..., retry_enable=True)`), started once this one is."""
        self._type, type_pb = parse_consumer_type(consumer_type)
        start = position_pb(initial_position, "initial position")
        check_options(consumer_name, receiver_queue_size, priority,
                      negative_ack_redelivery_delay_ms, on_active_change)
        check_ack_timeout(ack_timeout_ms)
        if not isinstance(ack_receipt, bool):
            raise errors.InvalidArgument(f"ack_receipt must be True or False, got {ack_receipt!r}")
        self._ack_receipt = ack_receipt
        self._acks = AckSender(remember=reconnector is not None)
        self.topic = topic
        self.subscription_name = subscription_name
        self.consumer_name = consumer_name
        self.last_warning: errors.ShadowTopicError | None = None
        self._conn = conn
        self._queue_size = receiver_queue_size
        self._nack_delay = negative_ack_redelivery_delay_ms
        self._on_active_change = on_active_change
        self._listeners = message_listener  # when set, frames with entries go through it
        self._events = (ThreadPoolExecutor(1, thread_name_prefix="consumer-events")
                        if on_active_change is not None else None)
        self._cond = threading.Condition()
        self._wakers: list[Callable[[], None]] = []  # `poll`'s, called at the next `_notify`
        self._seek_lock = threading.Lock()  # one seek / unsubscribe at a time
        self._inbox = Inbox()  # received, not returned yet (inbox.py)
        self._flow_at = max(1, receiver_queue_size // 2)  # permits go up again past this
        self._error: errors.ShadowTopicError | None = None  # once set, receive raises it
        self._reconnector = reconnector
        self._redelivery = (None if not ack_timeout_ms and dead_letters is None else Redelivery(
            ack_timeout_ms, dead_letters, ack_timer or AckTimer(), again=self._ask_again,
            current=self._current, retry=self._renack,
            settle=lambda msg: self.acknowledge_async(msg, None)))  # (never waits)
        self._retry = retry_letters  # due letters come from it, their acks go to it
        # every partition's Subscribe but its topic
        self._kind = "consumer" if durable else "reader"  # (what errors call it)
        self._subscribe = (consumer_pb2.Subscribe(
            subscription=subscription_name, type=type_pb, start=start,
            consumer_name=consumer_name, priority=priority, read_compacted=read_compacted)
            if durable else consumer_pb2.Subscribe(start=start, start_inclusive=inclusive,
                                                   read_compacted=read_compacted))
        # keeps `_closed` (see there)
        self._sink = _Sink(self, receiver_queue_size, self._on_item)
        self._handles = Handles(self._sink, message_listener)
        self._resumer = Resumer(topic, self._cond, self._handles, self._acks, reconnector,
                                ResumeHooks(
                                    closed=lambda: self._closed,
                                    ended=lambda: self._closed or self._error is not None,
                                    fail=self._fail, subscribe_pb=self._subscribe_pb,
                                    reopened=lambda p: self._flow(p, self._queue_size),
                                    notify=self._notify,
                                    sync_position=self._inbox.sync_position))
        names = [topic] if partitions == 0 else [f"{topic}-partition-{i}"
                                                   for i in range(partitions)]
        with self._cond:
            try:
                for i, name in enumerate(names):
                    index = i if partitions else TopicName.parse(name).partition_index
                    self._handles.open(mux, name, index, reader=not durable)
                for p in self._handles:
                    p.waits["subscribe"] = None
                    p.send(subscribe=self._subscribe_pb(p))
            except BaseException:
                self._closed = True
                self._abandon(list(self._handles))
                raise
        if controls is not None:
            controls.append(ConsumerControl(self, self._await_subscribed, self._start_close,
                                            self._finish_close))
        if wait:
            self._await_subscribed(time.monotonic() + conn.timeout)
        if retry_letters is not None:
            retry_letters.start(self._letter_due)

    def _letter_due(self) -> None:
        """A retry letter is due, or the retry topic's consumer ended (the timer thread):
        wake whoever waits (retry_letter.py)."""
        with self._cond:
            self._notify()

    def _subscribe_pb(self, p: Part) -> consumer_pb2.Subscribe:
        sub = consumer_pb2.Subscribe()
        sub.CopyFrom(self._subscribe)
        sub.topic = p.topic
        if p.position is not None and p.position.answered:  # a reader subscribing again
            start, inclusive = p.position.resume_at()
            sub.start.CopyFrom(start)
            sub.start_inclusive = inclusive
        return sub

    def _await_subscribed(self, deadline: float) -> None:
        """Wait (until `deadline`, a monotonic time) for the broker's answers to the
        subscribes, then flow; on a refusal leave every partition and raise it."""
        with self._cond:
            parts = list(self._handles)
            try:
                answers = self._wait_answers(parts, "subscribe",
                                             max(0.0, deadline - time.monotonic()),
                                             f"subscribing to {self.topic}")
            except BaseException:
                self._closed = True
                self._abandon(parts)
                raise
            failure = next((a for a in answers if isinstance(a, BaseException)), None)
            if failure is not None:
                self._closed = True
                self._abandon(parts)
                raise failure
            for p, answer in zip(parts, answers, strict=True):
                if p.state == "ended":  # an error came right after its subscribe's answer
                    continue
                if p.position is not None and isinstance(answer, consumer_pb2.Subscribed):
                    p.position.subscribed(self._subscribe.start, self._subscribe.start_inclusive,
                                          answer.last_message_id
                                          if answer.HasField("last_message_id") else None)
                p.state = "open"
                self._flow(p, self._queue_size)

    @property
    def _closed(self) -> bool:
        """Closed (by `close`, or a subscribe that failed): kept on the sink, which a
        message listener's thread checks for every handle of every message."""
        return self._sink.closed

    @_closed.setter
    def _closed(self, value: bool) -> None:
        self._sink.closed = value

    def _fail(self, err: errors.ShadowTopicError) -> None:
        """`receive` raises `err` from now on, unless closed or failed already."""
        if not self._closed and self._error is None:
            self._error = err

    # ---- the stream's receive thread ---------------------------------------------------

    def _on_item(self, handle: int, item: Delivery | Exception) -> None:
        with self._cond:
            p = self._handles.get(handle)
            if p is None:
                return
            if isinstance(item, Exception):  # the stream ended: every handle with it
                err = (item if isinstance(item, errors.ShadowTopicError)
                       else errors.ConnectError(str(item)))
                if not self._resumer.broken(p, err):
                    self._end(p, err)
                self._notify()
                return
            frame = item.frame
            if len(frame.entries) and p.state == "open":
                self._inbox.add(p, item)
            if frame.HasField("event"):
                self._on_event(p, frame.event)
            self._notify()

    def _on_event(self, p: Part, ev: consumer_pb2.Event) -> None:
        kind = ev.WhichOneof("event")
        if kind == "subscribed":
            p.answer("subscribe", ev.subscribed)
        elif kind == "seek_done":
            sd = ev.seek_done
            p.epoch += 1  # drop what came before: the broker starts over with no permits
            p.consumed = 0
            if p.position is not None:
                p.position.seeked(MessageId.from_pb(sd.position))
            self._acks.forget(p)
            if self._redelivery is not None:
                self._redelivery.dropped(p.index)
            if p.state == "open" and not self._closed:
                self._flow(p, self._queue_size)
            if not sd.by_admin:
                p.answer("seek", sd)
        elif kind == "active_consumer_changed":
            p.active = ev.active_consumer_changed.is_active
            if self._events is not None and self._on_active_change is not None:
                try:
                    self._events.submit(_call_active_change, self._on_active_change, p.active)
                except RuntimeError:  # shut down: closing
                    pass
        elif kind == "warning":
            err = _typed(ev.warning)
            self.last_warning = err
            log.warning("consumer %s of %s on %s: %s: %s", self.consumer_name or "-",
                        self.subscription_name, p.topic, err.reason, err.message)
            # warnings are about acks, nacks and the like; one answers a pending seek or
            # unsubscribe only when it says so (details "command")
            command = ev.warning.details.get("command")
            if command in ("seek", "unsubscribe"):
                p.answer(command, err)
            elif command == "ack" and ev.warning.details.get("request_id", "").isdigit():
                self._acks.receipts.answer(int(ev.warning.details["request_id"]), err)
        elif kind == "ack_receipt":
            self._acks.receipts.answer(ev.ack_receipt.request_id, None)
        elif kind == "error":
            err = _typed(ev.error)
            if isinstance(err, errors.SubscriptionNotFound) and p.answer(
                    "unsubscribe", consumer_pb2.HandleClosed()):
                p.state = "ended"  # gone, as unsubscribe wanted (idempotent, like a delete)
                return
            # a refused seek or unsubscribe (ConsumerBusy, ...): that command fails and the
            # consumer goes on; any other error ends the handle
            if not (p.answer("unsubscribe", err) or p.answer("seek", err)
                    or self._resumer.broken(p, err)):
                self._end(p, err)
        elif kind == "closed":
            answered = [k for k in ("unsubscribe", "close") if p.answer(k, ev.closed)]
            if answered:
                p.state = "ended"
            else:
                self._end(p, errors.AlreadyClosed(f"the broker closed the consumer of {p.topic}"))

    def _end(self, p: Part, err: errors.ShadowTopicError) -> None:
        """The broker (or the stream) ended this handle: answer whoever waits, and an open
        consumer's `receive` raises `err` from now on."""
        # "subscribing" with its subscribe answered: the error came before the waiting thread
        # marked the partition open (it then leaves it ended); unanswered, the error answers
        # the subscribe below and the waiting thread decides (a resume tries again)
        answered = p.state == "subscribing" and p.waits.get("subscribe", 0) is not None
        if p.state == "open" or answered:
            self._fail(err)
        p.state = "ended"
        for kind in p.waits:
            p.answer(kind, err)
        self._acks.receipts.fail(err, p.handle)

    # ---- helpers (called with the condition held) ----------------------------------------

    def _notify(self) -> None:
        """Something changed (a frame, an answer, the end, a close): wake every waiting
        `receive` and every `poll` waker (condition held)."""
        self._cond.notify_all()
        if self._wakers:
            wakers, self._wakers = self._wakers, []
            for wake in wakers:
                wake()

    def _flow(self, p: Part, permits: int) -> None:
        p.send_quietly(flow=consumer_pb2.Flow(permits=permits))

    def _wait_answers(self, parts: list[Part], kind: str, timeout: float | None,
                      what: str) -> list[object]:
        return wait_answers(self._cond, parts, kind, timeout, what, lambda: self._closed)

    def _abandon(self, parts: list[Part]) -> None:
        """Leave `parts` without waiting (a subscribe that failed)."""
        for p in parts:
            if p.state != "ended":
                p.send_quietly(close=consumer_pb2.CloseHandle())
            p.state = "ended"
            self._handles.unregister(p)
        if self._events is not None:
            self._events.shutdown(wait=False)

    def _check_open(self, parts: list[Part]) -> None:
        """Every one of `parts` is open: `ServiceUnavailable` (retriable) while one
        reconnects, `AlreadyClosed` once one ended."""
        if any(p.state == "reconnecting" for p in parts):
            raise errors.ServiceUnavailable(f"the consumer of {self.topic} is reconnecting; "
                                            f"try again")
        if any(p.state != "open" for p in parts):
            raise errors.AlreadyClosed(f"the consumer of {self.topic} was ended")

    def _check(self) -> None:
        if self._closed:
            raise errors.AlreadyClosed(f"{self._kind} is closed")
        if self._error is not None:
            raise self._error

    def _next(self) -> Message | None:
        """The next message to return, or None when nothing (current) is buffered
        (condition held)."""
        if self._retry is not None and (letter := self._retry.take()) is not None:
            return letter  # a retry letter that is due (retry_letter.py)
        b = self._inbox.current
        while True:
            if b is not None and b.epoch == b.part.epoch and b.part.state != "ended":
                for msg in b.it:
                    b.last = msg
                    if b.plain or self._keep(b, msg):
                        return msg
            b = self._inbox.next_batch()
            if b is None:
                return None
            self._started(b)

    def _take_fast(self) -> Message | None:
        """A message of the frame being returned, taken without the lock (inbox.py), or
        None (then the caller takes the lock). A receive that runs while another thread
        seeks may return a message from before the seek."""
        b = self._inbox.current
        if (b is not None and b.plain and b.epoch == b.part.epoch and b.part.state != "ended"
                and self._error is None and not self._sink.closed):
            msg = next(b.it, None)
            if msg is not None:
                b.last = msg
                return msg
        return None

    def _started(self, b: Batch) -> None:
        """A frame's batch starts being returned: its messages count as consumed (permits
        go up again past half the queue), and whether they need a check each."""
        p = b.part
        p.consumed += len(b.msgs)
        if p.consumed >= self._flow_at:
            self._flow(p, p.consumed)
            p.consumed = 0
        # after a reconnect a message may be acknowledged already; the ack timeout and the
        # dead-letter policy are told what the application received
        b.plain = not p.resumed and self._redelivery is None

    def _keep(self, b: Batch, msg: Message) -> bool:
        """A message of a batch that is not plain: whether it is returned."""
        if self._acks.acked_already(b.part, msg):
            return False  # came again after a reconnect: acknowledged again instead
        if self._redelivery is not None:
            self._redelivery.received(msg, b.epoch)
        return True

    def _part_for(self, message: Message | MessageId | str) -> tuple[Part, MessageId]:
        if isinstance(message, Message):  # received: its id needs no checking
            mid = message.message_id
            p = self._handles.by_index.get(mid.partition)
            if p is not None:
                return p, MessageId(mid.ledger_id, mid.entry_id)
        elif isinstance(message, MessageId):
            mid = message
        elif isinstance(message, str):
            mid = MessageId.parse(message)
        else:
            raise errors.InvalidArgument(f"expected a Message or a MessageId, got {message!r}")
        p = self._handles.by_index.get(mid.partition)
        if p is None:
            if mid.partition < 0 and len(self._handles) == 1:
                p = next(iter(self._handles))
            elif mid.partition < 0:
                raise errors.InvalidArgument(f"message id {mid} names no partition of "
                                             f"{self.topic} (use the id of a received message)")
            else:
                raise errors.InvalidArgument(f"message id {mid}: partition {mid.partition} is "
                                             f"not one this consumer reads")
        return p, MessageId.checked(mid.ledger_id, mid.entry_id)

    def _command(self, parts: list[Part], kind: str,
                 **command: Unpack[Command]) -> list[object]:
        """Send a command that the broker answers to each of `parts`, wait for the answers
        (client timeout) and return them; raise the first typed error among them."""
        try:
            for p in parts:
                p.waits[kind] = None
                p.send(**command)
            answers = self._wait_answers(parts, kind, self._conn.timeout, kind)
        finally:
            for p in parts:
                p.waits.pop(kind, None)
        failure = next((a for a in answers if isinstance(a, BaseException)), None)
        if failure is not None:
            # what did succeed (an unsubscribe) is done
            for p, a in zip(parts, answers, strict=True):
                if kind == "unsubscribe" and not isinstance(a, BaseException):
                    p.state = "ended"
            raise failure
        return answers

    # ---- public API ------------------------------------------------------------------

    @property
    def consumer_type(self) -> str:
        """"exclusive", "shared", "failover" or "key_shared"."""
        return self._type

    @property
    def ack_receipt(self) -> bool:
        """Whether acknowledgements wait for the broker's receipt (`subscribe`'s option)."""
        return self._ack_receipt

    @property
    def is_active(self) -> bool | None:
        """Exclusive / Failover: whether this consumer gets the messages (of at least one of
        its partitions); None until the broker said."""
        states = [p.active for p in self._handles if p.active is not None]
        return None if not states else any(states)

    def receive(self, timeout: float | None = None) -> Message:
        """The next message. Raises `Timeout` when none arrives within `timeout` seconds
        (None: wait for ever), `AlreadyClosed` once the consumer (or its client) is closed,
        also while waiting in another thread, and the broker's typed error once it ended the
        consumer (topic deleted, ...)."""
        msg = self._take_fast()
        if msg is not None:
            return msg
        with self._cond:
            if self._sink.closed or self._error is not None:
                self._check()
            msg = self._next()  # (no clock read for a buffered message)
            if msg is not None:
                return msg
            deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
            while True:
                self._check()
                msg = self._next()
                if msg is not None:
                    return msg
                wait = WAIT_SLICE_S
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise errors.Timeout("no message received in time")
                    wait = min(wait, left)
                self._cond.wait(wait)

    def poll(self, wake: Callable[[], None] | None = None) -> Message | None:
        """The next message if one is here, else None without waiting; then `wake()` is
        called once (on the thread that changed something; it must not block) when a message
        may have come, or the consumer ended or closed: how the asyncio face waits
        (source/client/aio/). Raises as `receive` does."""
        msg = self._take_fast()
        if msg is not None:
            return msg
        with self._cond:
            self._check()
            msg = self._next()
            if msg is None and wake is not None:
                self._wakers.append(wake)
            return msg

    def has_buffered(self) -> bool:
        """Whether a message is here to be returned now (a reader's
        `has_message_available` asks this first). Raises as `receive` does."""
        with self._cond:
            self._check()
            return self._inbox.has_current()

    def partitions(self) -> list[tuple[str, int]]:
        """(topic, partition index) of each partition read, in order. Raises as
        `receive` does."""
        with self._cond:
            self._check()
            return sorted(((p.topic, p.index) for p in self._handles),
                          key=lambda t: t[1])

    def read_positions(self) -> list[tuple[str, ReadPosition]]:
        """A reader's (`durable=False`) position in each partition (read_position.py)."""
        with self._cond:
            self._check()
            self._inbox.sync_position()
            return [(p.topic, p.position) for p in self._handles if p.position is not None]

    def poll_batch(self, max_messages: int) -> list[Message]:
        """Up to `max_messages` messages that are here now, without waiting (an empty list
        when none are; raises as `receive` when the consumer ended or closed)."""
        out: list[Message] = []
        with self._cond:
            self._check()
            while len(out) < max_messages:
                msg = self._next()
                if msg is None:
                    break
                out.append(msg)
        return out

    def batch_receive(self, max_messages: int = 100, timeout: float | None = 0.1) -> list[Message]:
        """Up to `max_messages` messages: waits at most `timeout` seconds for the first (an
        empty list when none came), then takes what is already there without waiting."""
        check_max_messages(max_messages)
        try:
            out = [self.receive(timeout)]
        except errors.Timeout:
            return []
        with self._cond:
            while len(out) < max_messages:
                if self._closed or self._error is not None:
                    break
                msg = self._next()
                if msg is None:
                    break
                out.append(msg)
        return out

    def acknowledge(self, message: Message | MessageId) -> None:
        """Acknowledge one message: fire-and-forget (grouped with the other acks queued
        meanwhile into ranges: acks.py). With `ack_receipt`, returns only once the broker
        applied it and wrote the subscription's cursor to storage; raises the broker's typed
        refusal, or `Timeout` after the client's operation timeout."""
        if self._retry is not None and self._retry.owns(message, settle=True):
            return self._retry.consumer.acknowledge(message)
        if self._ack_receipt:
            wait_for_receipt(lambda done: self.acknowledge_async(message, done),
                             self._conn.timeout, "acknowledge")
            return
        with self._cond:  # (acknowledge_async's, inline: the path of every message)
            self._check()
            if message.__class__ is Message:  # received: its id needs no checking
                mid = message.message_id
                p = self._handles.by_index.get(mid[2])
                if p is None:
                    p, mid = self._part_for(message)
            else:
                p, mid = self._part_for(message)
            if self._redelivery is not None:
                self._redelivery.acked(p.index, mid)
            self._acks.send(p, mid[0], mid[1])

    def acknowledge_async(self, message: Message | MessageId,
                          callback: ReceiptCallback | None) -> None:
        """`acknowledge` without waiting: with `ack_receipt`, `callback(None)` once the broker
        applied it (and wrote the cursor), else `callback(error)`, called once on whichever
        thread hears it (it must not block); without, the ack is queued and `callback(None)`
        called at once. Raises what fails before anything is sent (`AlreadyClosed`,
        `InvalidArgument`, the consumer's error)."""
        if self._retry is not None and self._retry.owns(message, settle=True):
            return self._retry.consumer.acknowledge_async(message, callback)
        with self._cond:
            self._check()
            p, mid = self._part_for(message)
            if self._redelivery is not None:
                self._redelivery.acked(p.index, mid)
            if self._ack_receipt and callback is not None:
                self._acks.send_with_receipt(p, mid.ledger_id, mid.entry_id, False, callback)
                return
            self._acks.send(p, mid.ledger_id, mid.entry_id)
        if callback is not None:
            callback(None)

    def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledge every message of the partition up to and including this one. Refused
        (`NotAllowed`, nothing sent) on Shared and Key_Shared subscriptions. With
        `ack_receipt`, waits for the broker's receipt as `acknowledge` does. Refused
        (`NotAllowed`) for a retry letter (retry_letter.py)."""
        if self._ack_receipt:
            wait_for_receipt(lambda done: self.acknowledge_cumulative_async(message, done),
                             self._conn.timeout, "acknowledge_cumulative")
            return
        self.acknowledge_cumulative_async(message, None)

    def acknowledge_cumulative_async(self, message: Message | MessageId,
                                     callback: ReceiptCallback | None) -> None:
        """`acknowledge_cumulative` without waiting, `callback` as `acknowledge_async`'s."""
        if self._type in ("shared", "key_shared"):
            raise errors.NotAllowed(f"cumulative acknowledgement is not allowed on a "
                                    f"{self._type} subscription")
        if self._retry is not None and self._retry.owns(message):
            raise errors.NotAllowed("cumulative acknowledgement of a retry letter is not "
                                    "allowed (it would acknowledge the letters held for later)")
        with self._cond:
            self._check()
            p, mid = self._part_for(message)
            if self._redelivery is not None:
                self._redelivery.acked_upto(p.index, mid)
            if self._reconnector is not None:  # sent again after a reconnect
                p.cum_acked = max(p.cum_acked or (0, 0), (mid.ledger_id, mid.entry_id))
            if self._ack_receipt and callback is not None:
                self._acks.send_with_receipt(p, mid.ledger_id, mid.entry_id, True, callback)
                return
            if p.state != "reconnecting":
                p.send_quietly(ack=consumer_pb2.Ack(ids=[mid.to_pb()], cumulative=True))
        if callback is not None:
            callback(None)

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Ask for this message again after `negative_ack_redelivery_delay_ms`; under a
        dead-letter policy, past its count, send it to the dead-letter topic instead."""
        if self._retry is not None and self._retry.owns(message, settle=True):
            return self._retry.consumer.negative_acknowledge(message)
        with self._cond:
            self._check()
            p, mid = self._part_for(message)
            if self._redelivery is not None and self._redelivery.nacked(
                    p.index, mid, message if isinstance(message, Message) else None):
                return
            self._nack(p, mid, self._nack_delay)

    def _nack(self, p: Part, mid: MessageId, delay_ms: int) -> None:
        if p.state == "reconnecting":
            return  # not acknowledged: it comes again after the reconnect anyway
        p.send(nack=consumer_pb2.Nack(ids=[mid.to_pb()], delay_ms=delay_ms))

    def reconsume_later(self, message: Message, delay_s: float,
                        properties: dict[str, str] | None = None) -> None:
        """Have `message` come again in `delay_s` seconds (0 to 10 days) through the
        retry-letter topic, with `properties` added (Pulsar's `reconsumeLater`; needs
        `subscribe(..., retry_enable=True)`, else `NotAllowed`). Returns once its retry
        letter is stored and `message` acknowledged; when it was given back
        `max_redeliver_count` times already, it goes to the dead-letter topic instead. A
        failed send nacks `message` and raises the typed error. Format and guarantees:
        source/client/retry_letter.py."""
        if self._retry is None:
            raise errors.NotAllowed("reconsume_later needs a consumer subscribed with "
                                    "retry_enable=True (and a dead_letter_policy)")
        with self._cond:
            self._check()
        self._retry.reconsume_later(message, delay_s, properties, self.acknowledge,
                                    self.negative_acknowledge)

    # ---- what the ack timeout and the dead-letter policy ask (redelivery.py) ----------------

    def _current(self, msg: Message, epoch: int) -> bool:
        """`msg` (received in the partition's `epoch`) was not dropped since."""
        with self._cond:
            p = self._handles.by_index.get(msg.message_id.partition)
            return (not self._closed and p is not None and p.epoch == epoch
                    and p.state == "open")

    def _ask_again(self, msg: Message, epoch: int) -> None:
        """Its ack timeout passed: ask for `msg` again now, unless it was dropped since."""
        with self._cond:
            if self._current(msg, epoch):
                p, mid = self._part_for(msg)
                self._nack(p, mid, 0)

    def _renack(self, msg: Message) -> None:
        """Its dead-letter send failed: ask for `msg` again as a nack does."""
        with self._cond:
            self._check()
            p, mid = self._part_for(msg)
            self._nack(p, mid, self._nack_delay)

    def redeliver_unacknowledged_messages(self) -> None:
        """Have the broker redeliver every message this consumer holds unacknowledged, with
        no redelivery counted (the broker cannot tell which the application saw: nack the
        ones to count). What is buffered and not yet received is dropped (it is among them),
        and its permits are given back, as Pulsar's client does. The retry letters held for
        later are dropped too (they come again)."""
        if self._retry is not None:
            self._retry.redeliver()
        with self._cond:
            self._check()
            if self._redelivery is not None:
                self._redelivery.dropped()
            dropped = self._inbox.drop()  # what was buffered: its permits go back
            shared = self.consumer_type in ("shared", "key_shared")
            for p in self._handles:
                if p.state == "open":
                    p.send(redeliver=consumer_pb2.RedeliverUnacknowledged())
                    if shared and dropped.get(p.handle):
                        # (Exclusive / Failover rewind: the broker's seek_done re-flows)
                        self._flow(p, dropped[p.handle])

    def seek(self, position: MessageId | str | int) -> SeekResult:
        """Reset the subscription's cursor (for all its consumers) to a MessageId ("L:E"
        text too; an id with a partition seeks that partition, one without seeks every
        partition) or to a publish time (int, ms since the epoch: every partition). Waits
        for the broker; returns where the cursor landed and whether the position was clamped
        to the first or last message (several partitions: the lowest landing id, clamped if
        any was). Messages received before the seek are dropped."""
        with self._seek_lock, self._cond:
            self._check()
            pos, targets = seek_targets(position, self._handles.by_index)
            self._check_open(targets)
            answers = self._command(targets, "seek", seek=consumer_pb2.Seek(position=pos))
            landed = []
            for p, a in zip(targets, answers, strict=True):
                # (a seek is answered by a SeekDone, or by an error that _command raised)
                assert isinstance(a, consumer_pb2.SeekDone)
                landed.append((MessageId.from_pb(a.position).with_partition(p.index), a.clamped))
            return SeekResult(min(m for m, _ in landed), any(c for _, c in landed))

    def unsubscribe(self) -> None:
        """Delete the subscription and close this consumer. A refusal (e.g. `ConsumerBusy`
        while other consumers are attached) raises the typed error and leaves the consumer
        open."""
        with self._seek_lock, self._cond:
            self._check()
            self._check_open([p for p in self._handles if p.state != "ended"])
            parts = [p for p in self._handles if p.state == "open"]
            self._command(parts, "unsubscribe", unsubscribe=consumer_pb2.Unsubscribe())
        if self._retry is not None:  # the retry topic's subscription goes too
            self._retry.unsubscribe()
        self.close()

    def close(self) -> None:
        """Leave the subscription (the broker redelivers this consumer's unacknowledged
        messages to the others) and wait, briefly, for the broker to confirm. A `receive`
        waiting in another thread raises `AlreadyClosed` at once. Closing twice is a no-op."""
        self._finish_close(self._start_close(), time.monotonic() + min(self._conn.timeout,
                                                                        CLOSE_TIMEOUT_S))

    def _start_close(self) -> list[Part] | None:
        """Send the closes (None: closed already); `_finish_close` waits for the answers
        (the client closes thousands of consumers with one wait)."""
        if self._redelivery is not None:  # a dead-letter forward under way ends first
            self._redelivery.close()
        if self._retry is not None:  # the retry topic's consumer and producer
            self._retry.close()
        with self._cond:
            if self._closed:
                return None
            self._closed = True
            self._notify()
            sent = []
            for p in self._handles:
                if p.state in ("ended", "reconnecting"):  # nothing on a broker to close
                    continue
                try:
                    p.send(close=consumer_pb2.CloseHandle())
                except errors.ShadowTopicError:  # the stream is gone: nothing to close there
                    continue
                p.waits["close"] = None
                sent.append(p)
            return sent

    def _finish_close(self, sent: list[Part] | None, deadline: float) -> None:
        if sent is None:
            return
        with self._cond:
            try:
                self._wait_answers(sent, "close", max(0.0, deadline - time.monotonic()),
                                   "close")
            except errors.Timeout:
                pass
            finally:
                for p in self._handles:
                    p.state = "ended"
                self._inbox.drop()
        for p in self._handles:
            self._handles.unregister(p)
        self._acks.receipts.fail(errors.AlreadyClosed("the consumer closed before the broker's ack "
                                                 "receipt came (the ack may be applied)"))
        if self._events is not None:
            self._events.shutdown(wait=False)

    def __iter__(self) -> Iterator[Message]:
        """Every message, blocking for the next; ends once the consumer is closed."""
        while True:
            try:
                yield self.receive()
            except errors.AlreadyClosed:
                return

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Consumer(topic={self.topic!r}, subscription={self.subscription_name!r}, "
                f"type={self._type!r})")
