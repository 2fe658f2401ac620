"""Dead letters (Pulsar's `DeadLetterPolicy`): a message the application keeps giving back
goes to a dead-letter topic instead of coming again.

    policy = DeadLetterPolicy(max_redeliver_count=3)   # topic: <topic>-<subscription>-DLQ
    consumer = client.subscribe("orders", "billing", consumer_type="shared",
                                dead_letter_policy=policy)

When exactly: a message received with `redelivery_count >= max_redeliver_count` that the
application nacks (`negative_acknowledge`), or whose ack timeout passes (ack_timeout.py), is
not asked for again: after N redeliveries, the next nack sends it to the dead-letter topic.
With N = 2 the application receives it three times (counts 0, 1, 2) and the third nack
forwards it. Redelivery counts count what the application received and gave back
(docs/BEHAVIOURS.md C3a), plus the unacknowledged messages of a consumer that left.

Forwarding, at least once and never lossy: the consumer's `DeadLetters` produces the message
to the dead-letter topic, on a thread of its own (one per consumer, started by its first
forward), waits for the broker's receipt, THEN acknowledges the original. A crash in
between leaves the original unacknowledged: it comes again and may be forwarded a second
time (a duplicate in the dead-letter topic, never a loss). When the send fails, the message
is nacked as any other (it comes again later and is tried again). A second nack of a
message whose forward is under way does nothing.

The dead-letter message: the same payload, key and event time; its properties are the
original's plus (names as Pulsar's where Pulsar has one)

    REAL_TOPIC          the topic it was consumed from (a partitioned topic's parent name)
    ORIGIN_MESSAGE_ID   its id there, "L:E", or "L:E:P" on partition P
    REAL_SUBSCRIPTION   the subscription that gave it up
    REDELIVERY_COUNT    its redelivery count when it was given up
    DEAD_LETTER_REASON  "nack", "ack_timeout", or "reconsume_later" (a `reconsume_later`
                        past the count: retry_letter.py)

A retry letter (retry_letter.py) given up keeps the REAL_TOPIC and ORIGIN_MESSAGE_ID it
carries (those of the message first consumed), and its RECONSUMETIMES, DELAY_TIME and
DELIVER_AT_TIME, as any property.

The dead-letter topic (`dead_letter_topic`, default `<topic>-<subscription>-DLQ` as Pulsar)
is created through the admin API when missing (not partitioned) by the first forward; its
producer is the consumer's (not among the client's), closed with it.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass

from shadowtopic.client.message import Message
from shadowtopic.client.producer import Producer
from shadowtopic.core import errors
from shadowtopic.core.names import canonical

log = logging.getLogger(__name__)

MAX_REDELIVER_COUNT = (1 << 31) - 1
REAL_TOPIC = "REAL_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
REAL_SUBSCRIPTION = "REAL_SUBSCRIPTION"
REDELIVERY_COUNT = "REDELIVERY_COUNT"
REASON = "DEAD_LETTER_REASON"
NACK, ACK_TIMEOUT, RECONSUME_LATER = "nack", "ack_timeout", "reconsume_later"


@dataclass(frozen=True)
class DeadLetterPolicy:
    """After `max_redeliver_count` redeliveries (>= 1), the next nack or ack timeout of a
    message sends it to `dead_letter_topic` (default `<topic>-<subscription>-DLQ`). With
    `subscribe(..., retry_enable=True)`, `reconsume_later` sends messages through
    `retry_letter_topic` (default `<topic>-<subscription>-RETRY`), at most
    `max_redeliver_count` times each (retry_letter.py). `InvalidArgument`
    (`InvalidTopicName` for a topic) when made with a bad value."""

    max_redeliver_count: int
    dead_letter_topic: str | None = None
    retry_letter_topic: str | None = None

    def __post_init__(self) -> None:
        n = self.max_redeliver_count
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_REDELIVER_COUNT:
            raise errors.InvalidArgument(f"max_redeliver_count must be an integer in "
                                         f"1..{MAX_REDELIVER_COUNT}, got {n!r}")
        for what, name in (("dead_letter_topic", self.dead_letter_topic),
                           ("retry_letter_topic", self.retry_letter_topic)):
            if name is not None:
                if not isinstance(name, str):
                    raise errors.InvalidArgument(f"{what} must be a topic name, got {name!r}")
                canonical(name)

    def topic_for(self, topic: str, subscription: str) -> str:
        """The dead-letter topic of `subscription` on `topic` (canonical)."""
        return canonical(self.dead_letter_topic or f"{topic}-{subscription}-DLQ")

    def retry_topic_for(self, topic: str, subscription: str) -> str:
        """The retry-letter topic of `subscription` on `topic` (canonical)."""
        return canonical(self.retry_letter_topic or f"{topic}-{subscription}-RETRY")


def check_dead_letter_policy(policy: object) -> DeadLetterPolicy | None:
    """`policy` when it is None or a `DeadLetterPolicy`; `InvalidArgument` otherwise."""
    if policy is None:
        return None
    if not isinstance(policy, DeadLetterPolicy):
        raise errors.InvalidArgument(f"dead_letter_policy must be a DeadLetterPolicy, got "
                                     f"{policy!r}")
    return policy


def dead_letter_properties(msg: Message, topic: str, subscription: str, reason: str,
                           extra: dict[str, str] | None = None, keep_origin: bool = False
                           ) -> dict[str, str]:
    """The properties of `msg`'s dead-letter copy (see the module doc), consumed from
    `topic` (a partitioned topic's parent name), with `extra` over the message's own.
    `keep_origin` (`msg` is a retry letter): the REAL_TOPIC and ORIGIN_MESSAGE_ID it carries
    stay."""
    out = dict(msg.properties)
    if extra:
        out.update(extra)
    if not (keep_origin and REAL_TOPIC in msg.properties
            and ORIGIN_MESSAGE_ID in msg.properties):
        out.update({REAL_TOPIC: topic, ORIGIN_MESSAGE_ID: str(msg.message_id)})
    else:
        out.update({REAL_TOPIC: msg.properties[REAL_TOPIC],
                    ORIGIN_MESSAGE_ID: msg.properties[ORIGIN_MESSAGE_ID]})
    out.update({REAL_SUBSCRIPTION: subscription,
                REDELIVERY_COUNT: str(msg.redelivery_count), REASON: reason})
    return out


Done = Callable[[Message], None]


class DeadLetters:
    """One consumer's dead-letter forwarding: whether a given-back message is due
    (`due`), and its forward (`forward`), on a thread of its own."""

    def __init__(self, policy: DeadLetterPolicy, topic: str, origin_topic: str,
                 subscription: str, open_producer: Callable[[str], Producer],
                 keep_origin: bool = False):
        """`topic`: the dead-letter topic (canonical); `open_producer(topic)`: a producer of
        it, the topic created when missing (the client's). `keep_origin`: the messages
        forwarded are retry letters (retry_letter.py), whose origin is kept."""
        self.policy = policy
        self.keep_origin = keep_origin
        self.topic = topic
        self.origin_topic = origin_topic
        self.subscription = subscription
        self._open_producer = open_producer
        self._lock = threading.Lock()
        self._producer: Producer | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._inflight: set[tuple[int, int, int]] = set()  # (partition, ledger, entry)
        self._closed = False  # no forward starts; the one under way ends before the producer

    def due(self, msg: Message) -> bool:
        """`msg` goes to the dead-letter topic rather than coming again."""
        return msg.redelivery_count >= self.policy.max_redeliver_count

    def forward(self, msg: Message, reason: str, done: Done, failed: Done) -> None:
        """Send `msg` to the dead-letter topic, then `done(msg)` (acknowledge it), or
        `failed(msg)` (nack it) when the send failed; on the forwarding thread. A message
        whose forward is under way is not sent twice."""
        mid = msg.message_id
        key = (mid.partition, mid.ledger_id, mid.entry_id)
        with self._lock:
            if self._closed:
                raise errors.AlreadyClosed("consumer is closed")
            if key in self._inflight:
                return
            self._inflight.add(key)
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="dead-letter")
            self._executor.submit(self._forward, key, msg, reason, done, failed)

    def send(self, msg: Message, reason: str, extra: dict[str, str] | None,
             keep_origin: bool) -> None:
        """Send `msg` to the dead-letter topic now, on the forwarding thread (its producer's
        one user), and wait for the broker's receipt; raises the send's typed error, or
        `AlreadyClosed` when closed first. Acknowledging it is the caller's (retry_letter.py:
        `reconsume_later` past the count)."""
        with self._lock:
            if self._closed:
                raise errors.AlreadyClosed("consumer is closed")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="dead-letter")
            future = self._executor.submit(self._send, msg, reason, extra, keep_origin)
        try:
            future.result()
        except CancelledError:
            raise errors.AlreadyClosed("consumer closed before the dead-letter send") from None

    def _send(self, msg: Message, reason: str, extra: dict[str, str] | None = None,
              keep_origin: bool = False) -> None:
        self._producer_now().send(
            msg.payload, key=msg.key, event_time=msg.event_time,
            properties=dead_letter_properties(msg, self.origin_topic, self.subscription,
                                              reason, extra, keep_origin))

    def _forward(self, key: tuple[int, int, int], msg: Message, reason: str, done: Done,
                 failed: Done) -> None:
        try:
            try:
                self._send(msg, reason, keep_origin=self.keep_origin)
            except Exception as exc:  # noqa: BLE001 - any failure: the message comes again
                log.warning("dead-letter send of %s from %s to %s failed: %s",
                            msg.message_id, self.origin_topic, self.topic, exc)
                _call(failed, msg)
                return
            _call(done, msg)
        finally:
            with self._lock:
                self._inflight.discard(key)

    def _producer_now(self) -> Producer:
        """The producer, opened by the first forward (only the forwarding thread opens it,
        and `close` closes it once that thread is done)."""
        if self._producer is None:
            self._producer = self._open_producer(self.topic)
        return self._producer

    def close(self) -> None:
        """Wait for the forward under way (its acknowledgement goes out before the consumer
        closes), drop the ones queued (their messages stay unacknowledged: they come again),
        close the producer."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            executor = self._executor
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.close()
            except errors.ShadowTopicError as exc:
                log.warning("closing the dead-letter producer of %s: %s", self.topic, exc)


def _call(callback: Done, msg: Message) -> None:
    try:
        callback(msg)
    except errors.ShadowTopicError as exc:  # the consumer closed meanwhile: it comes again
        log.info("dead letter %s: %s", msg.message_id, exc)
