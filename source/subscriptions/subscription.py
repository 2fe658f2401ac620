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

import datetime
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Callable, Protocol

from source import wire
from source.core import errors
from source.core.message_id import MessageId
from source.cursors.state import CursorState, pack, unpack
from source.ledger.view import ReadEntry
from source.read.engine import MAX_FRAME_BYTES, MAX_FRAME_ENTRIES, Frames, Outbox
from source.subscriptions.keyring import KeyRing, key_hash

if TYPE_CHECKING:
    from source.read.engine import TopicReaders
    from source.subscriptions.topic import TopicSubscriptions

EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED = "Exclusive", "Shared", "Failover", "Key_Shared"
TYPES = (EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED)
SHARED_RUN = 20            # entries in a row to one Shared consumer before the next one
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
        self.pending: set[int] = set()   # Shared / Key_Shared: entries it holds unacked
        self.join: int | None = None     # Key_Shared: held back from here until acked
        self.msg_out = self.bytes_out = self.redelivered = 0
        self.address = address
        self.since = datetime.datetime.now(datetime.timezone.utc).isoformat()
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
                 "ring", "holder", "redo", "counts", "rr", "msg_out", "bytes_out",
                 "redelivered", "skipped", "created_ms", "__weakref__")

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
        self.holder: dict[int, SubConsumer] = {}
        self.redo: set[int] = set()
        self.counts: dict[int, int] = {}
        self.rr = 0
        self.msg_out = self.bytes_out = self.redelivered = self.skipped = 0
        self.created_ms = created_ms

    # ---- consumers -------------------------------------------------------------------------

    def check_attach(self, type_: str, max_consumers: int) -> None:
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

    def attach(self, c: SubConsumer, type_: str) -> None:
        if not self.consumers:
            self.type = type_
            self.position = self.cursor.read_position(self.ts.next_after)
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
            self.ts.readers.add(self)

    def detach(self, c: SubConsumer) -> None:
        """`c` left (closed, its stream ended): its unacknowledged entries go to others."""
        if c not in self.consumers:
            return
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
            c.pending = set()
        if not self.consumers:
            self.active = None
            self.ring = None
            if self.topic is not None:
                self.topic.remove(self)
            self.topic = None
            self.ts.readers.replays.discard(self)
            self.redo.clear()
            self.holder.clear()
            self.counts.clear()
            self.position = self.cursor.read_position(self.ts.next_after)
        elif self.topic is not None:
            self.topic.wake()

    def _elect(self) -> None:
        """Exclusive / Failover: the active consumer is the first by (priority, name, seq)."""
        best = min(self.consumers, key=lambda c: (c.priority, c.name, c.seq), default=None)
        if best is not self.active:
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
        return sum(c.permits for c in self.consumers if c.can_take(wake))

    def deliver(self, entries: list[ReadEntry], encoded: list[bytes], size: int,
                frames: Frames) -> int:
        cursor, counts = self.cursor, self.counts
        keep = list(range(len(entries)))
        if cursor.holes:
            keep = [i for i in keep if not cursor.is_acked(
                MessageId(entries[i].ledger_id, entries[i].entry_id))]
        if self.type in (EXCLUSIVE, FAILOVER):
            c = self.active
            if c is None:  # cannot happen while it is in a ready group; keep it for later
                return 0
            if len(keep) == len(entries) and not counts:
                frames.all(c.outbox, c.handle)
                n, sent = len(entries), size
            else:
                some, sent = self._encode(entries, encoded, keep)
                if some:
                    frames.some(c.outbox, c.handle, some, sent)
                n = len(some)
            self._sent(c, n, sent)
            return n
        return self._spread(entries, encoded, keep, frames)

    def _encode(self, entries: list[ReadEntry], encoded: list[bytes], keep: list[int]
                ) -> tuple[list[bytes], int]:
        """The kept entries' encodings, with their redelivery counts."""
        counts = self.counts
        out, size = [], 0
        for i in keep:
            e = entries[i]
            n = counts.get(pack(MessageId(e.ledger_id, e.entry_id))) if counts else None
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

    def _spread(self, entries: list[ReadEntry], encoded: list[bytes], keep: list[int],
                frames: Frames) -> int:
        """Shared / Key_Shared: each kept entry to one consumer; what no consumer can take
        now waits in `redo`. Returns how many went out."""
        wake = self.topic.wake if self.topic is not None else (lambda: None)
        takers = [c for c in self.consumers if c.can_take(wake)]
        room = {c: c.permits for c in takers}
        picks: dict[SubConsumer, list[int]] = {}
        first_unacked = pack(self.cursor.read_position(self.ts.next_after))
        run, cur = 0, None
        for i in keep:
            e = entries[i]
            p = pack(MessageId(e.ledger_id, e.entry_id))
            if self.type == KEY_SHARED:
                c = self.ring.owner(key_hash(wire.message_key(e.raw))) if self.ring else None
                if c is not None and c.join is not None:
                    if first_unacked >= c.join:
                        c.join = None  # everything dispatched before it joined is acked
                    elif p >= c.join:
                        c = None       # held back: order per key
                if c is None or room.get(c, 0) <= 0:
                    self.redo.add(p)
                    continue
            else:
                if cur is None or room.get(cur, 0) <= 0 or run >= SHARED_RUN:
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
        for c, idx in picks.items():
            some, size = self._encode(entries, encoded, idx)
            frames.some(c.outbox, c.handle, some, size)
            for i in idx:
                p = pack(MessageId(entries[i].ledger_id, entries[i].entry_id))
                self.holder[p] = c
                c.pending.add(p)
                self.redo.discard(p)
            self._sent(c, len(idx), size)
            sent += len(idx)
        if self.redo and self.topic is not None:
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
        """Redeliver entries waiting in `redo`, oldest first; True when some went out."""
        tr = self.topic
        if tr is None or not self.redo:
            if tr is not None:
                tr.replays.discard(self)
            return False
        if not any(c.can_take(tr.wake) for c in self.consumers):
            return False
        view = self.ts.view
        todo = sorted(self.redo)[:MAX_FRAME_ENTRIES]
        entries: list[ReadEntry] = []
        i = 0
        while i < len(todo):  # contiguous runs of one ledger, one read each
            j = i + 1
            while j < len(todo) and todo[j] == todo[j - 1] + 1:
                j += 1
            start = unpack(todo[i])
            got = await view.read(start, j - i, MAX_FRAME_BYTES)
            entries += got
            if len(got) < j - i:  # deleted (retention) or past the end: nothing to redeliver
                for p in todo[i + len(got):j]:
                    self.redo.discard(p)
                    self.counts.pop(p, None)
            i = j
        if self.topic is not tr:
            return False
        want = set(todo)
        entries = [e for e in entries if pack(MessageId(e.ledger_id, e.entry_id)) in self.redo
                   and pack(MessageId(e.ledger_id, e.entry_id)) in want]
        keep = [i for i, e in enumerate(entries)
                if not self.cursor.is_acked(MessageId(e.ledger_id, e.entry_id))]
        for i, e in enumerate(entries):
            if i not in keep:
                self.redo.discard(pack(MessageId(e.ledger_id, e.entry_id)))
        enc = wire.encode_entry
        encoded = [enc(e.ledger_id, e.entry_id, e.publish_ms, e.raw) for e in entries]
        frames = Frames()
        before = set(self.redo)
        n = self._spread(entries, encoded, keep, frames)
        frames.send([], 0)
        self.redelivered += n
        if not self.redo:
            tr.replays.discard(self)
        if n:
            self.ts.out.add_out(n, sum(len(e.raw) for e in entries) if entries else 0)
        return n > 0 or self.redo != before

    # ---- acknowledgements and redelivery ---------------------------------------------------

    def ack(self, c: SubConsumer | None, ids: list[MessageId], cumulative: bool) -> None:
        if cumulative:
            if self.type in (SHARED, KEY_SHARED):
                raise errors.NotAllowed(f"cumulative ack is not allowed on {self.type} "
                                        f"subscription {self.name}")
            if not ids:
                return
            top = max(ids)
            self.cursor.ack_cumulative(MessageId(top.ledger_id, top.entry_id),
                                       self.ts.next_after)
            if self.counts:
                limit = pack(MessageId(top.ledger_id, top.entry_id))
                self.counts = {p: n for p, n in self.counts.items() if p > limit}
        else:
            self.cursor.ack([MessageId(m.ledger_id, m.entry_id) for m in ids],
                            self.ts.next_after)
            if self.holder or self.counts:
                for m in ids:
                    p = pack(MessageId(m.ledger_id, m.entry_id))
                    holder = self.holder.pop(p, None)
                    if holder is not None:
                        holder.pending.discard(p)
                    self.counts.pop(p, None)
                    self.redo.discard(p)
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
        for p in positions:
            holder = self.holder.pop(p, None)
            if holder is not None:
                holder.pending.discard(p)
            if not self.cursor.is_acked(unpack(p)):
                self.redo.add(p)
                self.counts[p] = self.counts.get(p, 0) + 1
        if self.redo and self.topic is not None:
            self.topic.replays.add(self)
            self.topic.wake()

    def rewind(self) -> None:
        """Exclusive / Failover: dispatch again from the first unacknowledged entry,
        counting a redelivery for each unacknowledged entry already sent."""
        next_after = self.ts.next_after
        start = self.cursor.read_position(next_after)
        if start >= self.position:
            return
        p, n = start, 0
        while p < self.position and n < MAX_COUNTED:
            if not self.cursor.is_acked(p):
                key = pack(p)
                self.counts[key] = self.counts.get(key, 0) + 1
                n += 1
            nxt = next_after(p)
            if nxt <= p:
                break
            p = nxt
        self._move(start)

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
        self.cursor.seek(position)
        self.cursor.normalize(self.ts.next_after)
        self.holder.clear()
        self.redo.clear()
        self.counts.clear()
        if self.topic is not None:
            self.topic.replays.discard(self)
        for c in self.consumers:
            c.pending = set()
            c.permits = 0
            c.join = None
        self._move(self.cursor.read_position(self.ts.next_after))
        self.ts.changed(self)

    def acked_by_admin(self) -> None:
        """Skip / clear-backlog acknowledged entries: forget them where they wait."""
        first = self.cursor.read_position(self.ts.next_after)
        for p in [p for p in self.holder if self.cursor.is_acked(unpack(p))]:
            self.holder.pop(p).pending.discard(p)
        self.redo = {p for p in self.redo if not self.cursor.is_acked(unpack(p))}
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
        return self.cursor.backlog(self.ts.view.entries_between, self.position)

    def ranges_text(self, limit: int = 100) -> str:
        return "[" + ", ".join(f"({a.ledger_id}:{a.entry_id - 1}..{b})"
                               for a, b in islice(self.cursor.ranges, limit)) + "]"
