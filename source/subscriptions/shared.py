"""Shared: the entries of a read spread over the consumers with permits (Pulsar's
PersistentDispatcherMultipleConsumers).

Each entry goes to one consumer, round robin in runs of `SHARED_RUN` entries; what no
consumer can take now waits in `redo`. The dispatcher tracks which consumer holds each
unacknowledged entry (`holder`, and each consumer's `pending`), and puts entries back in
`redo` when their consumer leaves (counting a redelivery for each, in the subscription's
`counts`), nacks them (counting those) or asks for everything again (counting none:
subscription.py says why). Entries in `redo` are redelivered before new ones, by the topic's
dispatch task (`replay`, oldest first), and forgotten once acknowledged or deleted.

Key_Shared (key_shared.py) is this dispatcher with another rule for who gets an entry.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from shadowtopic.core.message_id import MessageId
from shadowtopic.cursors.state import pack, unpack
from shadowtopic.ledger.view import ReadEntry
from shadowtopic.read.engine import MAX_FRAME_BYTES, MAX_FRAME_ENTRIES, Frames
from shadowtopic.subscriptions.consumer import SubConsumer
from shadowtopic.subscriptions.dispatcher import SHARED, Dispatched, Dispatcher, unacked_of
from shadowtopic.subscriptions.positions import UNUSED, Positions

SHARED_RUN = 20            # entries in a row to one Shared consumer before the next one
_LOW = (1 << 64) - 1


class SharedDispatcher(Dispatcher):
    __slots__ = ("holder", "redo", "rr")

    type = SHARED
    cumulative_acks = False

    def __init__(self, sub: Dispatched):
        super().__init__(sub)
        # UNUSED until a consumer attaches (an idle subscription allocates nothing)
        self.holder: dict[int, SubConsumer] = UNUSED
        self.redo: Positions = UNUSED
        self.rr = 0

    # ---- consumers -------------------------------------------------------------------------

    def add(self, c: SubConsumer) -> None:
        if self.holder is UNUSED:
            self.holder, self.redo = {}, Positions()
        c.pending = Positions()

    def remove(self, c: SubConsumer) -> None:
        self._requeue(list(c.pending))
        c.pending = UNUSED
        if not self.sub.consumers:
            self._clear_redo()
            self.holder.clear()
            # redelivery counts stay: the next consumer gets these entries as redelivered

    # ---- dispatch --------------------------------------------------------------------------

    def wanted(self, wake: Callable[[], None]) -> int:
        return sum(c.permits for c in self.sub.consumers if c.can_take(wake))

    def deliver(self, entries: list[ReadEntry], encoded: list[bytes], size: int,
                frames: Frames) -> int:
        ps, keep = unacked_of(self.sub.cursor, entries)
        return self._spread(entries, encoded, ps, keep, frames)

    def _spread(self, entries: list[ReadEntry], encoded: list[bytes], ps: list[int],
                keep: list[int], frames: Frames, fresh: bool = True) -> int:
        """Each kept entry to one consumer (`_pick`); what no consumer can take now waits
        in `redo`. Returns how many went out. `fresh`: entries never dispatched; otherwise
        entries from `redo`, oldest first."""
        sub = self.sub
        wake = sub.topic.wake if sub.topic is not None else (lambda: None)
        takers = [c for c in sub.consumers if c.can_take(wake)]
        room = {c: c.permits for c in takers}
        picks = self._pick(entries, ps, keep, takers, room, fresh)
        sent = 0
        holder, redo = self.holder, self.redo
        for c, idx in picks.items():
            some, size = sub.encode(entries, encoded, ps, idx)
            frames.some(c.outbox, c.handle, some, size)
            pending = c.pending
            for i in idx:
                p = ps[i]
                holder[p] = c
                pending.add(p)
            if redo:
                redo.difference_update(ps[i] for i in idx)
            sub.sent(c, len(idx), size)
            sent += len(idx)
        if redo and sub.topic is not None:
            sub.topic.replays.add(sub)
        return sent

    def _pick(self, entries: list[ReadEntry], ps: list[int], keep: list[int],
              takers: list[SubConsumer], room: dict[SubConsumer, int], fresh: bool
              ) -> dict[SubConsumer, list[int]]:
        """Which consumer gets each kept entry (indexes per consumer, within its `room`);
        the others go to `redo`. Shared: round robin over `takers`, in runs."""
        picks: dict[SubConsumer, list[int]] = {}
        run, cur = 0, None
        for i in keep:
            p = ps[i]
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
        return picks

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
        sub = self.sub
        tr = sub.topic
        if tr is None or not self.redo:
            if tr is not None:
                tr.replays.discard(sub)
            return False
        if not any(c.can_take(tr.wake) for c in sub.consumers):
            return False
        waiting = len(self.redo)
        view = sub.view
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
        if sub.topic is not tr:
            return False
        entries = [e for e in entries if (e.ledger_id << 64) + e.entry_id in self.redo]
        ps = [(e.ledger_id << 64) + e.entry_id for e in entries]
        self._replaying(ps)
        acked = sub.cursor.is_acked_packed
        keep = [i for i, p in enumerate(ps) if not acked(p)]
        for p in ps:
            if acked(p):
                self._forget(p)
        encoded = tr.encoded(entries)
        frames = Frames()
        n = self._spread(entries, encoded, ps, keep, frames, fresh=False)
        frames.send([], 0)
        if not self.redo:
            tr.replays.discard(sub)
        if n:
            sub.resent(n, sum(len(e.raw) for e in entries))
        return len(self.redo) < waiting

    def _replaying(self, ps: list[int]) -> None:
        """The entries at `ps` were read back from `redo` (Key_Shared learns their keys)."""

    # ---- acknowledgements and redelivery ---------------------------------------------------

    def release(self, ps: Iterable[int]) -> None:
        holder, counts, redo = self.holder, self.sub.counts, self.redo
        for p in ps:
            h = holder.pop(p, None)
            if h is not None:
                h.pending.pop(p, None)  # (`Positions.discard`, without its call: per ack)
            if counts:
                counts.pop(p, None)
            if redo and p in redo:
                self._forget(p)

    def _forget(self, p: int) -> None:
        """`p` no longer waits for redelivery (acknowledged, or its ledger is gone)."""
        self.redo.discard(p)
        self.sub.counts.pop(p, None)

    def redeliver(self, c: SubConsumer, ids: list[MessageId] | None) -> None:
        if ids is None:
            self._requeue(list(c.pending), counted=False)
            return
        mine = [pack(MessageId(m.ledger_id, m.entry_id)) for m in ids]
        self._requeue([p for p in mine if p in c.pending])

    def _requeue(self, positions: list[int], counted: bool = True) -> None:
        """`positions` go back to `redo` (those not acknowledged meanwhile), each counting
        one more redelivery when `counted`; their consumer holds them no more."""
        sub = self.sub
        sub.touch()
        for p in positions:
            holder = self.holder.pop(p, None)
            if holder is not None:
                holder.pending.discard(p)
            if not sub.cursor.is_acked(unpack(p)):
                self.redo.add(p)
                if counted:
                    sub.counted()[p] = sub.counts.get(p, 0) + 1
        if self.redo and sub.topic is not None:
            sub.topic.replays.add(sub)
            sub.topic.wake()

    def _clear_redo(self) -> None:
        self.redo.clear()

    def reset(self) -> None:
        self.holder.clear()
        self._clear_redo()
        for c in self.sub.consumers:
            c.pending = Positions()

    # ---- numbers ---------------------------------------------------------------------------

    def unacked(self, c: SubConsumer) -> int:
        return len(c.pending)
