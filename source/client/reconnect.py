"""Consumers and readers reconnect by themselves after a broker restart, a lost lease or a
moved topic.

When does a partition reconnect? Each partition of a consumer or reader is one handle on
the client's Consumer.Connect stream (`stream.Multiplexer`). It reconnects when that handle
breaks with a retriable error (`errors.X.retriable`) once it was open:

- the stream ends or fails (the broker was killed, restarted or is unreachable:
  `ConnectError`, `ServiceUnavailable`; an orderly end of the stream is a `ConnectError`
  too), which breaks every handle on it;
- the broker ends the handle in-band with `TopicNotOwned` (the topic was unloaded or moved
  to another broker) or `Fenced` (the broker lost its lease), which breaks that handle only.

A non-retriable error (`TopicNotFound`: the topic was deleted; `NotAllowed`;
`AlreadyClosed`, the client closing) ends the consumer or reader as before: the next
`receive` / `read_next` raises it.

How? The owner (a `Consumer` or `Reader`) marks the partition `reconnecting` and hands
its `Owner` (a `Resumable`) to its client's one `Reconnector` (`start`). The Reconnector's
worker threads (a few per client, started on first use) make attempts for it: route the
topic again exactly as the open did (`Client._reroute`: metadata and Lookup through the
client's broker, so a shadow topic goes to its shadow broker and a moved topic to its new
owner), take the client's live stream to that broker (`Client._multiplexer` replaces a dead
one), then `owner.resume(mux, timeout)`: every partition of the owner still `reconnecting`
gets a new handle on that stream and subscribes again, and the attempt waits for the broker's
answers. A retriable failure is tried again after a pause (50 ms doubling to 1 s,
jittered, as the opening retries in retry.py); once the client's `operation_timeout` has
passed since the partition broke, the owner is given up (`owner.give_up(err)`) with the
last retriable error (a `Timeout` does not hide the error before it) and its next
`receive` / `read_next` raises it, typed. A non-retriable failure gives it up at once.
Meanwhile `receive` / `read_next` simply keep waiting within their own timeout.

Where does a partition resume?

- A reader (a non-durable consumer) resubscribes at the id after the last message it
  returned (exclusive), or where it was told to start or seek to when it returned nothing
  since (source/client/read_position.py). What was queued and not yet returned is dropped
  and comes again, as in Pulsar, so nothing is lost or read twice.
- A consumer resubscribes to its durable subscription; the broker delivers from the
  subscription's cursor again. What the consumer had buffered and not yet returned is
  dropped (it comes again), and what it returned and the user did not acknowledge comes
  again too: the documented at-least-once window, as in Pulsar. Acks that were in flight
  when the stream broke may be lost (and a broker killed with -9 loses the acks of its last
  cursor flush interval): the consumer remembers its last `ACK_MEMORY` individual acks and
  its last cumulative ack per partition, and after a reconnect it acknowledges such a
  message again instead of returning it. A seek forgets them (a seek is asked to deliver
  acknowledged messages again). Acks sent through a `subscribe_many` listener's
  `recipients.acknowledge` are not remembered: those messages may come again.

Shared streams: one stream per client and broker carries every consumer and reader of the
client on that broker. When it breaks, every handle on it breaks, so every owner on it
reconnects by itself, each with its own attempts and deadline; their attempts take the same
new stream (the client's one per broker), so after a restart they all share a stream again.
Each partition of a partitioned topic breaks and resumes on its own (one partition moving
to another broker moves that partition's handle only). Handles are numbered uniquely across
the client's streams, so a handle keeps meaning one partition whatever stream it is on.

Seek, nack and unsubscribe on a partition that is reconnecting raise the retriable error
(or are skipped, for nacks: the message comes again anyway); acks are remembered and sent
again after the reconnect.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from shadowtopic.client.connection import Connection
from shadowtopic.client.retry import MIN_ATTEMPT_S, Backoff
from shadowtopic.client.stream import Multiplexer
from shadowtopic.core import errors

log = logging.getLogger(__name__)

#: individual acks a consumer remembers, to acknowledge again what comes back after a reconnect
ACK_MEMORY = 10_000
WORKERS = 4          # attempt threads per client (started on first use)
IDLE_WAIT_S = 1.0    # a worker with nothing due looks at its queue at least this often
JOIN_S = 2.0         # the longest `close` waits for each worker


def reconnectable(err: BaseException) -> bool:
    """Whether a handle that broke with `err` reconnects (a retriable, typed error)."""
    return isinstance(err, errors.ShadowTopicError) and err.retriable


class Resumable(Protocol):
    """What the Reconnector drives: a consumer or a reader (its `Owner`)."""

    @property
    def topic(self) -> str:
        """The topic it reads (routed again before each attempt)."""

    def resume(self, mux: Multiplexer, timeout: float) -> None:
        """One attempt: every partition still reconnecting subscribes again on `mux`,
        waiting at most `timeout` seconds for the broker; raises why it failed."""

    def give_up(self, err: errors.ShadowTopicError) -> None:
        """Reconnecting failed for good: the next receive / read_next raises `err`."""


@dataclass(frozen=True, eq=False)
class Owner:
    """The `Resumable` a consumer or reader makes of itself once (its private `_resume` and
    `_give_up`) and hands to `Reconnector.start` each time a partition breaks."""

    topic: str
    resume: Callable[[Multiplexer, float], None]
    give_up: Callable[[errors.ShadowTopicError], None]


class _Job:
    __slots__ = ("owner", "deadline", "backoff", "why", "running", "again", "attempts")

    def __init__(self, owner: Resumable, deadline: float, backoff: Backoff):
        self.owner = owner
        self.deadline = deadline       # give up after a failed attempt past this
        self.backoff = backoff
        self.why: errors.ShadowTopicError | None = None  # the last error that was no Timeout
        self.running = False
        self.again = False             # another partition broke during the running attempt
        self.attempts = 0


class Reconnector:
    """The client's reconnecting owners and the threads that make their attempts."""

    def __init__(self, route: Callable[[str, float], tuple[Connection, Multiplexer]],
                 operation_timeout: float, workers: int = WORKERS,
                 clock: Callable[[], float] = time.monotonic,
                 rand: Callable[[], float] = random.random):
        """`route(topic, timeout) -> (connection, multiplexer)`: where `topic` is served
        now and the client's live stream there."""
        self._route = route
        self._operation_timeout = operation_timeout
        self._workers = workers
        self._clock = clock
        self._rand = rand
        self._cond = threading.Condition()
        self._jobs: dict[int, _Job] = {}  # id(owner) -> its job, while it reconnects
        self._due: list[tuple[float, int, _Job]] = []  # heap of (when, seq, job)
        self._seq = itertools.count()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def start(self, owner: Resumable) -> None:
        """`owner` has a partition to reconnect (called with the owner's lock held, on any
        thread: only queues)."""
        with self._cond:
            if self._closed:
                return
            job = self._jobs.get(id(owner))
            if job is not None:
                if job.running:
                    job.again = True
                return  # queued already: its attempt takes every broken partition
            job = self._jobs[id(owner)] = _Job(owner, self._clock() + self._operation_timeout,
                                                 Backoff(self._rand))
            self._push(job, self._clock())
            if len(self._threads) < self._workers:
                t = threading.Thread(target=self._run, daemon=True, name="client-reconnect")
                self._threads.append(t)
                t.start()

    def close(self, wait: bool = True) -> None:
        """Stop: no attempt starts from now on. With `wait`, wait (briefly) for the workers
        to end: an attempt under way ends once its owner or its stream is closed."""
        with self._cond:
            self._closed = True
            self._jobs.clear()
            self._due.clear()
            self._cond.notify_all()
            threads = list(self._threads)
        if not wait:
            return
        for t in threads:
            if t is not threading.current_thread():
                t.join(JOIN_S)

    # ---- the workers ---------------------------------------------------------------------

    def _push(self, job: _Job, when: float) -> None:
        heapq.heappush(self._due, (when, next(self._seq), job))
        self._cond.notify()

    def _next_job(self) -> _Job | None:
        """The next job due, marked running; None once closed."""
        with self._cond:
            while not self._closed:
                now = self._clock()
                if self._due and self._due[0][0] <= now:
                    job = heapq.heappop(self._due)[2]
                    job.running = True
                    job.again = False
                    return job
                wait = IDLE_WAIT_S if not self._due else min(IDLE_WAIT_S, self._due[0][0] - now)
                self._cond.wait(max(0.001, wait))
            return None

    def _run(self) -> None:
        while (job := self._next_job()) is not None:
            self._attempt(job)

    def _attempt(self, job: _Job) -> None:
        owner = job.owner
        job.attempts += 1
        err: errors.ShadowTopicError | None = None
        try:
            timeout = max(MIN_ATTEMPT_S, job.deadline - self._clock())
            conn, mux = self._route(owner.topic, timeout)
            owner.resume(mux, max(MIN_ATTEMPT_S, min(conn.timeout,
                                                     job.deadline - self._clock())))
        except errors.ShadowTopicError as exc:
            err = exc
        except Exception as exc:  # noqa: BLE001 - a channel closed under us, a bug: give up
            err = errors.Internal(f"reconnecting failed: {exc!r}")
        final: errors.ShadowTopicError | None = None
        with self._cond:
            job.running = False
            if self._jobs.get(id(owner)) is not job:
                return  # closed meanwhile
            now = self._clock()
            if err is None:
                if job.again:  # another partition broke meanwhile: at once, same deadline
                    self._push(job, now)
                else:
                    del self._jobs[id(owner)]
                return
            if not reconnectable(err):
                final = err
            else:
                pause = job.backoff.pause(job.deadline - now - MIN_ATTEMPT_S)
                if not isinstance(err, errors.Timeout):
                    job.why = err
                if pause >= 0.001:
                    self._push(job, now + pause)
                    return
                final = job.why if isinstance(err, errors.Timeout) and job.why else err
                final.add_note(f"gave up reconnecting after {job.attempts} attempts "
                                 f"(operation timeout {self._operation_timeout:g}s)")
            del self._jobs[id(owner)]
        log.warning("%s: reconnecting failed: %s: %s", owner.topic, final.reason,
                    final.message)
        owner.give_up(final)
