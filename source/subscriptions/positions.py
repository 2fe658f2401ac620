"""Sets of packed positions (`shadowtopic.cursors.state.pack`) as subscriptions hold them.

`Positions` keeps them as a dict's keys: empty, it is 64 bytes where a set is 216, and every
idle subscription and consumer holds a few. `UNUSED` is the one shared, empty, read-only
stand-in for the Shared / Key_Shared structures of subscriptions that never use them.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator


class Positions(dict):
    """A set of packed positions held as a dict's keys: empty, it is 64 bytes where a set is
    216, and every idle subscription and consumer holds a few of them."""

    __slots__ = ()

    def add(self, p: int) -> None:
        self[p] = None

    def discard(self, p: int) -> None:
        self.pop(p, None)

    def difference_update(self, ps) -> None:
        for p in ps:
            self.pop(p, None)


def in_ranges(ranges: Iterable[tuple[int, int]], *held: Collection[int]) -> Iterator[int]:
    """The positions of the inclusive `(first, last)` ranges that may be in any of `held`
    (acknowledged ranges meeting what a subscription holds, counts or waits to redeliver):
    a range is walked when it is shorter than what is held, else what is held is scanned,
    so a long range costs what is held, never its length. (May repeat a position.)"""
    size = sum(len(h) for h in held)
    for first, last in ranges:
        if last - first < size:
            yield from range(first, last + 1)
        else:
            for h in held:
                yield from [p for p in h if first <= p <= last]


class _Unused(Positions):
    """The one empty stand-in for the Shared / Key_Shared structures of subscriptions that
    do not use them (an Exclusive subscription has no holder, no redo): reading it is
    reading an empty dict; writing to it is a bug and raises. Saves ~400 bytes per idle
    subscription."""

    __slots__ = ()

    def __setitem__(self, key, value):
        raise TypeError("write to the shared empty stand-in: allocate first")

    def setdefault(self, key, default=None):
        raise TypeError("write to the shared empty stand-in: allocate first")

    def update(self, *args, **kwargs):
        raise TypeError("write to the shared empty stand-in: allocate first")


UNUSED = _Unused()
