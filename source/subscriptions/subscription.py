"""One durable subscription and its consumers: the cursor, acknowledgements, redelivery.

A `Subscription` is a member of its topic's dispatch groups (source/read/engine.py) while it
has consumers: `position` is the next entry never dispatched, and one read at a position
serves every subscription (and reader) there. What it does with the entries of a read
depends on its type (Exclusive, Failover, Shared, Key_Shared): that is its dispatcher's
(dispatcher.py), picked from the type here (`DISPATCHERS`) when the subscription is created,
and again when a first consumer after none attaches with another type. What every type
shares stays here: the cursor, acknowledgements, redelivery counts, resets and counters.

Entries acknowledged individually above the mark-delete (after a restart or a seek) are
skipped. Exclusive and Failover redeliver by rewinding `position` to the first
unacknowledged entry (`rewind`, single_active.py); Shared and Key_Shared track which
consumer holds each unacknowledged entry and put entries back in `redo` (shared.py).
`counts` holds redelivery counts, for entries redelivered at least once only; they stay
when the last consumer leaves (the next consumer gets those entries as redelivered).

What a redelivery counts (docs/BEHAVIOURS.md C3a), on every type: a count says how often the
application received the message and gave it back, since a dead-letter policy
(source/client/dead_letter.py) acts on it. So

- a nack counts exactly the ids it names (the application received those); on Exclusive
  and Failover the rewind that follows redelivers everything unacknowledged after the first
  unacknowledged entry, in order, without counting the others (most of them may never have
  left the client's receiver queue);
- a redeliver-all request (`redeliver_unacknowledged_messages`) counts nothing: the broker
  cannot tell which of the consumer's entries its application saw (the client's ack timeout
  nacks by id, and so counts);
- a consumer that leaves (closed, its stream broken, or it died) counts every unacknowledged
  entry it was sent, for the next consumer, as Pulsar does since its PR 5895: a consumer
  killed by a message it cannot process never nacks it, and this count is the only trace.
  (A failover consumer that loses its place to a better one is not leaving: no count.)

Nothing here owns a task, thread or timer: the topic's dispatch task calls `wanted`,
`deliver` and `replay`; nack delays are one `call_later` per nack command. A subscription
without consumers costs its cursor, its dispatcher and a few fields.

What a subscription needs of its topic's `TopicSubscriptions` (topic.py, which imports this
module, never the reverse) is `SubscriptionOwner`; what it reads, a `Reading` of it.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from itertools import chain, islice
from typing import Generic, Protocol, TypeVar

from shadowtopic import wire
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.cursors.state import CursorState, NextAfter, pack, unpack
from shadowtopic.ledger.view import LedgerRange, LedgerView, ReadEntry
from shadowtopic.read.engine import Counters, Frames, TopicReaders
from shadowtopic.subscriptions.cohorts import Cohort, Cohorts
from shadowtopic.subscriptions.consumer import SubConsumer
from shadowtopic.subscriptions.dispatcher import EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED, Dispatcher
from shadowtopic.subscriptions.key_shared import KeySharedDispatcher
from shadowtopic.subscriptions.positions import UNUSED, in_ranges
from shadowtopic.subscriptions.shared import SharedDispatcher
from shadowtopic.subscriptions.single_active import ExclusiveDispatcher, FailoverDispatcher

#: the dispatcher of each subscription type: the one place a type picks behaviour
DISPATCHERS: dict[str, type[Dispatcher]] = {
    EXCLUSIVE: ExclusiveDispatcher, FAILOVER: FailoverDispatcher, SHARED: SharedDispatcher,
    KEY_SHARED: KeySharedDispatcher}
MAX_COUNTED = 10_000       # a rewind counts redeliveries for at most this many entries
#: the view a `Reading` reads (the compacted one is a `CompactedReads`)
V = TypeVar("V", bound=LedgerView, covariant=True)


@dataclass(frozen=True, slots=True)
class Reading(Generic[V]):
    """One view a topic's subscriptions read (the topic's, or the compacted one for
    read_compacted), how ids follow each other in it, and its dispatch groups."""

    view: V
    next_after: NextAfter
    readers: TopicReaders[Subscription]


class SubscriptionOwner(Protocol):
    """What a subscription asks of its topic's `TopicSubscriptions`: what it reads, the
    topic's counters, and where a changed cursor goes."""

    @property
    def out(self) -> Counters: ...

    def reading(self, compacted: bool) -> Reading[LedgerView]:
        """The topic's `Reading`, or with `compacted` the compacted view's (`Internal` when
        the topic has not opened it: a subscription reads it only once it is open)."""

    @property
    def cohorts(self) -> Cohorts[Subscription]:
        """The topic's cohorts: subscriptions sharing one cursor (cohorts.py)."""

    def changed(self, sub: Subscription) -> None:
        """`sub`'s cursor changed: it may join a cohort; saved with the next flush."""

    def activity(self, sub: Subscription) -> None:
        """`sub`'s last activity changed (consumers came or went): saved with the next
        flush, never raising."""


class Subscription:
    __slots__ = ("name", "cursor", "cohort", "position", "topic", "ts", "consumers",
                 "dispatcher", "counts", "msg_out", "bytes_out", "redelivered", "skipped",
                 "created_ms", "compacted", "expired", "evicted", "over_quota", "__weakref__")

    def __init__(self, ts: SubscriptionOwner, name: str, type_: str, cursor: CursorState,
                 created_ms: int = 0):
        self.name = name
        #: its cursor, shared with the members of its cohort (cohorts.py): changed alone
        #: only through `own()`
        self.cursor = cursor
        self.cohort: Cohort[Subscription] | None = None
        self.ts = ts
        self.position = cursor.read_position(ts.reading(False).next_after)
        #: the dispatch groups, while it has consumers
        self.topic: TopicReaders[Subscription] | None = None
        self.consumers: list[SubConsumer[Subscription]] = []
        self.dispatcher: Dispatcher = DISPATCHERS[type_](self)
        self.counts: dict[int, int] = UNUSED      # allocated at the first redelivery
        self.msg_out = self.bytes_out = self.redelivered = self.skipped = 0
        self.created_ms = created_ms
        #: its consumers read the compacted view (read_compacted; set by the first consumer)
        self.compacted = False
        if not cursor.last_active:  # created, or loaded with no persisted activity: from now
            cursor.last_active = int(time.time() * 1000)
        #: messages acknowledged by message_ttl_seconds / skipped by backlog eviction
        self.expired = self.evicted = 0
        #: its backlog was past the topic's backlog quota when last checked
        self.over_quota = False

    @property
    def last_active(self) -> int:
        """ms since the epoch the subscription last had a consumer: now while one is
        attached; else when the last one detached (or it was created, or loaded without a
        persisted time). Kept in the cursor (`CursorState.last_active`: 0 while consumers
        are attached), so it persists with it; subscription_expiration_seconds counts from
        it (source/subscriptions/expiry.py)."""
        return int(time.time() * 1000) if self.consumers else self.cursor.last_active

    @property
    def type(self) -> str:
        return self.dispatcher.type

    @property
    def view(self) -> LedgerView:  # what it reads: the topic's or the compacted view
        return self.ts.reading(self.compacted).view

    @property
    def next_after(self) -> NextAfter:  # ids compacted away are skipped as if deleted
        return self.ts.reading(self.compacted).next_after

    @property
    def readers(self) -> TopicReaders[Subscription]:
        return self.ts.reading(self.compacted).readers

    # ---- consumers -------------------------------------------------------------------------

    def check_attach(self, type_: str, max_consumers: int, compacted: bool = False) -> None:
        """(`compacted` is Exclusive or Failover here: TopicSubscriptions.subscribe checks.)"""
        if self.consumers and compacted != self.compacted:
            raise errors.ConsumerBusy(
                f"subscription {self.name} is read with read_compacted={self.compacted}; "
                f"a consumer with read_compacted={compacted} cannot join")
        if self.consumers:
            self.dispatcher.check_attach(type_)
        if max_consumers and len(self.consumers) >= max_consumers:
            raise errors.TooManyConsumers(
                f"subscription {self.name} has {len(self.consumers)} consumers "
                f"(max_consumers {max_consumers})")

    def counted(self) -> dict[int, int]:
        """`counts`, allocated on first use."""
        if self.counts is UNUSED:
            self.counts = {}
        return self.counts

    def own(self) -> CursorState:
        """The cursor, to change alone (it leaves its cohort on a copy first: cohorts.py);
        the caller then reports the change (`ts.changed` / `ts.activity`)."""
        return self.ts.cohorts.own(self)

    def touch(self) -> None:
        """Something besides the dispatch may have lowered what this member wants: a read
        in flight asks it again before delivering (TopicReaders.changes)."""
        if self.topic is not None:
            self.topic.changes += 1

    def attach(self, c: SubConsumer[Subscription], type_: str) -> None:
        self.touch()
        if self.cursor.last_active:
            self.own().last_active = 0  # active now: saved so, for a crash while attached
            self.ts.activity(self)
        if not self.consumers:
            if type_ != self.dispatcher.type:  # the first consumer decides the type
                self.dispatcher = DISPATCHERS[type_](self)
            self.position = self.cursor.read_position(self.next_after)
        c.sub = self
        self.consumers.append(c)
        self.dispatcher.add(c)
        if self.topic is None:
            self.readers.add(self)

    def detach(self, c: SubConsumer[Subscription]) -> None:
        """`c` left (closed, its stream ended): its unacknowledged entries go to others."""
        if c not in self.consumers:
            return
        self.touch()
        self.consumers.remove(c)
        c.closed = True
        self.dispatcher.remove(c)
        if not self.consumers:
            self.own().last_active = int(time.time() * 1000)  # expiry counts from here
            self.ts.activity(self)
            if self.topic is not None:
                self.topic.remove(self)
            self.topic = None
            self.readers.replays.discard(self)
            # redelivery counts stay: the next consumer gets these entries as redelivered
            self.position = self.cursor.read_position(self.next_after)
        elif self.topic is not None:
            self.topic.wake()

    # ---- dispatch (a read-engine Member and Replayer; the dispatcher's) --------------------

    # (forwarded, not bound per subscription: two bound methods would cost ~130 bytes of
    # each idle subscription for ~0.1 us of each member's dispatch)
    def wanted(self, wake: Callable[[], None]) -> int:
        return self.dispatcher.wanted(wake)

    def deliver(self, entries: list[ReadEntry], encoded: list[bytes], size: int,
                frames: Frames) -> int:
        return self.dispatcher.deliver(entries, encoded, size, frames)

    async def replay(self) -> bool:
        return await self.dispatcher.replay()

    def encode(self, entries: list[ReadEntry], encoded: list[bytes], ps: list[int],
               keep: list[int]) -> tuple[list[bytes], int]:
        """The kept entries' encodings, with their redelivery counts."""
        counts = self.counts
        out, size = [], 0
        for i in keep:
            e = entries[i]
            n = counts.get(ps[i]) if counts else None
            out.append(wire.encode_entry(e.ledger_id, e.entry_id, e.publish_ms, e.raw, n)
                       if n else encoded[i])
            size += len(e.raw)
        return out, size

    def sent(self, c: SubConsumer[Subscription], n: int, size: int) -> None:
        c.permits -= n
        c.msg_out += n
        c.bytes_out += size
        self.msg_out += n
        self.bytes_out += size

    def resent(self, n: int, size: int) -> None:
        """`n` entries of `size` bytes waiting for redelivery went out (`replay`)."""
        self.redelivered += n
        self.ts.out.add_out(n, size)

    # ---- acknowledgements and redelivery ---------------------------------------------------

    def ack(self, c: SubConsumer[Subscription] | None, ps: list[int], cumulative: bool,
            ranges: list[tuple[int, int]] | tuple[()] = ()) -> None:
        """Acknowledge packed positions (`pack`) and inclusive packed `(first, last)` ranges
        (of one ledger each, checked by the caller), individually or up to the highest. Ids
        of entries not written yet are refused (`InvalidArgument`, the others are acked):
        acknowledging them would skip those messages once they are written. A range is one
        insertion into the cursor, and releases only what is held within it."""
        end = pack(self.view.next_position())
        future = [p for p in ps if p >= end]
        if future:
            ps = [p for p in ps if p < end]
        if ranges and max(b for _a, b in ranges) >= end:
            future += [max(a, end) for a, b in ranges if b >= end]  # (for the error's text)
            ranges = [(a, min(b, end - 1)) for a, b in ranges if a < end]
        try:
            self._ack(ps, cumulative, ranges)
        finally:
            if future:
                raise errors.InvalidArgument(
                    f"ack of ids not written yet (e.g. {unpack(max(future))}; the next is "
                    f"{unpack(end)}) on subscription {self.name}: those ignored")

    def _ack(self, ps: list[int], cumulative: bool,
             ranges: list[tuple[int, int]] | tuple[()] = ()) -> None:
        d = self.dispatcher
        if cumulative:
            if not d.cumulative_acks:
                raise errors.NotAllowed(f"cumulative ack is not allowed on {self.type} "
                                        f"subscription {self.name}")
            if not ps and not ranges:
                return
            top = max(chain(ps, (b for _a, b in ranges)))
            self.own().ack_cumulative(unpack(top), self.next_after)
            if self.counts:
                self.counts = {p: n for p, n in self.counts.items() if p > top}
        else:
            cursor = self.own()
            if ps:
                cursor.ack_packed(ps, self.next_after)
            if ranges:
                cursor.ack_ranges(ranges, self.next_after)
            if d.holder or self.counts:
                if ps:
                    d.release(ps)
                if ranges:
                    d.release(in_ranges(ranges, d.holder, self.counts, d.redo))
        if d.redo and self.topic is not None:
            self.topic.wake()  # Key_Shared: acks may release entries held for a joiner
        self.ts.changed(self)

    def nacked(self, c: SubConsumer[Subscription], ids: list[MessageId]) -> None:
        """Redeliver `ids` now (called once their nack delay has passed)."""
        if c.closed or c.sub is not self:
            return
        self.dispatcher.redeliver(c, ids)

    def redeliver_all(self, c: SubConsumer[Subscription]) -> None:
        """Redeliver everything `c` holds unacknowledged, counting nothing (see the module
        doc: the broker cannot tell what `c`'s application received)."""
        self.dispatcher.redeliver(c, None)

    def rewind(self, counting: Collection[int] | None = ()) -> MessageId | None:
        """Dispatch again from the first unacknowledged entry (Exclusive / Failover:
        single_active.py). `counting`: the packed positions that count a redelivery (a
        nack's ids; those already sent and not acknowledged count), by default none; None:
        every unacknowledged entry already sent (its consumer left). Returns where it
        landed, or None when nothing after it was dispatched."""
        next_after = self.next_after
        start = self.cursor.read_position(next_after)
        if start >= self.position:
            return None
        self.touch()
        if counting is None:
            p, n = start, 0
            while p < self.position and n < MAX_COUNTED:
                if not self.cursor.is_acked(p):
                    key = pack(p)
                    self.counted()[key] = self.counts.get(key, 0) + 1
                    n += 1
                nxt = next_after(p)
                if nxt <= p:
                    break
                p = nxt
        else:
            first, end = pack(start), pack(self.position)
            acked = self.cursor.is_acked_packed
            for key in counting:
                if first <= key < end and not acked(key):
                    self.counted()[key] = self.counts.get(key, 0) + 1
        self._move(start)
        return start

    def _move(self, position: MessageId) -> None:
        if self.topic is not None:
            self.topic.move(self, position)
            self.topic.wake()
        else:
            self.position = position

    def reset(self, position: MessageId) -> None:
        """The cursor now starts at `position` (seek / reset-cursor): nothing after it stays
        acknowledged, nothing is held or waits for redelivery, consumers start over with no
        permits (they are told and send a fresh flow)."""
        self.touch()
        cursor = self.own()
        cursor.seek(position)
        cursor.normalize(self.next_after)
        self.dispatcher.reset()
        self.counts.clear()
        if self.topic is not None:
            self.topic.replays.discard(self)
        for c in self.consumers:
            c.permits = 0
        self._move(self.cursor.read_position(self.next_after))
        self.ts.changed(self)

    def acked_by_admin(self) -> None:
        """Skip / clear-backlog acknowledged entries: forget them where they wait."""
        first = self.cursor.read_position(self.next_after)
        d = self.dispatcher
        if d.holder or d.redo:
            d.release([p for p in chain(d.holder, d.redo) if self.cursor.is_acked(unpack(p))])
        self.counts = {p: n for p, n in self.counts.items() if not self.cursor.is_acked(unpack(p))}
        if self.position < first:
            self._move(first)
        self.ts.changed(self)

    def trimmed(self, ledgers: tuple[LedgerRange, ...], gone: set[int],
                skipped: dict[int, int]) -> None:
        """The ledgers `gone` were deleted (retention, truncate): the cursor moves past
        them, and what was held, waited or was counted in them is forgotten. A cohort's
        cursor moves once, for every member (`skipped`: what it skipped, by cohort)."""
        co = self.cohort
        if co is None:
            self.skipped += self.own().skip_trimmed(ledgers, self.next_after)
        else:
            n = skipped.get(id(co))
            if n is None:
                cursor = self.ts.cohorts.moving(co)
                n = skipped[id(co)] = cursor.skip_trimmed(ledgers, self.next_after)
            self.skipped += n
        d = self.dispatcher
        if d.holder or d.redo:
            d.release([p for p in chain(d.holder, d.redo) if (p >> 64) in gone])
        for p in [p for p in self.counts if (p >> 64) in gone]:
            del self.counts[p]

    # ---- numbers ---------------------------------------------------------------------------

    def ranges_text(self, limit: int = 100) -> str:
        """The acknowledged ranges above the mark-delete as Pulsar prints them:
        `[(3:4..3:7], ...]`, each open at its start and closed at its end (the first `limit`)."""
        return "[" + ", ".join(f"({a.ledger_id}:{a.entry_id - 1}..{b}]"
                               for a, b in islice(self.cursor.ranges, limit)) + "]"
