"""One durable subscription and its consumers: the cursor, who gets which entry, redelivery.

A `Subscription` is a member of its topic's dispatch groups (source/read/engine.py) while it
has consumers: `position` is the next entry never dispatched, and one read at a position
serves every subscription (and reader) there. What it does with the entries of a read
depends on its type (Pulsar's semantics):

    EXCLUSIVE   one consumer; another one is refused (`ConsumerBusy`)
    FAILOVER    many consumers, one active (lowest `priority`, then name, then arrival);
                the others stand by and take over, from the first unacknowledged entry,
                when it leaves or a better one arrives (`ActiveConsumerChanged`)
    SHARED      entries spread over the consumers with permits, round robin in runs
    KEY_SHARED  an entry goes to the consumer owning its key's hash (keyring.py)

Entries acknowledged individually above the mark-delete (after a restart or a seek) are
skipped. Exclusive and Failover redeliver by rewinding `position` to the first
unacknowledged entry (a nack, a redeliver request, the active consumer leaving), keeping
order as Pulsar does. Shared and Key_Shared track which consumer holds each unacknowledged
entry (`holder`), and put entries back in `redo` (redelivered before new ones, by the
topic's dispatch task) when their consumer leaves or nacks them. `counts` holds redelivery
counts, for entries redelivered at least once only.

Nothing here owns a task, thread or timer: the topic's dispatch task calls `wanted`,
`deliver` and `replay`; nack delays are one `call_later` per nack command. A subscription
without consumers costs its cursor and a few fields.
"""
from __future__ import annotations

import time
import heapq
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Callable, Protocol

from source import wire
from source.core import errors
from source.core.message_id import MessageId
from source.cursors.state import CursorState, NextAfter, pack, unpack
from source.ledger.view import LedgerView, ReadEntry
from source.read.engine import MAX_FRAME_BYTES, MAX_FRAME_ENTRIES, Frames, Outbox
from source.subscriptions.keyring import KeyRing, key_hash
from source.subscriptions.positions import UNUSED, Positions

if TYPE_CHECKING:
    from source.read.engine import TopicReaders
    from source.subscriptions.topic import TopicSubscriptions

EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED = "Exclusive", "Shared", "Failover", "Key_Shared"
TYPES = (EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED)
SHARED_RUN = 20            # entries in a row to one Shared consumer before the next one
MAX_REDO = 10_000          # Key_Shared: entries waiting for their consumer before reads pause
_LOW = (1 << 64) - 1
MAX_COUNTED = 10_000       # a rewind counts redeliveries for at most this many entries


@dataclass(frozen=True)
class ActiveChanged:
    """Exclusive / Failover: this consumer now gets the messages, or no longer does."""
    is_active: bool


@dataclass(frozen=True)
class CursorMoved:
    """The subscription's cursor was reset (a seek or reset-cursor): the consumer drops what
    it holds and sends a fresh flow. `by_admin`: it was not this consumer's own seek."""
    position: MessageId
    clamped: bool
    by_admin: bool


class ConsumerOutbox(Outbox, Protocol):
    def send_notice(self, handle: int, notice: ActiveChanged | CursorMoved) -> None:
        """Queue an event for `handle`."""


class SubConsumer:
    """One consumer (a handle of a client stream) of a subscription."""

    __slots__ = ("handle", "outbox", "name", "priority", "permits", "sub", "pending", "join",
                 "seq", "msg_out", "bytes_out", "redelivered", "address", "since", "active",
                 "closed")

    def __init__(self, handle: int, outbox: ConsumerOutbox, name: str, priority: int, seq: int,
                 address: str = ""):
        self.handle = handle
        self.outbox = outbox
        self.name = name
        self.priority = priority
        self.seq = seq
        self.permits = 0
        self.sub: Subscription | None = None
        self.pending = UNUSED            # Shared / Key_Shared: entries it holds unacked
        self.join: int | None = None     # Key_Shared: held back from here until acked
        self.msg_out = self.bytes_out = self.redelivered = 0
        self.address = address
        self.since = time.time()         # connected since (shown as ISO 8601 in stats)
        self.active: bool | None = None
        self.closed = False

    def can_take(self, wake: Callable[[], None]) -> bool:
        if self.permits <= 0:
            return False
        if not self.outbox.has_room():
            self.outbox.call_when_room(wake)
            return False
        return True


class Subscription:
    __slots__ = ("name", "type", "cursor", "position", "topic", "ts", "consumers", "active",
                 "ring", "holder", "redo", "redo_hash", "unknown", "counts", "rr", "msg_out",
                 "bytes_out", "redelivered", "skipped", "created_ms", "compacted", "__weakref__")

    def __init__(self, ts: "TopicSubscriptions", name: str, type_: str, cursor: CursorState,
                 created_ms: int = 0):
        self.name = name
        self.type = type_
        self.cursor = cursor
        self.ts = ts
        self.position = cursor.read_position(ts.next_after)
        self.topic: TopicReaders | None = None   # the dispatch groups, while it has consumers
        self.consumers: list[SubConsumer] = []
        self.active: SubConsumer | None = None
        self.ring: KeyRing[SubConsumer] | None = None
        # Shared / Key_Shared only (UNUSED until a consumer of those types attaches):
        self.holder: dict[int, SubConsumer] = UNUSED
        self.redo: Positions = UNUSED
        self.redo_hash: dict[int, int] = UNUSED   # Key_Shared: the key hash of a redo entry
        self.unknown: Positions = UNUSED          # Key_Shared: redo entries of unknown hash
        self.counts: dict[int, int] = UNUSED      # allocated at the first redelivery
        self.rr = 0
        self.msg_out = self.bytes_out = self.redelivered = self.skipped = 0
        self.created_ms = created_ms
        #: its consumers read the compacted view (read_compacted; set by the first consumer)
        self.compacted = False

    @property
    def view(self) -> LedgerView:  # what it reads: the topic's or the compacted view
        return self.ts.compacted if self.compacted else self.ts.view

    @property
    def next_after(self) -> NextAfter:  # ids compacted away are skipped as if deleted
        return self.ts.compacted_next_after if self.compacted else self.ts.next_after

    @property
    def readers(self) -> TopicReaders:
        return self.ts.compacted_readers if self.compacted else self.ts.readers

    # ---- consumers -------------------------------------------------------------------------

    def check_attach(self, type_: str, max_consumers: int, compacted: bool = False) -> None:
        """(`compacted` is Exclusive or Failover here: TopicSubscriptions.subscribe checks.)"""
        if self.consumers and compacted != self.compacted:
            raise errors.ConsumerBusy(
                f"subscription {self.name} is read with read_compacted={self.compacted}; "
                f"a consumer with read_compacted={compacted} cannot join")
        if self.consumers:
            if type_ != self.type:
                raise errors.ConsumerBusy(
                    f"subscription {self.name} is {self.type}; a {type_} consumer cannot join")
            if self.type == EXCLUSIVE:
                raise errors.ConsumerBusy(
                    f"subscription {self.name} already has its exclusive consumer")
        if max_consumers and len(self.consumers) >= max_consumers:
            raise errors.TooManyConsumers(
                f"subscription {self.name} has {len(self.consumers)} consumers "
                f"(max_consumers {max_consumers})")

    def _counted(self) -> dict[int, int]:
        """`counts`, allocated on first use."""
        if self.counts is UNUSED:
            self.counts = {}
        return self.counts

    def _touch(self) -> None:
        """Something besides the dispatch may have lowered what this member wants: a read
        in flight asks it again before delivering (TopicReaders.changes)."""
        if self.topic is not None:
            self.topic.changes += 1

    def attach(self, c: SubConsumer, type_: str) -> None:
        self._touch()
        if not self.consumers:
            self.type = type_
            self.position = self.cursor.read_position(self.next_after)
        if self.type in (SHARED, KEY_SHARED):
            if self.holder is UNUSED:
                self.holder, self.redo_hash = {}, {}
                self.redo, self.unknown = Positions(), Positions()
            c.pending = Positions()
        c.sub = self
        self.consumers.append(c)
        if self.type == KEY_SHARED:
            if self.ring is None:
                self.ring = KeyRing()
            if len(self.consumers) > 1:
                c.join = pack(self.position)
            self.ring.add(c, f"{c.name}/{c.seq}")
        if self.type in (EXCLUSIVE, FAILOVER):
            self._elect()
        if self.topic is None:
            self.readers.add(self)

    def detach(self, c: SubConsumer) -> None:
        """`c` left (closed, its stream ended): its unacknowledged entries go to others."""
        if c not in self.consumers:
            return
        self._touch()
        self.consumers.remove(c)
        c.closed = True
        if self.type in (EXCLUSIVE, FAILOVER):
            if self.active is c:
                self.active = None
                self.rewind()
                self._elect()
        else:
            if self.ring is not None:
                self.ring.remove(c)
            self._requeue(list(c.pending))
            c.pending = UNUSED
        if not self.consumers:
            self.active = None
            self.ring = None
            if self.topic is not None:
                self.topic.remove(self)
            self.topic = None
            self.readers.replays.discard(self)
            self._clear_redo()
            self.holder.clear()
            # redelivery counts stay: the next consumer gets these entries as redelivered
            self.position = self.cursor.read_position(self.next_after)
        elif self.topic is not None:
            self.topic.wake()

    def _elect(self) -> None:
        """Exclusive / Failover: the active consumer is the first by (priority, name, seq)."""
        best = min(self.consumers, key=lambda c: (c.priority, c.name, c.seq), default=None)
        if best is not self.active:
            self._touch()
            if self.active is not None:
                self.rewind()  # what the old active consumer had not acknowledged goes on
            self.active = best
        for c in self.consumers:
            is_active = c is best
            if c.active != is_active:
                c.active = is_active
                c.outbox.send_notice(c.handle, ActiveChanged(is_active))

    # ---- dispatch (a read-engine Member) ---------------------------------------------------

    def wanted(self, wake: Callable[[], None]) -> int:
        if self.type in (EXCLUSIVE, FAILOVER):
            c = self.active
            return c.permits if c is not None and c.can_take(wake) else 0
        if self.type == KEY_SHARED and (self.unknown or len(self.redo) >= MAX_REDO):
            return 0  # new entries wait: their keys' earlier entries must go out first
        return sum(c.permits for c in self.consumers if c.can_take(wake))

    def _clear_redo(self) -> None:
        self.redo.clear()
        self.redo_hash.clear()
        self.unknown.clear()

    def deliver(self, entries: list[ReadEntry], encoded: list[bytes], size: int,
                frames: Frames) -> int:
        cursor, counts = self.cursor, self.counts
        exclusive = self.type in (EXCLUSIVE, FAILOVER)
        if exclusive and not cursor.holes and not counts:  # the common case: all of them
            c = self.active
            if c is None:  # cannot happen while it is in a ready group; keep it for later
                return 0
            frames.all(c.outbox, c.handle)
            self._sent(c, len(entries), size)
            return len(entries)
        ps = [(e.ledger_id << 64) + e.entry_id for e in entries]
        keep = list(range(len(entries)))
        if cursor.holes:
            acked = cursor.is_acked_packed
            keep = [i for i in keep if not acked(ps[i])]
        if exclusive:
            c = self.active
            if c is None:
                return 0
            if len(keep) == len(entries) and not counts:
                frames.all(c.outbox, c.handle)
                n, sent = len(entries), size
            else:
                some, sent = self._encode(entries, encoded, ps, keep)
                if some:
                    frames.some(c.outbox, c.handle, some, sent)
                n = len(some)
            self._sent(c, n, sent)
            return n
        return self._spread(entries, encoded, ps, keep, frames)

    def _encode(self, entries: list[ReadEntry], encoded: list[bytes], ps: list[int],
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

    def _sent(self, c: SubConsumer, n: int, size: int) -> None:
        c.permits -= n
        c.msg_out += n
        c.bytes_out += size
        self.msg_out += n
        self.bytes_out += size

    def _spread(self, entries: list[ReadEntry], encoded: list[bytes], ps: list[int],
                keep: list[int], frames: Frames, fresh: bool = True) -> int:
        """Shared / Key_Shared: each kept entry to one consumer; what no consumer can take
        now waits in `redo`. Returns how many went out. `fresh`: entries never dispatched
        (Key_Shared sends none of a key while an earlier entry of it waits in `redo`);
        otherwise entries from `redo`, oldest first."""
        wake = self.topic.wake if self.topic is not None else (lambda: None)
        takers = [c for c in self.consumers if c.can_take(wake)]
        room = {c: c.permits for c in takers}
        picks: dict[SubConsumer, list[int]] = {}
        key_shared = self.type == KEY_SHARED
        first_unacked = pack(self.cursor.read_position(self.next_after)) if key_shared else 0
        waiting: set[int] = set()  # key hashes with an earlier entry still in redo
        if key_shared and fresh and self.redo:
            waiting = {h for p, h in self.redo_hash.items() if p in self.redo}
        run, cur = 0, None
        for i in keep:
            p = ps[i]
            if key_shared:
                h = key_hash(wire.message_key(entries[i].raw))
                c = self.ring.owner(h) if self.ring else None
                if fresh and h in waiting:
                    c = None           # an earlier entry of this key waits: keep the order
                if c is not None and c.join is not None:
                    if first_unacked >= c.join:
                        c.join = None  # everything dispatched before it joined is acked
                    elif p >= c.join:
                        c = None       # held back: order per key
                if c is None or room.get(c, 0) <= 0:
                    self.redo.add(p)
                    self.redo_hash[p] = h
                    waiting.add(h)
                    continue
            else:
                if cur is None or room[cur] <= 0 or run >= SHARED_RUN:
                    cur = self._next_taker(takers, room)
                    run = 0
                c = cur
                if c is None:
                    self.redo.add(p)
                    continue
                run += 1
            room[c] -= 1
            picks.setdefault(c, []).append(i)
        sent = 0
        holder, redo = self.holder, self.redo
        if key_shared and len(self.redo_hash) > 2 * len(redo) + 64:
            self.redo_hash = {p: h for p, h in self.redo_hash.items() if p in redo}
        for c, idx in picks.items():
            some, size = self._encode(entries, encoded, ps, idx)
            frames.some(c.outbox, c.handle, some, size)
            pending = c.pending
            for i in idx:
                p = ps[i]
                holder[p] = c
                pending.add(p)
            if redo:
                redo.difference_update(ps[i] for i in idx)
            self._sent(c, len(idx), size)
            sent += len(idx)
        if redo and self.topic is not None:
            self.topic.replays.add(self)
        return sent

    def _next_taker(self, takers: list[SubConsumer], room: dict) -> SubConsumer | None:
        for _ in range(len(takers)):
            self.rr = (self.rr + 1) % len(takers)
            c = takers[self.rr]
            if room[c] > 0:
                return c
        return None

    async def replay(self) -> bool:
        """Redeliver entries waiting in `redo`, oldest first; True when `redo` shrank (some
        went out, or were acknowledged or deleted meanwhile): there may be more to do."""
        tr = self.topic
        if tr is None or not self.redo:
            if tr is not None:
                tr.replays.discard(self)
            return False
        if not any(c.can_take(tr.wake) for c in self.consumers):
            return False
        waiting = len(self.redo)
        view = self.view
        todo = heapq.nsmallest(MAX_FRAME_ENTRIES, self.redo)
        live = {r.ledger_id: r.entries for r in view.ranges()}
        want = set(todo)
        entries: list[ReadEntry] = []
        budget = MAX_FRAME_BYTES
        i = 0
        while i < len(todo) and budget > 0:  # contiguous runs of one ledger, one read each
            j = i + 1
            while j < len(todo) and todo[j] == todo[j - 1] + 1:
                j += 1
            got = await view.read(unpack(todo[i]), j - i, budget)
            got = [e for e in got if (e.ledger_id << 64) + e.entry_id in want]
            entries += got
            budget -= sum(len(e.raw) for e in got)
            i = j
        gone = [p for p in todo if (p >> 64) not in live or (p & _LOW) >= live[p >> 64]]
        for p in gone:  # deleted (retention, truncate): nothing to redeliver
            self._forget(p)
        if self.topic is not tr:
            return False
        entries = [e for e in entries if (e.ledger_id << 64) + e.entry_id in self.redo]
        ps = [(e.ledger_id << 64) + e.entry_id for e in entries]
        self.unknown.difference_update(ps)
        acked = self.cursor.is_acked_packed
        keep = [i for i, p in enumerate(ps) if not acked(p)]
        for p in ps:
            if acked(p):
                self._forget(p)
        encoded = tr.encoded(entries)
        frames = Frames()
        n = self._spread(entries, encoded, ps, keep, frames, fresh=False)
        frames.send([], 0)
        self.redelivered += n
        if not self.redo:
            tr.replays.discard(self)
        if n:
            self.ts.out.add_out(n, sum(len(e.raw) for e in entries) if entries else 0)
        return len(self.redo) < waiting

    def _forget(self, p: int) -> None:
        """`p` no longer waits for redelivery (acknowledged, or its ledger is gone)."""
        self.redo.discard(p)
        self.redo_hash.pop(p, None)
        self.unknown.discard(p)
        self.counts.pop(p, None)

    # ---- acknowledgements and redelivery ---------------------------------------------------

    def ack(self, c: SubConsumer | None, ps: list[int], cumulative: bool) -> None:
        """Acknowledge packed positions (`pack`), individually or up to the highest. Ids of
        entries not written yet are refused (`InvalidArgument`, the others are acked):
        acknowledging them would skip those messages once they are written."""
        end = pack(self.view.next_position())
        future = [p for p in ps if p >= end]
        if future:
            ps = [p for p in ps if p < end]
        try:
            self._ack(ps, cumulative)
        finally:
            if future:
                raise errors.InvalidArgument(
                    f"ack of {len(future)} ids not written yet (e.g. {unpack(max(future))}) "
                    f"on subscription {self.name}: ignored")

    def _ack(self, ps: list[int], cumulative: bool) -> None:
        if cumulative:
            if self.type in (SHARED, KEY_SHARED):
                raise errors.NotAllowed(f"cumulative ack is not allowed on {self.type} "
                                        f"subscription {self.name}")
            if not ps:
                return
            top = max(ps)
            self.cursor.ack_cumulative(unpack(top), self.next_after)
            if self.counts:
                self.counts = {p: n for p, n in self.counts.items() if p > top}
        else:
            self.cursor.ack_packed(ps, self.next_after)
            if self.holder or self.counts:
                holder, counts, redo = self.holder, self.counts, self.redo
                for p in ps:
                    h = holder.pop(p, None)
                    if h is not None:
                        h.pending.discard(p)
                    if counts:
                        counts.pop(p, None)
                    if redo and p in redo:
                        self._forget(p)
        if self.redo and self.topic is not None:
            self.topic.wake()  # Key_Shared: acks may release entries held for a joiner
        self.ts.changed(self)

    def nacked(self, c: SubConsumer, ids: list[MessageId]) -> None:
        """Redeliver `ids` now (called once their nack delay has passed)."""
        if c.closed or c.sub is not self:
            return
        if self.type in (EXCLUSIVE, FAILOVER):
            if c is self.active:
                self.rewind()
            return
        mine = [pack(MessageId(m.ledger_id, m.entry_id)) for m in ids]
        self._requeue([p for p in mine if p in c.pending])

    def redeliver_all(self, c: SubConsumer) -> None:
        if self.type in (EXCLUSIVE, FAILOVER):
            if c is self.active:
                self.rewind()
            return
        self._requeue(list(c.pending))

    def _requeue(self, positions) -> None:
        self._touch()
        for p in positions:
            holder = self.holder.pop(p, None)
            if holder is not None:
                holder.pending.discard(p)
            if not self.cursor.is_acked(unpack(p)):
                self.redo.add(p)
                if self.type == KEY_SHARED and p not in self.redo_hash:
                    self.unknown.add(p)  # its hash is learnt when replay reads it
                self._counted()[p] = self.counts.get(p, 0) + 1
        if self.redo and self.topic is not None:
            self.topic.replays.add(self)
            self.topic.wake()

    def rewind(self) -> None:
        """Exclusive / Failover: dispatch again from the first unacknowledged entry,
        counting a redelivery for each unacknowledged entry already sent."""
        next_after = self.next_after
        start = self.cursor.read_position(next_after)
        if start >= self.position:
            return
        self._touch()
        p, n = start, 0
        while p < self.position and n < MAX_COUNTED:
            if not self.cursor.is_acked(p):
                key = pack(p)
                self._counted()[key] = self.counts.get(key, 0) + 1
                n += 1
            nxt = next_after(p)
            if nxt <= p:
                break
            p = nxt
        self._move(start)
        c = self.active
        if c is not None:  # what it holds unreceived comes again: it drops it, flows afresh
            c.permits = 0
            c.outbox.send_notice(c.handle, CursorMoved(start, False, True))

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
        self._touch()
        self.cursor.seek(position)
        self.cursor.normalize(self.next_after)
        self.holder.clear()
        self._clear_redo()
        self.counts.clear()
        if self.topic is not None:
            self.topic.replays.discard(self)
        for c in self.consumers:
            if c.pending is not UNUSED:
                c.pending = Positions()
            c.permits = 0
            c.join = None
        self._move(self.cursor.read_position(self.next_after))
        self.ts.changed(self)

    def acked_by_admin(self) -> None:
        """Skip / clear-backlog acknowledged entries: forget them where they wait."""
        first = self.cursor.read_position(self.next_after)
        for p in [p for p in self.holder if self.cursor.is_acked(unpack(p))]:
            self.holder.pop(p).pending.discard(p)
        for p in [p for p in self.redo if self.cursor.is_acked(unpack(p))]:
            self._forget(p)
        self.counts = {p: n for p, n in self.counts.items() if not self.cursor.is_acked(unpack(p))}
        if self.position < first:
            self._move(first)
        self.ts.changed(self)

    # ---- numbers ---------------------------------------------------------------------------

    def unacked(self, c: SubConsumer) -> int:
        if self.type in (SHARED, KEY_SHARED):
            return len(c.pending)
        if c is not self.active:
            return 0
        return self.cursor.backlog(self.view.entries_between, self.position)

    def ranges_text(self, limit: int = 100) -> str:
        """The acknowledged ranges above the mark-delete as Pulsar prints them:
        `[(3:4..3:7], ...]`, each open at its start and closed at its end (the first `limit`)."""
        return "[" + ", ".join(f"({a.ledger_id}:{a.entry_id - 1}..{b}]"
                               for a, b in islice(self.cursor.ranges, limit)) + "]"
