"""Disk policies of the topics a broker serves, and the backlog-quota gate of produce.

`apply(t, policies)` runs once per maintenance pass of every loaded topic (source and shadow;
source/broker/maintenance.py), and before each retention pass of a source, in this order:

    1. message TTL: every durable subscription acknowledges what is older than the TTL;
    2. subscription expiry: subscriptions without a consumer for that long are deleted;
    3. backlog quota: the slowest subscription's backlog against the quota
       (source/subscriptions/expiry.py); with the action consumer_backlog_eviction the
       subscriptions past it skip their oldest entries, and the quota is measured again;
    4. the topic's `QuotaGate` learns the result.

So retention, which runs right after, can delete what TTL and eviction acknowledged.

The gate, one per loaded topic, is what `Producer.Produce` asks before each append (`admit`;
one dict lookup while no quota is exceeded). While the quota is exceeded:

    producer_request_hold      the request waits (the client's send timeout bounds what the
                               producer sees; the broker holds it at most MAX_HOLD_S, then
                               fails it with `ProducerBlockedQuotaExceeded`). While requests
                               wait, the gate measures the quota again every RECHECK_S and
                               lets them through, in arrival order, once it is within (a
                               consumer caught up). A request arriving while earlier ones
                               still wait queues behind them, so a stream's order holds.
    producer_exception         the request fails at once with `ProducerBlockedQuotaExceeded`.
    consumer_backlog_eviction  produce is never blocked (eviction made room).

A shadow's subscriptions get steps 1-3 on the shadow broker; a shadow takes no produce, so
the producer actions do nothing there (its `backlog_quota_exceeded` still shows in stats).
A shadow knows the size of its source's sealed ledgers only (the open ledger's entries reach
it as ids), so a size quota on a shadow counts the backlog in sealed ledgers; an age quota
counts everything.
The quota is learned once per maintenance interval (`--retention-interval`): a topic can go
that far past its quota before produce is held or refused.
"""
from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable

from shadowtopic.broker.topic import Topic, effective
from shadowtopic.core import errors
from shadowtopic.core.policies import BacklogQuotaAction, Policies
from shadowtopic.subscriptions import expiry

log = logging.getLogger(__name__)

MAX_HOLD_S = 60.0      # a held produce request fails after this long
RECHECK_S = 0.25       # while requests are held, the quota is measured this often

HOLD = BacklogQuotaAction.PRODUCER_REQUEST_HOLD
EXCEPTION = BacklogQuotaAction.PRODUCER_EXCEPTION
EVICTION = BacklogQuotaAction.CONSUMER_BACKLOG_EVICTION


class QuotaGate:
    """Whether a topic takes produce requests now (module docstring)."""

    def __init__(self, topic: str):
        self.topic = topic
        self.exceeded = False
        self.action = HOLD
        self.check = expiry.QuotaCheck(False)
        #: measures the quota again (set by `apply`): True while it is still exceeded
        self.recheck: Callable[[], Awaitable[bool]] | None = None
        self._waiters: deque[asyncio.Future] = deque()
        self._watch: asyncio.Task | None = None

    def why(self) -> str:
        c = self.check
        age = "" if c.oldest_ms is None else \
            f", oldest unacknowledged {int(time.time() - c.oldest_ms / 1000)} s old"
        return (f"backlog quota of {self.topic} exceeded by subscription {c.subscription} "
                f"(~{c.backlog_bytes} bytes{age})")

    def admit(self) -> Awaitable[None] | None:
        """None: append now. An awaitable: wait for it first (held). Raises
        `ProducerBlockedQuotaExceeded` when the action is producer_exception."""
        if not self.exceeded and not self._waiters:
            return None
        if self.exceeded and self.action == EXCEPTION:
            raise errors.ProducerBlockedQuotaExceeded(self.why())
        if self.exceeded and self.action != HOLD and not self._waiters:
            return None
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        if not self.exceeded:
            fut.set_result(None)  # open: it only waits for the requests held before it
        else:
            self._start_watch()
        return self._wait(fut)

    async def _wait(self, fut: asyncio.Future) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(fut), MAX_HOLD_S)
        except TimeoutError:
            raise errors.ProducerBlockedQuotaExceeded(
                f"held {MAX_HOLD_S:.0f} s: {self.why()}") from None
        finally:
            try:
                self._waiters.remove(fut)
            except ValueError:
                pass

    def update(self, check: expiry.QuotaCheck, action: int) -> None:
        self.check = check
        self.exceeded = check.exceeded and action != EVICTION
        self.action = BacklogQuotaAction(action)
        if not self.exceeded or self.action != HOLD:
            self._release()

    def _release(self) -> None:
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)

    def _start_watch(self) -> None:
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self._watching())

    async def _watching(self) -> None:
        """While requests are held: measure again every RECHECK_S (bounded by MAX_HOLD_S
        past the last request held)."""
        while self._waiters and self.exceeded:
            await asyncio.sleep(RECHECK_S)
            try:
                still = await self.recheck() if self.recheck is not None else False
            except Exception as exc:  # noqa: BLE001 - measured again next round
                log.warning("%s: backlog quota not measured: %s", self.topic, exc)
                continue
            if not still:
                self.exceeded = False
                self._release()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        self._release()


_GATES: weakref.WeakKeyDictionary[Topic, QuotaGate] = weakref.WeakKeyDictionary()


def gate_of(t: Topic) -> QuotaGate:
    gate = _GATES.get(t)
    if gate is None:
        gate = _GATES[t] = QuotaGate(str(t.name))
    return gate


def admit(t: Topic) -> Awaitable[None] | None:
    """What `Producer.Produce` asks before appending to `t` (QuotaGate.admit)."""
    gate = _GATES.get(t)
    return None if gate is None else gate.admit()


def now_ms() -> int:
    return int(time.time() * 1000)


async def apply(t: Topic, p: Policies) -> None:
    """Message TTL, subscription expiry and the backlog quota of the loaded topic `t`
    (module docstring)."""
    ts = t.subscriptions
    if ts is None or ts.closed is not None:
        return
    now = now_ms()
    ttl = effective(p.message_ttl_seconds, "message_ttl_seconds")
    expiration = effective(p.subscription_expiration_seconds, "subscription_expiration_seconds")
    size = effective(p.backlog_quota_size_bytes, "backlog_quota_size_bytes")
    age = effective(p.backlog_quota_age_seconds, "backlog_quota_age_seconds")
    action = effective(p.backlog_quota_action, "backlog_quota_action")
    n = await expiry.expire_messages(ts, ttl, now)
    if n:
        log.info("%s: message TTL acknowledged %d messages", t.name, n)
    await expiry.expire_subscriptions(ts, expiration, now)
    check = await expiry.check_quota(ts, size, age, now)
    if check.exceeded and action == EVICTION:
        n = await expiry.evict(ts, size, age, now)
        log.info("%s: backlog quota eviction skipped %d messages", t.name, n)
        check = await expiry.check_quota(ts, size, age, now)
    if not check.exceeded and _GATES.get(t) is None:
        return  # nothing to gate: no gate is made for a topic never over its quota
    gate = gate_of(t)

    async def recheck() -> bool:
        if ts.closed is not None:
            return False
        again = await expiry.check_quota(ts, size, age, now_ms())
        gate.check = again
        return again.exceeded
    gate.recheck = recheck
    gate.update(check, action)


def exceeded(t: Topic) -> bool:
    """The topic's backlog quota was exceeded when last measured."""
    gate = _GATES.get(t)
    return gate is not None and gate.check.exceeded
