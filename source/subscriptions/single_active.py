"""Exclusive and Failover: one active consumer gets every entry (Pulsar's
PersistentDispatcherSingleActiveConsumer).

Exclusive takes one consumer and refuses another (`ConsumerBusy`). Failover takes many: the
active one is the first by (priority, name, arrival); the others stand by, told so with
`ActiveChanged`, and take over when it leaves or a better one arrives.

Both redeliver by rewinding the subscription's `position` to the first unacknowledged entry
(a nack, a redeliver request, the active consumer leaving or losing its place), keeping
order as Pulsar does, and the active consumer is told (`CursorMoved`) to drop what it holds
unreceived and flow afresh. What counts a redelivery (subscription.py, C3a): a nack, only
its ids; the active consumer leaving, every unacknowledged entry it was sent; a redeliver
request, or a better consumer taking the active one's place, nothing.
"""
from __future__ import annotations

from collections.abc import Callable, Collection

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.cursors.state import pack
from shadowtopic.ledger.view import ReadEntry
from shadowtopic.read.engine import Frames
from shadowtopic.subscriptions.consumer import ActiveChanged, CursorMoved, SubConsumer
from shadowtopic.subscriptions.dispatcher import (
    EXCLUSIVE,
    FAILOVER,
    Dispatched,
    Dispatcher,
    unacked_of,
)


class SingleActiveDispatcher(Dispatcher):
    __slots__ = ("active",)

    reads_compacted = True

    def __init__(self, sub: Dispatched):
        super().__init__(sub)
        self.active: SubConsumer | None = None

    # ---- consumers -------------------------------------------------------------------------

    def add(self, c: SubConsumer) -> None:
        self._elect()

    def remove(self, c: SubConsumer) -> None:
        if self.active is c:
            self.active = None
            self._rewind(None)  # it left: what it was sent counts (it may have died on it)
            self._elect()

    def _elect(self) -> None:
        """The active consumer is the first by (priority, name, seq)."""
        sub = self.sub
        best = min(sub.consumers, key=lambda c: (c.priority, c.name, c.seq), default=None)
        if best is not self.active:
            sub.touch()
            if self.active is not None:
                self._rewind()  # what the old active consumer had not acknowledged goes on
                # (uncounted: it is still there, and its application gave nothing back)
            self.active = best
        for c in sub.consumers:
            is_active = c is best
            if c.active != is_active:
                c.active = is_active
                c.outbox.send_notice(c.handle, ActiveChanged(is_active))

    # ---- dispatch --------------------------------------------------------------------------

    def wanted(self, wake: Callable[[], None]) -> int:
        c = self.active
        if c is None or c.permits <= 0:
            return 0
        if not c.outbox.has_room():  # (SubConsumer.can_take, inline: once per member
            c.outbox.call_when_room(wake)  # of a broadcast's dispatch)
            return 0
        return c.permits

    def deliver(self, entries: list[ReadEntry], encoded: list[bytes], size: int,
                frames: Frames) -> int:
        sub = self.sub
        cursor, counts = sub.cursor, sub.counts
        if not cursor.holes and not counts:  # the common case: all of them
            c = self.active
            if c is None:  # cannot happen while it is in a ready group; keep it for later
                return 0
            frames.all(c.outbox, c.handle)
            sub.sent(c, len(entries), size)
            return len(entries)
        ps, keep = unacked_of(cursor, entries)
        c = self.active
        if c is None:
            return 0
        if len(keep) == len(entries) and not counts:
            frames.all(c.outbox, c.handle)
            n, sent = len(entries), size
        else:
            some, sent = sub.encode(entries, encoded, ps, keep)
            if some:
                frames.some(c.outbox, c.handle, some, sent)
            n = len(some)
        sub.sent(c, n, sent)
        return n

    # ---- redelivery ------------------------------------------------------------------------

    def redeliver(self, c: SubConsumer, ids: list[MessageId] | None) -> None:
        if c is self.active:
            self._rewind(() if ids is None else {pack(m) for m in ids})

    def _rewind(self, counting: Collection[int] | None = ()) -> None:
        """The subscription rewinds to its first unacknowledged entry, counting a
        redelivery for `counting` (`Subscription.rewind`); the active consumer drops what it
        holds unreceived (it comes again) and flows afresh."""
        start = self.sub.rewind(counting)
        c = self.active
        if start is not None and c is not None:
            c.permits = 0
            c.outbox.send_notice(c.handle, CursorMoved(start, False, True))

    # ---- numbers ---------------------------------------------------------------------------

    def unacked(self, c: SubConsumer) -> int:
        if c is not self.active:
            return 0
        sub = self.sub
        return sub.cursor.backlog(sub.view.entries_between, sub.position)


class ExclusiveDispatcher(SingleActiveDispatcher):
    __slots__ = ()

    type = EXCLUSIVE

    def check_attach(self, type_: str) -> None:
        super().check_attach(type_)
        raise errors.ConsumerBusy(
            f"subscription {self.sub.name} already has its exclusive consumer")


class FailoverDispatcher(SingleActiveDispatcher):
    __slots__ = ()

    type = FAILOVER
