"""The ack timeout (Pulsar's `ackTimeoutMillis`): a message the application received
(`receive`, `batch_receive`) and did not acknowledge within `ack_timeout_ms` is asked for
again: the consumer nacks it with no delay, so it comes again with its redelivery count
raised (the application received it: docs/BEHAVIOURS.md C3a), or, under a dead-letter
policy and past its count, goes to the dead-letter topic (dead_letter.py).

    client.subscribe("orders", "billing", ack_timeout_ms=30_000)

`ack_timeout_ms`: 0 (the default) turns it off; otherwise at least `MIN_ACK_TIMEOUT_MS`
(1 s, Pulsar's minimum) and at most `MAX_ACK_TIMEOUT_MS`; anything else is
`InvalidArgument` before anything is sent. An acknowledgement (individual, or cumulative up
to the message) stops a message's timer, and so does a nack (the message comes again and
its timer starts anew when it is received again); a seek, anyone's, and
`redeliver_unacknowledged_messages` stop every timer of what they drop. A message is asked
for again between `ack_timeout_ms` and `ack_timeout_ms` + a few ms after it was received:
there is no tick granularity, the timer thread sleeps until the earliest deadline.

Two pieces, neither of which knows the consumer (redelivery.py composes them with it):

- `UnackedTracker`: a pure "unacknowledged since" map. The caller gives the time (monotonic
  seconds); `due(now)` takes out what has waited the timeout. Deadlines grow in insertion
  order (one timeout per tracker, `add` moves a key to the end), so `due` and `next_due`
  look at the front only.
- `AckTimer`: one thread per `Client`, started by the first registered check and ending
  when none is left, calling each check (`tick(now) -> its next deadline or None`) once the
  earliest deadline has passed; `wake` when a check's deadline came earlier (a tracker that
  was empty got a message). Checks run outside the timer's lock: a check may take its
  consumer's.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from shadowtopic.core import errors

log = logging.getLogger(__name__)

MIN_ACK_TIMEOUT_MS = 1000
MAX_ACK_TIMEOUT_MS = (1 << 32) - 1
IDLE_WAIT_S = 5.0  # the timer re-reads its checks at least this often (a lost wake)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def check_ack_timeout(ack_timeout_ms: int) -> int:
    """`ack_timeout_ms` as given when it is 0 (off) or in MIN..MAX; `InvalidArgument`
    otherwise."""
    if (not isinstance(ack_timeout_ms, int) or isinstance(ack_timeout_ms, bool)
            or not (ack_timeout_ms == 0
                    or MIN_ACK_TIMEOUT_MS <= ack_timeout_ms <= MAX_ACK_TIMEOUT_MS)):
        raise errors.InvalidArgument(
            f"ack_timeout_ms must be 0 (off) or an integer in {MIN_ACK_TIMEOUT_MS}.."
            f"{MAX_ACK_TIMEOUT_MS}, got {ack_timeout_ms!r}")
    return ack_timeout_ms


class UnackedTracker(Generic[K, V]):
    """Keys unacknowledged since a time, each with a value; not thread-safe (its owner
    locks)."""

    __slots__ = ("timeout", "_since")

    def __init__(self, timeout_s: float):
        self.timeout = timeout_s
        self._since: dict[K, tuple[float, V]] = {}  # in deadline order

    def __len__(self) -> int:
        return len(self._since)

    def __contains__(self, key: K) -> bool:
        return key in self._since

    def add(self, key: K, value: V, now: float) -> bool:
        """`key` is unacknowledged since `now` (its timer starts again if it ran); True when
        the tracker was empty (its next deadline is new)."""
        since = self._since
        was_empty = not since
        since.pop(key, None)
        since[key] = (now, value)
        return was_empty

    def remove(self, key: K) -> V | None:
        """Stop `key`'s timer; its value, None when it had none running."""
        found = self._since.pop(key, None)
        return None if found is None else found[1]

    def remove_where(self, pred: Callable[[K], bool]) -> None:
        """Stop the timer of every key for which `pred` holds (a cumulative ack, a seek)."""
        since = self._since
        for key in [k for k in since if pred(k)]:
            del since[key]

    def clear(self) -> None:
        self._since.clear()

    def due(self, now: float) -> list[tuple[K, V]]:
        """Take out every key whose timeout has passed at `now`, oldest first."""
        since, out = self._since, []
        timeout = self.timeout
        while since:
            key = next(iter(since))
            at, value = since[key]
            if at + timeout > now:
                break
            del since[key]
            out.append((key, value))
        return out

    def next_due(self) -> float | None:
        """When the oldest key's timeout passes (None: none is tracked)."""
        for at, _value in self._since.values():
            return at + self.timeout
        return None


Tick = Callable[[float], float | None]


class AckTimer:
    """One thread calling registered checks when their deadlines pass (see the module doc).
    The client's; `close` ends the thread."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._cond = threading.Condition()
        self._ticks: dict[int, Tick] = {}
        self._next_id = 0
        self._thread: threading.Thread | None = None
        self._woken = False
        self._closed = False

    def register(self, tick: Tick) -> int:
        """Call `tick(now)` from now on; the id to `unregister` it with."""
        with self._cond:
            if self._closed:
                raise errors.AlreadyClosed("client is closed")
            self._next_id += 1
            self._ticks[self._next_id] = tick
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="ack-timeout")
                self._thread.start()
            self._woken = True
            self._cond.notify_all()
            return self._next_id

    def unregister(self, tick_id: int) -> None:
        with self._cond:
            self._ticks.pop(tick_id, None)
            self._cond.notify_all()

    def wake(self) -> None:
        """A check's next deadline may be earlier than the thread is waiting for."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._ticks.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(IDLE_WAIT_S)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed or not self._ticks:
                    self._thread = None  # the next register starts another one
                    return
                self._woken = False
                ticks = list(self._ticks.values())
            now = self._clock()
            earliest = now + IDLE_WAIT_S
            for tick in ticks:
                try:
                    due = tick(now)
                except Exception:  # noqa: BLE001 - one consumer's failure stops no other
                    log.exception("ack timeout check failed")
                    due = None
                if due is not None:
                    earliest = min(earliest, due)
            with self._cond:
                if not self._woken and not self._closed and self._ticks:
                    self._cond.wait(max(0.0, earliest - self._clock()))
