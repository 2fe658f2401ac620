"""Disk policies over a topic's durable subscriptions: message TTL, backlog quota
measurement and eviction, subscription expiry (Pulsar's expiry monitor, backlog quota
checker and inactive-subscription sweep). The broker's maintenance pass calls these for
every loaded topic, a shadow's too (source/broker/quota.py); nothing here owns a task.

    message_ttl_seconds  every durable subscription acknowledges the entries published
                         before now - ttl: its mark-delete moves to just before the first
                         entry at or after that time (`view.position_at_time`); counted in
                         `Subscription.expired`.
    backlog quota        a subscription's backlog is its unacknowledged entries from its
                         first one on: `backlog_bytes` estimates their size from each
                         ledger's size and entry count (Pulsar estimates from ledger sizes
                         too), `oldest_unacked_ms` is the publish time of the first one. The
                         topic is over its quota when the slowest subscription is (the one
                         whose first unacknowledged entry is oldest; `check_quota`).
                         `evict` (action consumer_backlog_eviction) moves every subscription
                         past a limit to within it, oldest entries first; counted in
                         `Subscription.evicted`.
    subscription_expiration_seconds
                         a durable subscription with no consumer attached since
                         `Subscription.last_active` that long ago is deleted (as an admin's
                         unsubscribe). `last_active` is persisted with the cursor
                         (saved within a flush interval of the last consumer detaching), so
                         a restart or a move of the topic does not restart the count; a
                         subscription whose cursor was saved while a consumer was attached,
                         or before the time was persisted, counts from its load.

Acknowledging by policy is an ack like any other: the cursor is saved with the next flush,
entries held for redelivery are forgotten, and retention may then delete the ledgers no
subscription needs. A read_compacted subscription is measured and moved by its own view.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.cursors.state import pack, unpack
from shadowtopic.subscriptions.subscription import Subscription

log = logging.getLogger(__name__)


class TopicSubscriptions(Protocol):
    """What these policies use of a topic's subscriptions (source/subscriptions/topic.py,
    which imports this module: a protocol here, not an import back)."""

    @property
    def topic(self) -> object: ...  # (read only: its TopicName, for log lines)

    subs: dict[str, Subscription]

    async def delete(self, name: str, force: bool, dry_run: bool) -> object: ...


@dataclass(frozen=True)
class QuotaCheck:
    """The slowest subscription's backlog against a topic's quota."""
    exceeded: bool
    subscription: str = ""        # the slowest subscription ("" without any backlog)
    backlog_bytes: int = 0
    oldest_ms: int | None = None  # publish time of its first unacknowledged entry


def first_unacked(sub: Subscription) -> MessageId:
    return sub.cursor.read_position(sub.next_after)


def ack_before(sub: Subscription, position: MessageId) -> int:
    """Acknowledge every entry of `sub` before `position`; how many were unacknowledged."""
    if position <= first_unacked(sub):
        return 0
    n = sub.cursor.backlog(sub.view.entries_between, position)
    sub.own().ack_cumulative(unpack(pack(position) - 1), sub.next_after)
    sub.acked_by_admin()
    return n


async def expire_messages(ts: TopicSubscriptions, ttl_s: int, now_ms: int) -> int:
    """Message TTL: every durable subscription acknowledges what was published more than
    `ttl_s` before `now_ms`. Returns how many acknowledgements that made."""
    if ttl_s <= 0 or not ts.subs:
        return 0
    cutoff_ms = now_ms - ttl_s * 1000
    cutoffs: dict[int, MessageId] = {}
    total = 0
    for sub in list(ts.subs.values()):
        view = sub.view
        if first_unacked(sub) >= view.next_position():
            continue
        cutoff = cutoffs.get(id(view))
        if cutoff is None:
            cutoff = cutoffs[id(view)] = await view.position_at_time(cutoff_ms)
        if ts.subs.get(sub.name) is not sub:
            continue  # deleted meanwhile
        n = ack_before(sub, cutoff)
        sub.expired += n
        total += n
    return total


def backlog_bytes(sub: Subscription) -> int:
    """An estimate of the bytes of `sub`'s unacknowledged entries: per ledger, its
    unacknowledged entries times the ledger's average entry size."""
    view, cursor = sub.view, sub.cursor
    start = first_unacked(sub)
    total = counted = 0
    for r in view.ranges():
        if not r.entries or r.ledger_id < start.ledger_id:
            continue
        upto = cursor.backlog(view.entries_between, MessageId(r.ledger_id, r.entries))
        total += (upto - counted) * r.size_bytes // r.entries
        counted = upto
    return total


async def oldest_unacked_ms(sub: Subscription) -> int | None:
    """The publish time of `sub`'s first unacknowledged entry (None: no backlog)."""
    p = first_unacked(sub)
    if p >= sub.view.next_position():
        return None
    got = await sub.view.read(p, 1, 1 << 20)
    return got[0].publish_ms if got else None


def slowest(ts: TopicSubscriptions) -> Subscription | None:
    """The subscription whose first unacknowledged entry is the oldest (None: no
    subscription has a backlog)."""
    best, where = None, None
    for sub in ts.subs.values():
        p = first_unacked(sub)
        if p >= sub.view.next_position():
            continue
        if where is None or p < where:
            best, where = sub, p
    return best


async def over_quota(sub: Subscription, size_bytes: int, age_s: int, now_ms: int
                     ) -> tuple[bool, int, int | None]:
    """(past a limit, its backlog bytes, its oldest unacknowledged publish time)."""
    size = backlog_bytes(sub) if size_bytes >= 0 else 0
    oldest = await oldest_unacked_ms(sub) if age_s >= 0 else None
    past = (size_bytes >= 0 and size > size_bytes) or \
        (oldest is not None and now_ms - oldest > age_s * 1000)
    return past, size, oldest


async def check_quota(ts: TopicSubscriptions, size_bytes: int, age_s: int, now_ms: int
                      ) -> QuotaCheck:
    """The topic's backlog against its quota (-1: no limit), measured on the slowest
    subscription; every subscription's `over_quota` flag is set (each one is measured only
    when the slowest is over: otherwise none is)."""
    for each in ts.subs.values():
        each.over_quota = False
    if size_bytes < 0 and age_s < 0:
        return QuotaCheck(False)
    sub = slowest(ts)
    if sub is None:
        return QuotaCheck(False)
    past, size, oldest = await over_quota(sub, size_bytes, age_s, now_ms)
    if past:
        for other in list(ts.subs.values()):
            other.over_quota = other is sub or (await over_quota(other, size_bytes, age_s,
                                                                 now_ms))[0]
    return QuotaCheck(past, sub.name, size, oldest)


def _size_target(sub: Subscription, size_bytes: int) -> MessageId | None:
    """Where `sub` must start for its backlog to be within `size_bytes` (None: it is)."""
    view, cursor = sub.view, sub.cursor
    start = first_unacked(sub)
    kept = 0.0  # bytes, estimated from each ledger's average entry
    ranges = [r for r in view.ranges() if r.entries and r.ledger_id >= start.ledger_id]
    for i in range(len(ranges) - 1, -1, -1):
        r = ranges[i]
        lo = MessageId(r.ledger_id, 0)
        n = cursor.backlog(view.entries_between, MessageId(r.ledger_id, r.entries)) - \
            cursor.backlog(view.entries_between, lo)
        avg = r.size_bytes / r.entries
        if kept + n * avg <= size_bytes:
            kept += n * avg
            continue
        keep = int((size_bytes - kept) // avg) if avg else n
        return MessageId(r.ledger_id, max(0, r.entries - keep))
    return None


async def evict(ts: TopicSubscriptions, size_bytes: int, age_s: int, now_ms: int) -> int:
    """consumer_backlog_eviction: every subscription past the quota skips its oldest
    entries until it is within it. Returns how many entries were skipped."""
    total = 0
    age_cutoff: dict[int, MessageId] = {}
    for sub in list(ts.subs.values()):
        if not sub.over_quota or ts.subs.get(sub.name) is not sub:
            continue
        n = 0
        if age_s >= 0:
            view = sub.view
            cutoff = age_cutoff.get(id(view))
            if cutoff is None:
                cutoff = age_cutoff[id(view)] = await view.position_at_time(
                    now_ms - age_s * 1000)
            n += ack_before(sub, cutoff)
        if size_bytes >= 0:
            target = _size_target(sub, size_bytes)
            if target is not None:
                n += ack_before(sub, target)
        sub.evicted += n
        sub.over_quota = False
        total += n
    return total


async def expire_subscriptions(ts: TopicSubscriptions, expiration_s: int, now_ms: int
                               ) -> list[str]:
    """Delete the durable subscriptions that had no consumer for `expiration_s`; their
    names."""
    if expiration_s <= 0:
        return []
    gone = []
    for sub in list(ts.subs.values()):
        if sub.consumers or now_ms - sub.last_active < expiration_s * 1000:
            continue
        try:
            await ts.delete(sub.name, force=False, dry_run=False)
        except (errors.ConsumerBusy, errors.SubscriptionNotFound):
            continue  # a consumer came meanwhile / deleted by someone else
        gone.append(sub.name)
    if gone:
        log.info("%s: expired %d inactive subscriptions: %s", ts.topic, len(gone),
                 ", ".join(gone[:10]))
    return gone
