"""What a consumer does about the messages its application received and has not
acknowledged: the ack timeout (ack_timeout.py) and the dead-letter policy (dead_letter.py),
composed for one consumer. A consumer with neither option has no `Redelivery` at all.

The consumer (consumer.py) tells it what happens to the messages it returns to the
application, with the consumer's condition held: `received` (a message returned by
`receive` / `batch_receive`), `acked`, `acked_upto` (cumulative), `nacked` (True: the
dead-letter policy took the message, the consumer sends no nack), `dropped` (a seek or
`redeliver_unacknowledged_messages` dropped what the partition, or every partition, held)
and `close`. In return it calls, never with its own lock held, from the client's timer
thread (an ack timeout) or the dead-letter thread (a forward's end), the callables the
consumer gave it:

    again(msg, epoch)    ask the broker for `msg` again now (a nack, no delay), unless a
                         seek or a reconnect dropped it since (it comes again anyway)
    current(msg, epoch)  `msg` was not dropped since it was received
    settle(msg)          acknowledge it: its dead-letter copy is stored
    retry(msg)           nack it as usual: its dead-letter send failed

Messages are known by (partition, ledger, entry); `epoch` is the partition's when the
message was received (consumer.py: +1 at every seek and reconnect). Under a dead-letter
policy a received message past its count is kept (`_held`, until acknowledged, nacked or
dropped) so that a nack by id alone can still forward its payload.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from shadowtopic.client.ack_timeout import AckTimer, UnackedTracker
from shadowtopic.client.dead_letter import ACK_TIMEOUT, NACK, DeadLetters
from shadowtopic.client.message import Message
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId

log = logging.getLogger(__name__)

Key = tuple[int, int, int]  # (partition, ledger, entry)


def _key(partition: int, mid: MessageId) -> Key:
    return (partition, mid.ledger_id, mid.entry_id)


class Redelivery:
    def __init__(self, ack_timeout_ms: int, dead_letters: DeadLetters | None,
                 timer: AckTimer, again: Callable[[Message, int], None],
                 current: Callable[[Message, int], bool], settle: Callable[[Message], None],
                 retry: Callable[[Message], None], clock: Callable[[], float] = time.monotonic):
        self._tracker: UnackedTracker[Key, tuple[Message, int]] | None = (
            UnackedTracker(ack_timeout_ms / 1000) if ack_timeout_ms else None)
        self._dead = dead_letters
        self._timer = timer
        self._again, self._current = again, current
        self._settle, self._retry = settle, retry
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[Key, Message] = {}
        self._tick_id: int | None = None  # registered with the timer at the first message
        self._closed = False

    # ---- what the consumer tells (its condition held) ---------------------------------------

    def received(self, msg: Message, epoch: int) -> None:
        mid = msg.message_id
        key = _key(mid.partition, mid)
        with self._lock:
            if self._closed:
                return
            if self._dead is not None and self._dead.due(msg):
                self._held[key] = msg
            if self._tracker is None:
                return
            first = self._tracker.add(key, (msg, epoch), self._clock())
            if self._tick_id is None:
                self._tick_id = self._timer.register(self.tick)
            elif first:
                self._timer.wake()

    def acked(self, partition: int, mid: MessageId) -> None:
        key = _key(partition, mid)
        with self._lock:
            if self._tracker is not None:
                self._tracker.remove(key)
            self._held.pop(key, None)

    def acked_upto(self, partition: int, mid: MessageId) -> None:
        top = (mid.ledger_id, mid.entry_id)
        self._drop(lambda k: k[0] == partition and (k[1], k[2]) <= top)

    def dropped(self, partition: int | None = None) -> None:
        """What `partition` (None: every partition) held was dropped: no timer runs for it."""
        self._drop(lambda k: partition is None or k[0] == partition)

    def _drop(self, pred: Callable[[Key], bool]) -> None:
        with self._lock:
            if self._tracker is not None:
                self._tracker.remove_where(pred)
            for key in [k for k in self._held if pred(k)]:
                del self._held[key]

    def nacked(self, partition: int, mid: MessageId, msg: Message | None) -> bool:
        """The application nacked `mid` (`msg`, when it gave the message): True when it goes
        to the dead-letter topic instead of coming again (the consumer then sends nothing)."""
        key = _key(partition, mid)
        with self._lock:
            if self._tracker is not None:
                self._tracker.remove(key)  # it comes again: timed anew when received
            held = self._held.pop(key, None)
        msg = msg if msg is not None else held
        if self._dead is None or msg is None or not self._dead.due(msg):
            return False
        self._dead.forward(msg, NACK, self._settle, self._retry)
        return True

    # ---- the timer thread ------------------------------------------------------------------

    def tick(self, now: float) -> float | None:
        """Ask again for (or forward) every message whose ack timeout passed; the next
        deadline."""
        with self._lock:
            if self._closed or self._tracker is None:
                return None
            due = self._tracker.due(now)
            for key, _value in due:
                self._held.pop(key, None)
            next_due = self._tracker.next_due()
        for _k, (msg, epoch) in due:
            try:
                if self._dead is not None and self._dead.due(msg):
                    if self._current(msg, epoch):
                        self._dead.forward(msg, ACK_TIMEOUT, self._settle, self._retry)
                else:
                    self._again(msg, epoch)
            except errors.ShadowTopicError as exc:  # closed meanwhile: it comes again
                log.info("ack timeout of %s: %s", msg.message_id, exc)
        return next_due

    def close(self) -> None:
        """Stop the timers and the dead-letter forwarding (waiting for a forward under way:
        call it without the consumer's condition held)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            tick_id, self._tick_id = self._tick_id, None
            if self._tracker is not None:
                self._tracker.clear()
            self._held.clear()
        if tick_id is not None:
            self._timer.unregister(tick_id)
        if self._dead is not None:
            self._dead.close()
