"""Cohorts: subscriptions of one topic whose cursors are equal share one `CursorState`.

Most subscriptions of a broadcast topic sit at one position and acknowledge the same message
within the same second. A `Cohort` is such a set: its members hold one cursor object
(`member.cursor is cohort.state`), so

- an acknowledgement by every member moves that cursor once (`TopicSubscriptions.ack_many`
  groups the consumers of one Ack by cohort); when only some members acknowledge, they
  leave together on a copy that moves (`split`);
- a cursor that reaches the position of another with no holes joins it (`settle`): cohorts
  merge back when positions meet;
- the flusher takes one record per cursor object (`shadowtopic.cursors.store.records`),
  and a restart loads equal records as one cohort again (`settle` of every subscription).

Rules that keep every member's cursor exact (tests/test_source/subscriptions/
test_cohorts.py drives random acknowledgements of 1,000 subscriptions beside a model with a
cursor per subscription):

1. The shared state changes only for every member at once (a whole cohort acknowledging;
   ledgers trimmed, which move every raw cursor alike). A member that changes alone takes
   its own copy first (`own`), leaving its cohort.
2. The flusher maps names to cursor objects and reads them when it saves, so a name must
   never stay mapped to an object that moves on without it: a member that leaves a cohort
   (`own`, `split`) is marked changed with its new object. A member that joins another
   (`settle`) needs no mark: the object it leaves is held by nobody any more, never moves
   again, and holds the value it joined with.
3. Only cursors without holes meet (`CursorState.key`: two hole-free cursors with equal
   keys are equal). A cohort whose cursor gained holes by a whole-cohort ack stays one; no
   other cursor finds it until the holes are gone.
4. Raw and read_compacted cursors never share: they move by different views.

A member alone has no cohort object (`cohort is None`), so subscriptions at 100,000
different positions cost nothing here. `_at` indexes who holds each hole-free cursor value
(a cohort, or a lone member); an entry is checked when found (its holder may have moved
since), and stale entries are swept once they outnumber the live ones.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

from shadowtopic.cursors.state import CursorState

#: (packed mark-delete, last_active ms, read_compacted): equal keys, equal cursors
Key = tuple[int, int, bool]
SWEEP_MIN = 1024


class Member(Protocol):
    """What a cohort needs of a subscription: the cursor it holds, its cohort, and which
    view its cursor moves by."""

    cursor: CursorState
    cohort: Cohort | None
    compacted: bool


M = TypeVar("M", bound=Member)


class Cohort(Generic[M]):
    """Members (two or more) holding one cursor object."""

    __slots__ = ("state", "members", "compacted")

    def __init__(self, state: CursorState, members: set[M], compacted: bool):
        self.state = state
        self.members = members
        self.compacted = compacted

    def __repr__(self) -> str:
        return f"Cohort({len(self.members)} members at {self.state!r})"


def key_of(state: CursorState, compacted: bool) -> Key | None:
    k = state.key()
    return None if k is None else (k[0], k[1], compacted)


class Cohorts(Generic[M]):
    """The cohorts of one topic's subscriptions."""

    def __init__(self) -> None:
        self._at: dict[Key, Cohort[M] | M] = {}
        self._sweep_at = SWEEP_MIN

    # ---- reading ---------------------------------------------------------------------------

    def cohorts(self) -> list[Cohort[M]]:
        """The live cohorts (each has at least two members)."""
        return [h for k, h in self._at.items()
                if isinstance(h, Cohort) and self._holds(h, k)]

    # ---- a member alone --------------------------------------------------------------------

    def own(self, m: M) -> CursorState:
        """`m`'s cursor, to change alone: a cohort member leaves on a copy (rule 1); a lone
        member's index entry goes (it is about to move). The caller marks `m` changed once
        it changed the cursor (rule 2)."""
        co = m.cohort
        if co is None:
            self._unindex(m, m.cursor, m.compacted)
            return m.cursor
        self._leave(co, (m,))
        m.cursor = m.cursor.copy()
        return m.cursor

    def drop(self, m: M) -> None:
        """`m` is deleted: it leaves its cohort and the index."""
        if m.cohort is None:
            self._unindex(m, m.cursor, m.compacted)
        else:
            self._leave(m.cohort, (m,))

    # ---- a cohort moving as one ------------------------------------------------------------

    def moving(self, holder: Cohort[M] | M) -> CursorState:
        """`holder`'s cursor, about to move for every member at once; its index entry goes
        (`settle` puts it back where it lands)."""
        state = holder.state if isinstance(holder, Cohort) else holder.cursor
        self._unindex(holder, state, holder.compacted)
        return state

    def split(self, co: Cohort[M], movers: set[M]) -> Cohort[M] | M:
        """Some of `co`'s members (`movers`, not all of them) leave it together on a copy
        of its cursor; returns what holds them now (a new cohort, or the one member)."""
        state = co.state.copy()
        self._leave(co, movers)
        if len(movers) == 1:
            (m,) = movers
            m.cursor = state
            return m
        new: Cohort[M] = Cohort(state, movers, co.compacted)
        for m in movers:
            m.cursor = state
            m.cohort = new
        return new

    # ---- meeting ---------------------------------------------------------------------------

    def settle(self, holder: Cohort[M] | M) -> None:
        """`holder`'s cursor changed (or was loaded): when another holds an equal cursor,
        the smaller of the two joins the larger (its members need no mark: rule 2)."""
        if isinstance(holder, Cohort):
            if len(holder.members) < 2:
                return  # dissolved meanwhile
            state = holder.state
        else:
            if holder.cohort is not None:
                holder = holder.cohort
                state = holder.state
            else:
                state = holder.cursor
        k = key_of(state, holder.compacted)
        if k is None:
            return
        other = self._at.get(k)
        if other is None or other is holder or not self._holds(other, k):
            self._index(k, holder)
            return
        big, small = ((holder, other) if len(self._members(holder)) >= len(self._members(other))
                      else (other, holder))
        joiners = list(self._members(small))
        if isinstance(small, Cohort):
            small.members = set()
        if isinstance(big, Cohort):
            target = big
            target.members.update(joiners)
        else:
            target = Cohort(big.cursor, {big}, big.compacted)
            big.cohort = target
            target.members.update(joiners)
        for m in joiners:
            m.cursor = target.state
            m.cohort = target
        self._at[k] = target

    # ---- internals -------------------------------------------------------------------------

    @staticmethod
    def _members(holder: Cohort[M] | M) -> set[M] | tuple[M]:
        return holder.members if isinstance(holder, Cohort) else (holder,)

    def _holds(self, holder: Cohort[M] | M, k: Key) -> bool:
        """`holder`, found at `k`, still holds a cursor of that value."""
        if isinstance(holder, Cohort):
            return len(holder.members) >= 2 and key_of(holder.state, holder.compacted) == k
        return holder.cohort is None and key_of(holder.cursor, holder.compacted) == k

    def _index(self, k: Key, holder: Cohort[M] | M) -> None:
        self._at[k] = holder
        if len(self._at) > self._sweep_at:
            self._at = {key: h for key, h in self._at.items() if self._holds(h, key)}
            self._sweep_at = max(SWEEP_MIN, 2 * len(self._at))

    def _unindex(self, holder: Cohort[M] | M, state: CursorState, compacted: bool) -> None:
        k = key_of(state, compacted)
        if k is not None and self._at.get(k) is holder:
            del self._at[k]

    def _leave(self, co: Cohort[M], leaving: Iterable[M]) -> None:
        members = co.members
        for m in leaving:
            members.discard(m)
            m.cohort = None
        if len(members) == 1:  # one left: it holds the cursor alone, where the cohort was
            (last,) = members
            co.members = set()
            last.cohort = None
            k = key_of(co.state, co.compacted)
            if k is not None and self._at.get(k) is co:
                self._at[k] = last
        elif not members:
            self._unindex(co, co.state, co.compacted)
