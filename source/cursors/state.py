"""The state of one durable cursor: a mark-delete position plus individually acked ranges,
and when its subscription was last active.

Everything at or before `mark_delete` is acknowledged; above it, individually acknowledged
ids are kept as sorted, merged ranges, so a subscription with few holes costs a few hundred
bytes however many messages it acknowledged (`__slots__`, one int for the mark-delete, no
list at all while there are no holes).

Positions are packed into one int, `ledger_id << 64 | entry_id`, whose order is MessageId
order; `p - 1` / `p + 1` are the neighbours inside a ledger, and `(L << 64) - 1` is "before
entry 0 of ledger L" (shown as `L:-1`, as Pulsar does). Ranges are held half-open,
`[first, last + 1)`, as a flat list of strictly increasing boundaries. Partitions are not
part of a cursor (each partition is a topic of its own): ids lose their partition here.

The state knows nothing of the ledger layout. Where contiguity across ledger boundaries
matters (moving the mark-delete over ledger ends, ledgers with no entries or deleted ones,
finding the read position), callers pass `next_after`: the first position after an id that
holds an entry or will hold the next one (`next_after_in(view)` builds it from a
`LedgerView`). Backlog counting takes the view's `entries_between`, so it counts only
entries that exist.

`last_active` (ms since the epoch) is when the subscription last had a consumer, persisted
with the cursor as Pulsar persists ManagedCursorInfo.lastActive, so that
subscription_expiration_seconds (source/subscriptions/expiry.py) counts across restarts. The
subscription sets it (subscription.py): 0 while a consumer is attached (active now), the
detach time when the last one leaves. 0 is also "unknown" (files written before it was
persisted): a subscription loaded with 0 counts from its load.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from operator import lt
from typing import Protocol

from shadowtopic.core.message_id import MessageId
from shadowtopic.ledger.view import LedgerRange, LedgerView


class NextAfter(Protocol):
    """The first valid position after an id (`next_after_in`). `sparse`: the view skips ids
    inside a ledger too (a compacted view), so a cursor asks it about every gap, not only
    about ledger ends."""

    sparse: bool

    def __call__(self, mid: MessageId) -> MessageId: ...
EntriesBetween = Callable[[MessageId, MessageId], int]
#: a cursor as plain immutable numbers (what the stores keep and write): (mark-delete ledger,
#: mark-delete entry, (first ledger, first entry, last ledger, last entry)*, last_active ms)
Record = tuple[int, int, tuple[int, ...], int]

_MASK = (1 << 64) - 1


def pack(mid: MessageId) -> int:
    """One int ordered as MessageIds are (entry -1 = before entry 0 of that ledger)."""
    return (mid.ledger_id << 64) + mid.entry_id


def unpack(p: int) -> MessageId:
    ledger, entry = p >> 64, p & _MASK
    if entry == _MASK:
        return MessageId(ledger + 1, -1)
    return MessageId(ledger, entry)


class next_after_in:  # lower case: called as a function (as functools.partial is)
    """`next_after` over a ledger view (a `NextAfter`): the first valid position after an
    id; `sparse` for a view that skips ids inside a ledger (a compacted view)."""

    __slots__ = ("view", "sparse")

    def __init__(self, view: LedgerView, sparse: bool = False):
        self.view = view
        self.sparse = sparse

    def __call__(self, mid: MessageId) -> MessageId:
        return self.view.valid_position(MessageId(mid.ledger_id, mid.entry_id + 1))


#: the mark-delete position of a cursor that has acknowledged nothing (before entry 0 of
#: ledger 0)
NOTHING_ACKED = MessageId(0, -1)


class CursorState:
    """Mark-delete position + individually acknowledged ranges + last activity (module
    docstring)."""

    __slots__ = ("_md", "_r", "last_active")

    def __init__(self, mark_delete: MessageId = NOTHING_ACKED,
                 ranges: Iterable[tuple[MessageId, MessageId]] = (), last_active: int = 0):
        self._md = pack(mark_delete)
        self._r: list[int] | None = None
        #: ms since the epoch the subscription last had a consumer (0: now / unknown)
        self.last_active = last_active
        for first, last in ranges:
            if pack(first) > pack(last):
                raise ValueError(f"empty range {first}..{last}")
            if pack(last) > self._md:
                self._insert(max(pack(first), self._md + 1), pack(last) + 1)
        self.normalize()

    @classmethod
    def starting_at(cls, position: MessageId) -> CursorState:
        """A cursor whose first unacknowledged position is `position`."""
        state = cls()
        state._md = pack(position) - 1
        return state

    # ---- reading ---------------------------------------------------------------------------

    @property
    def mark_delete(self) -> MessageId:
        return unpack(self._md)

    @property
    def ranges(self) -> list[tuple[MessageId, MessageId]]:
        """Individually acknowledged ranges above the mark-delete, inclusive, in order."""
        r = self._r or ()
        return [(unpack(r[i]), unpack(r[i + 1] - 1)) for i in range(0, len(r), 2)]

    @property
    def holes(self) -> int:
        """How many acknowledged ranges sit above the mark-delete (0: no holes)."""
        return len(self._r) // 2 if self._r else 0

    def key(self) -> tuple[int, int] | None:
        """(packed mark-delete, last_active) of a cursor without holes: two such cursors
        with equal keys are equal (cohorts, source/subscriptions/cohorts.py); None with
        holes."""
        return None if self._r else (self._md, self.last_active)

    def is_acked(self, mid: MessageId) -> bool:
        p = pack(mid)
        return p <= self._md or (self._r is not None and bisect_right(self._r, p) & 1 == 1)

    def read_position(self, next_after: NextAfter) -> MessageId:
        """The first unacknowledged position after the mark-delete (normalising it first)."""
        self.normalize(next_after)
        return next_after(unpack(self._md))

    def backlog(self, entries_between: EntriesBetween, end: MessageId) -> int:
        """Unacknowledged entries before `end` (exclusive; usually `view.next_position()`):
        entries after the mark-delete minus the individually acknowledged ones."""
        stop = pack(end)
        if self._md + 1 >= stop:
            return 0
        total = entries_between(unpack(self._md + 1), end)
        r = self._r or ()
        for i in range(0, len(r), 2):
            if r[i] >= stop:
                break
            total -= entries_between(unpack(r[i]), unpack(min(r[i + 1], stop)))
        return total

    # ---- acknowledging ---------------------------------------------------------------------

    def is_acked_packed(self, p: int) -> bool:
        """`is_acked` of a packed position (the dispatch hot path)."""
        return p <= self._md or (self._r is not None and bisect_right(self._r, p) & 1 == 1)

    def ack(self, ids: Iterable[MessageId], next_after: NextAfter | None = None) -> int:
        """Acknowledge ids individually; returns how many were not acknowledged before."""
        return self.ack_packed(map(pack, ids), next_after)

    def ack_packed(self, positions: Iterable[int], next_after: NextAfter | None = None) -> int:
        """`ack` of packed positions."""
        if self._r is None and type(positions) is list and len(positions) == 1 \
                and positions[0] == self._md + 1:
            self._md += 1  # the common case: the next entry, no holes
            return 1
        newly = 0
        touched_first = False
        for p in sorted(positions):
            if p <= self._md or (self._r is not None and bisect_right(self._r, p) & 1):
                continue
            touched_first |= self._insert(p, p + 1) == 0
            newly += 1
        if touched_first:
            self.normalize(next_after)
        return newly

    def ack_one(self, p: int, next_after: NextAfter, after: dict[int, int]) -> int:
        """`ack_packed([p], next_after)` for one of many cursors acknowledging the same
        position (a broadcast message acknowledged by many subscriptions at once). `after`
        maps a mark-delete to the first position after it, and is shared by every cursor of
        the call that moves by the same `next_after`: cursors at the same mark-delete (most
        of them, moving together) ask the view once. A cursor with holes, or `p` not next
        after its mark-delete, goes the long way."""
        md = self._md
        if self._r is None and p > md:
            if p == md + 1:
                self._md = p
                return 1
            nxt = after.get(md)
            if nxt is None:
                nxt = after[md] = pack(next_after(unpack(md)))
            if p == nxt:  # everything between is absent (compacted away, a ledger's end)
                self._md = p
                return 1
        return self.ack_packed([p], next_after)

    def ack_ranges(self, ranges: Iterable[tuple[int, int]],
                   next_after: NextAfter | None = None) -> bool:
        """Acknowledge inclusive ranges of packed positions, `(first, last)` with first <=
        last (the caller checks), each as one insertion whatever its length; True when
        anything was not acknowledged before."""
        changed = touched_first = False
        for first, last in ranges:
            if last <= self._md:
                continue
            first = max(first, self._md + 1)
            r = self._r
            if r is None:
                if first == self._md + 1:  # the common case: right after the mark-delete
                    self._md = last
                    changed = True
                    continue
            else:
                i = bisect_right(r, first)
                if i & 1 and last < r[i]:
                    continue  # inside one acknowledged range already
            touched_first |= self._insert(first, last + 1) == 0
            changed = True
        if touched_first:
            self.normalize(next_after)
        return changed

    def acked_from(self, p: int) -> bool:
        """Some position at or after packed `p` is acknowledged individually (False: the
        entries of a read from `p` on need no `is_acked` filter)."""
        return p <= self._md or (self._r is not None and self._r[-1] > p)

    def ack_cumulative(self, mid: MessageId, next_after: NextAfter | None = None) -> bool:
        """Acknowledge everything up to and including `mid`; True if the mark-delete moved."""
        p = pack(mid)
        if p <= self._md:
            return False
        self._advance(p)
        self.normalize(next_after)
        return True

    def seek(self, position: MessageId) -> None:
        """Reset: `position` becomes the first unacknowledged entry; nothing after it stays
        acknowledged (Pulsar's reset-cursor)."""
        self._md = pack(position) - 1
        self._r = None

    def skip_trimmed(self, trimmed: Sequence[LedgerRange],
                     next_after: NextAfter | None = None) -> int:
        """Ledgers were deleted from the front of the topic: move past them and return how
        many of their entries this cursor had not acknowledged (they are skipped)."""
        counts = {r.ledger_id: r.entries for r in trimmed}
        if not counts:
            return 0

        def between(start: MessageId, end: MessageId) -> int:
            total = 0
            for lid, n in counts.items():
                lo = start.entry_id if lid == start.ledger_id else 0
                hi = min(n, end.entry_id) if lid == end.ledger_id else n
                if start.ledger_id <= lid <= end.ledger_id:
                    total += max(0, hi - lo)
            return total

        last = max(counts)
        skipped = self.backlog(between, MessageId(last + 1, 0))
        if pack(MessageId(last, counts[last] - 1)) > self._md:
            self._advance(pack(MessageId(last, counts[last] - 1)))
        self.normalize(next_after)
        return skipped

    def normalize(self, next_after: NextAfter | None = None) -> None:
        """Move the mark-delete over acknowledged ranges that are contiguous with it: inside a
        ledger always, across ledger ends (or deleted ledgers) when `next_after` is given,
        and across any gap when `next_after` is sparse (ids compacted away)."""
        r = self._r
        while r:
            first = r[0]
            if first != self._md + 1:
                if next_after is None or first >> 64 == (self._md + 1) >> 64 and \
                        not next_after.sparse:
                    break  # a gap inside one ledger holds unacknowledged entries
                if pack(next_after(unpack(self._md))) < first:
                    break
            self._md = max(self._md, r[1] - 1)
            del r[:2]
        if not r:
            self._r = None

    # ---- records and copies ----------------------------------------------------------------

    def to_record(self) -> Record:
        md = self._md
        ledger, entry = md >> 64, md & _MASK
        if entry == _MASK:
            ledger, entry = ledger + 1, -1
        if not self._r:
            return ledger, entry, (), self.last_active
        flat: list[int] = []
        for i, p in enumerate(self._r):  # first, last + 1, first, last + 1, ...
            p -= i & 1
            flat += (p >> 64, p & _MASK)
        return ledger, entry, tuple(flat), self.last_active

    @classmethod
    def from_record(cls, record: Record) -> CursorState:
        """The inverse of `to_record`; ValueError for ranges that are not sorted, disjoint,
        non-adjacent and above the mark-delete."""
        md_ledger, md_entry, flat, last_active = record
        state: CursorState = cls.__new__(cls)
        state._md = (md_ledger << 64) + md_entry
        state._r = None
        state.last_active = last_active
        if not flat:  # the common case, kept cheap: loading 100,000 cursors is one loop
            return state
        if len(flat) % 4:
            raise ValueError("a cursor record's ranges come in fours")
        r = [(flat[i] << 64) + flat[i + 1] + (i & 2 == 2) for i in range(0, len(flat), 2)]
        if r[0] <= state._md or not all(map(lt, r, r[1:])):
            raise ValueError(f"cursor record ranges out of order: {flat}")
        state._r = r
        state.normalize()
        return state

    def copy(self) -> CursorState:
        other: CursorState = CursorState.__new__(CursorState)
        other._md = self._md
        other._r = list(self._r) if self._r else None
        other.last_active = self.last_active
        return other

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CursorState):
            return NotImplemented
        return self._md == other._md and (self._r or []) == (other._r or []) \
            and self.last_active == other.last_active

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        holes = ", ".join(f"{a}..{b}" for a, b in self.ranges)
        return (f"CursorState(mark_delete={self.mark_delete}, acked=[{holes}], "
                f"last_active={self.last_active})")

    # ---- internals -------------------------------------------------------------------------

    def _insert(self, start: int, end: int) -> int:
        """Add the half-open range [start, end) (above the mark-delete), merging neighbours;
        returns the index of the range it ended up in."""
        r = self._r
        if r is None:
            self._r = [start, end]
            return 0
        i = bisect_left(r, start)   # odd: a range ends at or after `start` -> merge with it
        j = bisect_right(r, end)    # odd: a range starts at or before `end` -> merge with it
        lo = i - 1 if i & 1 else i
        hi = j + 1 if j & 1 else j
        r[lo:hi] = [r[i - 1] if i & 1 else start, r[j] if j & 1 else end]
        return lo // 2

    def _advance(self, p: int) -> None:
        """Mark-delete to `p` (> current), absorbing ranges that reach `p + 1`."""
        self._md = p
        r = self._r
        if r is None:
            return
        j = bisect_right(r, p + 1)
        if j & 1:                   # a range starts at or before p + 1 and ends after it
            self._md = r[j] - 1
            j += 1
        del r[:j]
        if not r:
            self._r = None
