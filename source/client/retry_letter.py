"""Retry letters (Pulsar's `enableRetry` and `reconsumeLater`): the application hands a
message back to come again after a delay, through a retry-letter topic.

    policy = DeadLetterPolicy(max_redeliver_count=3)   # retry topic: <topic>-<sub>-RETRY
    consumer = client.subscribe("orders", "billing", consumer_type="shared",
                                dead_letter_policy=policy, retry_enable=True)
    msg = consumer.receive()
    consumer.reconsume_later(msg, 60)                   # comes again in a minute

**Two topics, one consumer.** With `retry_enable` the consumer reads its topic and the
retry-letter topic (`DeadLetterPolicy.retry_letter_topic`, default
`<topic>-<subscription>-RETRY` as Pulsar's; created through the admin API when missing, not
partitioned) under the same subscription name and type; that subscription starts at
`earliest`, so no letter sent before it existed is missed. `RetryLetters` owns the second
topic's consumer. The user's consumer asks it for a due letter before its own messages in
`receive`, `batch_receive` and `poll` (so the asyncio face too), and hands it the acks and
nacks of a retry letter: a `Message` says by its `topic`, a bare `MessageId` by being among
the letters returned and not yet acknowledged (ledger ids are unique in a cluster).

**`reconsume_later(msg, delay_s, properties=None)`**: at least once, never lost. The letter
is produced to the retry topic and the broker's receipt awaited, THEN the original is
acknowledged (where it came from: the topic, or the retry topic for a letter given back
again). A crash in between leaves the original unacknowledged: it comes again (and the letter
may be there twice). When the send fails the original is nacked (it comes again after the
nack delay) and the typed error raised. `delay_s`: seconds, 0 to `MAX_DELAY_S` (10 days),
finite; anything else is `InvalidArgument`, as is anything but a received `Message`.

**Past the count.** When the letter's RECONSUMETIMES would exceed `max_redeliver_count`, the
message goes to the dead-letter topic instead (dead_letter.py's `DeadLetters`, reason
`reconsume_later`, with `properties` too), then is acknowledged; so with N the application
gets the message N + 1 times (the original and N letters) and its next `reconsume_later`
gives it up.

**The letter**: the same payload, key and event time; its properties are the original's,
then `properties` (names below are the client's: they win), then

    RECONSUMETIMES     1 for the first retry, +1 at each (Pulsar's name)
    DELAY_TIME         the delay, ms (Pulsar's name)
    DELIVER_AT_TIME    when it is due, ms since the epoch by the sender's clock
    REAL_TOPIC         the topic the message was first consumed from (a partitioned
                       topic's parent name); a letter given back again keeps its own
    ORIGIN_MESSAGE_ID  its id there, "L:E" (or "L:E:P" on partition P); kept likewise

**Held until due.** The broker has no delayed delivery: a letter is delivered at once, and
the client holds it (`HoldHeap`, ordered by due time) until DELIVER_AT_TIME, then returns it.
A held letter is unacknowledged: a crash (or a close) brings it back from the broker, to this
consumer or another of the subscription, and it is held again until its time (at once when it
passed). Messages of the topic flow meanwhile. At most `receiver_queue_size` letters are held
and due at a time: past that none more is taken from the retry consumer, whose permits then
stop, and the broker keeps the rest. The due time is the sender's wall clock; a consumer whose
clock is behind holds a letter that much longer.

Threads: the client's timer thread (ack_timeout.py's `AckTimer`) runs `tick`: it takes what
the retry consumer received, holds it, moves what is due to the ready queue and wakes the
user's consumer (`notify`, which takes that consumer's condition; `tick` holds no lock then).
The retry consumer wakes the timer when a frame comes (its `poll` waker). `take` is called
with the user's consumer's condition held and takes this object's lock only.

**What the retry topic's consumer does otherwise.** A letter's nack asks for it again after
the nack delay, counted; past `max_redeliver_count` redeliveries it goes to the dead-letter
topic (reason `nack`, its origin kept). `ack_timeout_ms` does not apply to letters (a held
letter would time out while it waits). A cumulative ack of a letter is `NotAllowed` (it would
acknowledge the letters held for later). `seek` moves the topic's subscription only;
`redeliver_unacknowledged_messages` drops the held letters too (they come again);
`unsubscribe` and `close` end both.
"""
from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Protocol

from shadowtopic.client.ack_timeout import AckTimer
from shadowtopic.client.acks import ReceiptCallback
from shadowtopic.client.dead_letter import (
    ORIGIN_MESSAGE_ID,
    REAL_TOPIC,
    RECONSUME_LATER,
    DeadLetters,
)
from shadowtopic.client.message import Message
from shadowtopic.client.producer import Producer
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId

log = logging.getLogger(__name__)

RECONSUME_TIMES = "RECONSUMETIMES"
DELAY_TIME = "DELAY_TIME"
DELIVER_AT_TIME = "DELIVER_AT_TIME"
MAX_DELAY_S = 10 * 24 * 3600  # 10 days

Key = tuple[int, int]  # (ledger, entry): unique in a cluster


def check_delay(delay_s: object) -> float:
    """`delay_s` as seconds when it is a finite number in 0..MAX_DELAY_S; `InvalidArgument`
    otherwise."""
    if (isinstance(delay_s, bool) or not isinstance(delay_s, int | float)
            or not math.isfinite(delay_s) or not 0 <= delay_s <= MAX_DELAY_S):
        raise errors.InvalidArgument(f"delay_s must be a number of seconds in 0..{MAX_DELAY_S} "
                                     f"(10 days), got {delay_s!r}")
    return float(delay_s)


def check_properties(properties: object) -> dict[str, str]:
    """`properties` as a dict of text to text (None: empty); `InvalidArgument` otherwise."""
    if properties is None:
        return {}
    if not isinstance(properties, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in properties.items()):
        raise errors.InvalidArgument(f"properties must map text to text, got {properties!r}")
    return dict(properties)


def reconsume_times(msg: Message) -> int:
    """The RECONSUMETIMES of `msg`'s next letter: its own + 1 (1 when it has none, or one
    that is not a count)."""
    text = msg.properties.get(RECONSUME_TIMES, "0")
    try:
        times = int(text)
    except ValueError:
        times = 0
    return max(0, times) + 1


def retry_properties(msg: Message, origin_topic: str, times: int, delay_ms: int,
                     deliver_at_ms: int, extra: dict[str, str], letter: bool
                     ) -> dict[str, str]:
    """The properties of `msg`'s retry letter (the module doc); `letter`: `msg` is itself a
    letter (its origin stays), else it was consumed from `origin_topic`."""
    out = dict(msg.properties)
    out.update(extra)
    own = msg.properties
    if letter and REAL_TOPIC in own and ORIGIN_MESSAGE_ID in own:
        out[REAL_TOPIC], out[ORIGIN_MESSAGE_ID] = own[REAL_TOPIC], own[ORIGIN_MESSAGE_ID]
    else:
        out[REAL_TOPIC], out[ORIGIN_MESSAGE_ID] = origin_topic, str(msg.message_id)
    out[RECONSUME_TIMES] = str(times)
    out[DELAY_TIME] = str(delay_ms)
    out[DELIVER_AT_TIME] = str(deliver_at_ms)
    return out


def due_at(msg: Message, now: float, wall_s: float) -> float:
    """When (on the clock that said `now`) the letter `msg` is due, the wall clock saying
    `wall_s` at the same moment: now when it carries no DELIVER_AT_TIME, or one that is not
    a time. A millisecond late rather than early (the two clocks are read one after the
    other)."""
    try:
        at_ms = int(msg.properties.get(DELIVER_AT_TIME, ""))
    except ValueError:
        return now
    return now + max(0.0, at_ms / 1000 - wall_s + 0.001)


def _key(mid: MessageId) -> Key:
    return (mid.ledger_id, mid.entry_id)


class HoldHeap:
    """Letters held until they are due, earliest first; one entry per id (a letter that
    comes again while held is held once). Not thread-safe: its owner locks."""

    __slots__ = ("_heap", "_held", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Key]] = []
        self._held: dict[Key, Message] = {}
        self._seq = 0  # ties: in arrival order

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: Key) -> bool:
        return key in self._held

    def add(self, msg: Message, due: float) -> bool:
        """Hold `msg` until `due`; False (nothing changes) when it is held already."""
        key = _key(msg.message_id)
        if key in self._held:
            return False
        self._held[key] = msg
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, key))
        return True

    def pop_due(self, now: float) -> list[Message]:
        """Take out every letter due at `now`, earliest first."""
        out = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _due, _seq, key = heapq.heappop(heap)
            out.append(self._held.pop(key))
        return out

    def next_due(self) -> float | None:
        """When the earliest held letter is due (None: none is held)."""
        return self._heap[0][0] if self._heap else None

    def clear(self) -> None:
        self._heap.clear()
        self._held.clear()


class RetryConsumer(Protocol):
    """What `RetryLetters` asks of the retry topic's consumer (a `consumer.Consumer`)."""

    def poll(self, wake: Callable[[], None] | None = None) -> Message | None: ...
    def partitions(self) -> list[tuple[str, int]]: ...
    def acknowledge(self, message: Message | MessageId) -> None: ...
    def acknowledge_async(self, message: Message | MessageId,
                          callback: ReceiptCallback | None) -> None: ...
    def negative_acknowledge(self, message: Message | MessageId) -> None: ...
    def redeliver_unacknowledged_messages(self) -> None: ...
    def unsubscribe(self) -> None: ...
    def close(self) -> None: ...


class RetryLetters:
    """One consumer's retry-letter topic: its consumer (`consumer`), the letters held until
    due, and `reconsume_later` (see the module doc)."""

    def __init__(self, consumer: RetryConsumer, topic: str, origin_topic: str,
                 dead_letters: DeadLetters, open_producer: Callable[[str], Producer],
                 timer: AckTimer, hold_limit: int,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        """`consumer`: of `topic` (the retry topic, canonical), subscribed; `origin_topic`:
        the user's consumer's topic; `dead_letters`: the retry consumer's (letters given up
        keep their origin); `open_producer(topic)`: a producer of the retry topic (the
        client's); `timer`: the client's; `hold_limit`: letters held and due at most."""
        self.consumer = consumer
        self.topic = topic
        self.origin_topic = origin_topic
        self._dead = dead_letters
        self._open_producer = open_producer
        self._timer = timer
        self._hold_limit = max(1, hold_limit)
        self._clock, self._wall = clock, wall
        self._topics = frozenset(name for name, _index in consumer.partitions())
        self._lock = threading.Lock()
        self._held = HoldHeap()
        self._ready: deque[Message] = deque()  # due, not yet returned
        self._ready_keys: set[Key] = set()
        self._returned: set[Key] = set()  # returned, neither acknowledged nor nacked here
        self._armed = False  # a waker is with the retry consumer (only `tick` polls it)
        self._full = False  # the last tick left letters with the retry consumer for room
        self._notify: Callable[[], None] | None = None
        self._tick_id: int | None = None
        self._error: errors.ShadowTopicError | None = None
        self._closed = False
        self._producer_lock = threading.Lock()
        self._producer: Producer | None = None

    def start(self, notify: Callable[[], None]) -> None:
        """From now on call `notify()` (the user's consumer: wake whoever waits) when a
        letter is due or the retry consumer ended. A second call replaces `notify` (the
        client's open may make the user's consumer again)."""
        with self._lock:
            if self._closed:
                raise errors.AlreadyClosed("consumer is closed")
            self._notify = notify
            register = self._tick_id is None
        if register:
            tick_id = self._timer.register(self.tick)
            with self._lock:
                self._tick_id = tick_id
                closed = self._closed
            if closed:
                self._timer.unregister(tick_id)

    # ---- the user's consumer (its condition held) -------------------------------------

    def take(self) -> Message | None:
        """The next due letter, or None; raises the retry consumer's error once it ended."""
        if not self._ready and self._error is None:
            return None
        with self._lock:
            if self._error is not None:
                raise self._error
            if not self._ready:
                return None
            msg = self._ready.popleft()
            key = _key(msg.message_id)
            self._ready_keys.discard(key)
            self._returned.add(key)
            full, self._full = self._full, False
        if full:
            self._timer.wake()  # room again: take what the retry consumer holds
        return msg

    def owns(self, message: Message | MessageId | str, settle: bool = False) -> bool:
        """Whether `message` is a letter (its acks and nacks go to `consumer`); `settle`:
        it is being acknowledged or nacked (no longer among those returned)."""
        if isinstance(message, Message):
            if message.topic not in self._topics:
                return False
            if settle and self._returned:
                with self._lock:
                    self._returned.discard(_key(message.message_id))
            return True
        if not self._returned:
            return False
        if isinstance(message, str):
            try:
                message = MessageId.parse(message)
            except errors.InvalidArgument:
                return False  # (the user's consumer says what is wrong with it)
        if not isinstance(message, MessageId):
            return False
        key = _key(message)
        with self._lock:
            if key not in self._returned:
                return False
            if settle:
                self._returned.discard(key)
            return True

    def reconsume_later(self, msg: Message, delay_s: float, properties: dict[str, str] | None,
                        ack: Callable[[Message], None], nack: Callable[[Message], None]
                        ) -> None:
        """Send `msg`'s letter (or, past the count, its dead letter), wait for the receipt,
        then `ack(msg)`; on a failed send `nack(msg)` and raise (the module doc)."""
        if not isinstance(msg, Message):
            raise errors.InvalidArgument(f"reconsume_later takes a received Message, "
                                         f"got {msg!r}")
        delay = check_delay(delay_s)
        extra = check_properties(properties)
        letter = msg.topic in self._topics
        times = reconsume_times(msg)
        try:
            if times > self._dead.policy.max_redeliver_count:
                self._dead.send(msg, RECONSUME_LATER, extra, keep_origin=letter)
            else:
                delay_ms = round(delay * 1000)
                # (the send time rounded up: the letter is never due before its delay)
                deliver_at_ms = math.ceil(self._wall() * 1000) + delay_ms
                self._producer_now().send(
                    msg.payload, key=msg.key, event_time=msg.event_time,
                    properties=retry_properties(msg, self.origin_topic, times, delay_ms,
                                                deliver_at_ms, extra, letter))
        except errors.ShadowTopicError as exc:
            log.warning("reconsume_later of %s from %s: the send failed (%s); nacked",
                        msg.message_id, msg.topic, exc)
            try:
                nack(msg)
            except errors.ShadowTopicError:  # closed meanwhile: it comes again anyway
                pass
            raise
        ack(msg)

    def _producer_now(self) -> Producer:
        with self._producer_lock:
            if self._closed:
                raise errors.AlreadyClosed("consumer is closed")
            if self._producer is None:
                self._producer = self._open_producer(self.topic)
            return self._producer

    def redeliver(self) -> None:
        """Drop the held letters and have the broker redeliver every unacknowledged letter
        (`redeliver_unacknowledged_messages`)."""
        with self._lock:
            self._held.clear()
            self._ready.clear()
            self._ready_keys.clear()
            self._returned.clear()
        self.consumer.redeliver_unacknowledged_messages()

    # ---- the timer thread --------------------------------------------------------------

    def tick(self, now: float) -> float | None:
        """Take what the retry consumer received, hold it, make what is due ready (and wake
        the user's consumer); the next letter's due time."""
        with self._lock:
            if self._closed:
                return None
            room = self._hold_limit - len(self._held) - len(self._ready)
        polled, full, error = self._drain(room)
        # both clocks read now, side by side: `now` was read before the drain, and a due
        # time mapped from a later wall reading would come early by the drain's time
        wall, mono = self._wall(), self._clock()
        with self._lock:
            if self._closed:
                return None
            self._full = full
            if error is not None and self._error is None:
                self._error = error
            for msg in polled:
                key = _key(msg.message_id)
                if key not in self._ready_keys:  # (one that came again while due: once)
                    self._held.add(msg, due_at(msg, mono, wall))
            due = self._held.pop_due(now)
            for msg in due:
                self._ready.append(msg)
                self._ready_keys.add(_key(msg.message_id))
            wake = self._notify if due or error is not None else None
            next_due = self._held.next_due()
        if wake is not None:
            wake()
        return next_due

    def _drain(self, room: int
               ) -> tuple[list[Message], bool, errors.ShadowTopicError | None]:
        """Up to `room` letters from the retry consumer, leaving a waker with it once it has
        none; whether it stopped for room (letters may wait there); its error, when it
        ended."""
        out: list[Message] = []
        try:
            while len(out) < room:
                wake = None
                if not self._armed:
                    self._armed = True  # (before: the waker may fire at once)
                    wake = self._on_frame
                msg = self.consumer.poll(wake)
                if msg is None:
                    return out, False, None
                if wake is not None:
                    self._armed = False  # it had a message: no waker was left
                out.append(msg)
            return out, True, None
        except errors.AlreadyClosed:
            return out, False, None  # (closing: the user's consumer is too)
        except errors.ShadowTopicError as exc:
            return out, False, exc

    def _on_frame(self) -> None:
        """The retry consumer's waker (on its thread, its condition held): tick soon."""
        self._armed = False
        self._timer.wake()

    # ---- the end --------------------------------------------------------------------------

    def unsubscribe(self) -> None:
        """Delete the retry topic's subscription (the user's consumer unsubscribed); a
        refusal is logged, the retry consumer closed all the same."""
        try:
            self.consumer.unsubscribe()
        except errors.ShadowTopicError as exc:
            log.warning("unsubscribing from the retry topic %s: %s", self.topic, exc)
        self.close()

    def close(self) -> None:
        """Stop holding (the held letters stay unacknowledged: they come again), close the
        retry consumer and the retry producer. Call it without the user's consumer's
        condition held."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            tick_id, self._tick_id = self._tick_id, None
            self._notify = None
            self._held.clear()
            self._ready.clear()
            self._ready_keys.clear()
            self._returned.clear()
        if tick_id is not None:
            self._timer.unregister(tick_id)
        try:
            self.consumer.close()
        except errors.ShadowTopicError as exc:
            log.warning("closing the consumer of the retry topic %s: %s", self.topic, exc)
        with self._producer_lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.close()
            except errors.ShadowTopicError as exc:
                log.warning("closing the producer of the retry topic %s: %s", self.topic, exc)
