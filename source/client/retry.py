"""The client's one retry loop: opening calls and admin calls retry temporary errors.

While a broker restarts, or a topic is reloaded or moves to another owner, the brokers
answer errors whose class is `retriable` (source/core/errors.py: `TopicNotOwned`,
`ServiceUnavailable`, `ConnectError`, `Timeout`, ...). The client retries such an error by
itself, with backoff (50 ms doubling up to 1 s, each pause jittered to 50-100% of it),
until the client's `operation_timeout` (seconds since the call began) has passed; then it
raises the last retriable error as it came (its class and `reason`), with a note saying how
long it retried. One exception: a `Timeout` of the last attempt, which the operation's end
cut short, does not hide the error before it ("the broker is away" says more than "no
answer in the 0.2 s left"). A non-retriable error (`NotAllowed`, `TopicNotFound`,
`ConsumerBusy`, ...) is raised at once. Each attempt gets the time left, at most the
client's per-call `timeout`, at least `MIN_ATTEMPT_S`: the last pause is cut short so that
a last attempt starts `MIN_ATTEMPT_S` before the end (a broker back just before it is
still reached).

What is retried, and what is not:

- Opening a producer, consumer (`subscribe`, `subscribe_many`) or reader, topic lookup
  included (every attempt looks the topic up again: its owner may have moved). A failed
  attempt has left its partitions already (nothing to undo), and a subscribe attaches to
  the subscription whether or not it exists, so a repeat does what the first would have.
- Admin calls that read, or that set an absolute state (`set_policies`, `reset_cursor`):
  doing them twice is doing them once. Every retriable error is retried (`retry_if=retriable`).
- Admin calls that are not idempotent (create / delete of a topic, shadow or subscription,
  `skip`, `clear_backlog`, `truncate`, `roll_ledger`, `compact`) retry only an error that
  guarantees the call was not applied (`retry_if=not_applied`): `TopicNotOwned` and
  `ServiceUnavailable` (exactly these reasons), which the brokers raise before acting or
  after taking back what they began, and a `ConnectError` of a channel that never reached
  the broker ("failed to connect ..."). Not `MetadataUnavailable` (an etcd write that timed
  out may have been applied), not `Timeout` (the broker may have acted after the deadline),
  not a `ConnectError` of a connection that broke mid-call: a retry after one of these could
  apply the call twice (skip twice as many messages) or answer a call that succeeded with
  `TopicAlreadyExists`. Those raise at once, for the caller to check.
- Not a produce send nor anything on an established producer, reader or consumer
  (`receive`, `seek`, acks) here: an established stream that breaks reconnects by itself
  (a producer resends what is unacknowledged, deduplicated by the broker: producer.py;
  consumers and readers resubscribe where they left off: reconnect.py), within the same
  operation timeout.

`Retry.run` holds the loop; its clock, sleep and random source can be replaced (tests).
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from shadowtopic.core import errors

T = TypeVar("T")

INITIAL_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0
MIN_ATTEMPT_S = 0.2  # the least time an attempt gets (the last starts this before the end)
#: how gRPC words an UNAVAILABLE of a channel that could not connect: nothing was sent
_NEVER_SENT = ("failed to connect to all addresses", "dns resolution failed")


def retriable(err: errors.ShadowTopicError) -> bool:
    """Retry whatever the error's class says is temporary (calls safe to repeat)."""
    return err.retriable


def not_applied(err: errors.ShadowTopicError) -> bool:
    """Retry only errors that guarantee the call was not applied (see the module doc)."""
    if err.reason in (errors.TopicNotOwned.reason, errors.ServiceUnavailable.reason):
        return True
    return isinstance(err, errors.ConnectError) and err.message.lower().startswith(_NEVER_SENT)


class Deadline:
    """When an operation must be done by (a `clock()` time)."""

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.at = clock() + timeout

    def left(self) -> float:
        """Seconds left (never below 0)."""
        return max(0.0, self.at - self._clock())

    def budget(self, cap: float) -> float:
        """The time an attempt may take: what is left, at most `cap`, at least
        `MIN_ATTEMPT_S` (an attempt always gets a usable, non-zero timeout)."""
        return max(MIN_ATTEMPT_S, min(cap, self.left()))


class Backoff:
    """The client's one backoff policy, for every retry and every reconnect (opening and
    admin calls here, consumers' and readers' reconnects in reconnect.py, a producer's
    stream in producer.py): pauses of 50 ms doubling to 1 s, each jittered to 50-100% of
    it so that clients a broker restart disconnected together do not come back together."""

    __slots__ = ("_next", "_rand")

    def __init__(self, rand: Callable[[], float] = random.random):
        self._next = INITIAL_BACKOFF_S
        self._rand = rand

    def pause(self, limit: float = MAX_BACKOFF_S) -> float:
        """The next pause, at most `limit` seconds; the one after is twice as long."""
        pause = min(self._next * (0.5 + self._rand() / 2), limit)
        self._next = min(self._next * 2, MAX_BACKOFF_S)
        return pause

    def reset(self) -> None:
        """It worked: the next pause is the first again."""
        self._next = INITIAL_BACKOFF_S


class Retry:
    """Runs an attempt until it succeeds, raises an error not to retry, or the operation
    timeout would pass (the module doc says which errors are retried and how)."""

    def __init__(self, operation_timeout: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 rand: Callable[[], float] = random.random):
        self.operation_timeout = operation_timeout
        self._clock = clock
        self._sleep = sleep
        self._rand = rand

    def run(self, attempt: Callable[[Deadline], T],
            retry_if: Callable[[errors.ShadowTopicError], bool] = retriable) -> T:
        """`attempt(deadline)` until it returns, or raises an error that `retry_if` says
        not to retry, or one when no time is left for another attempt; `deadline` is the
        whole operation's (an attempt takes `deadline.budget(per_call_timeout)` for each of
        its calls)."""
        deadline = Deadline(self.operation_timeout, self._clock)
        start = self._clock()
        backoff = Backoff(self._rand)
        attempts = 0
        why: errors.ShadowTopicError | None = None  # the last error that was not a Timeout
        while True:
            attempts += 1
            try:
                return attempt(deadline)
            except errors.ShadowTopicError as err:
                if not retry_if(err):
                    raise
                pause = backoff.pause(deadline.left() - MIN_ATTEMPT_S)
                if pause >= 0.001:  # (not a float's crumb of time: the last one was tried)
                    if not isinstance(err, errors.Timeout):
                        why = err
                    self._sleep(pause)
                    continue
                final = why if isinstance(err, errors.Timeout) and why is not None else err
                if attempts > 1:
                    final.add_note(f"gave up after {attempts} attempts in "
                                   f"{self._clock() - start:.1f}s (operation timeout "
                                   f"{self.operation_timeout:g}s)")
                if final is err:
                    raise
                raise final from err  # the error before the last attempt's Timeout
