"""Key_Shared routing: which consumer of a subscription gets a key.

Keys hash onto a ring of 65,536 slots (`key_hash`: CRC-32 of the key bytes, low 16 bits;
messages without a key hash as the empty key, so they all go to one consumer, as Pulsar's
NONE_KEY does). Each consumer owns `POINTS` points on the ring, placed by hashing its id
(consistent hashing, Pulsar's AUTO_SPLIT mode); a slot belongs to the consumer owning the
first point at or after it, wrapping around.

How hash ranges move: when a consumer joins, it takes over the slots just before each of its
points, from whichever consumers held them; every other key keeps its consumer. When a
consumer leaves, each of its ranges goes to the consumer owning the next point on the ring.
Order per key survives a join: the subscription holds back messages of a newly joined
consumer's keys that come after its join position until everything dispatched before the
join is acknowledged (key_shared.py, `join`).
"""
from __future__ import annotations

import zlib
from bisect import bisect_left
from typing import Generic, TypeVar

RING = 1 << 16
POINTS = 100

C = TypeVar("C")


def key_hash(key: bytes | None) -> int:
    return zlib.crc32(key or b"") & (RING - 1)


class KeyRing(Generic[C]):
    def __init__(self) -> None:
        self._points: list[int] = []
        self._owners: list[C] = []
        self._ids: dict[C, str] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, consumer: C, ident: str) -> None:
        self._ids[consumer] = ident
        self._rebuild()

    def remove(self, consumer: C) -> None:
        if self._ids.pop(consumer, None) is not None:
            self._rebuild()

    def _rebuild(self) -> None:
        points: dict[int, C] = {}
        for consumer, ident in self._ids.items():
            for i in range(POINTS):
                slot = zlib.crc32(f"{ident}#{i}".encode()) & (RING - 1)
                points.setdefault(slot, consumer)  # a clash keeps the first owner
        order = sorted(points)
        self._points = order
        self._owners = [points[p] for p in order]

    def owner(self, slot: int) -> C | None:
        if not self._points:
            return None
        i = bisect_left(self._points, slot)
        return self._owners[i if i < len(self._points) else 0]

    def ranges(self, consumer: C) -> list[tuple[int, int]]:
        """The inclusive slot ranges `consumer` owns, merged, in order."""
        out: list[tuple[int, int]] = []
        n = len(self._points)
        for i, (point, owner) in enumerate(zip(self._points, self._owners, strict=True)):
            if owner is not consumer:
                continue
            start = self._points[i - 1] + 1 if i else 0
            spans = [(start, point)]
            if i == 0 and n:  # the wrap-around: slots after the last point
                if self._points[-1] + 1 < RING:
                    spans.append((self._points[-1] + 1, RING - 1))
            for lo, hi in spans:
                if lo > hi:
                    continue
                if out and out[-1][1] + 1 == lo:
                    out[-1] = (out[-1][0], hi)
                else:
                    out.append((lo, hi))
        return sorted(out)
