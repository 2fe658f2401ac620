"""Key_Shared: an entry goes to the consumer owning its key's hash (Pulsar's
PersistentStickyKeyDispatcherMultipleConsumers).

The Shared dispatcher (shared.py) with another rule for who gets an entry: the owner of its
key's hash on the subscription's `KeyRing` (keyring.py). Per-key order is kept three ways:

- an entry of a key waits in `redo` while an earlier entry of that key does (`redo_hash`
  holds the key hash of each waiting entry; entries put back by a nack or a leaving
  consumer wait in `unknown` until `replay` reads them and learns their hash, and no new
  entry is read meanwhile);
- a consumer that joins while others are attached is held back (`join`) from the entries
  after the subscription's position at its join until everything dispatched before it is
  acknowledged;
- reads pause while `MAX_REDO` entries wait for their consumers (memory stays bounded, as
  Pulsar's look-ahead limit does).
"""
from __future__ import annotations

from collections.abc import Callable

from shadowtopic import wire
from shadowtopic.cursors.state import pack, unpack
from shadowtopic.ledger.view import ReadEntry
from shadowtopic.subscriptions.consumer import SubConsumer
from shadowtopic.subscriptions.dispatcher import KEY_SHARED, Dispatched
from shadowtopic.subscriptions.keyring import KeyRing, key_hash
from shadowtopic.subscriptions.positions import UNUSED, Positions
from shadowtopic.subscriptions.shared import SharedDispatcher

MAX_REDO = 10_000          # entries waiting for their consumer before reads pause


class KeySharedDispatcher(SharedDispatcher):
    __slots__ = ("ring", "redo_hash", "unknown")

    type = KEY_SHARED

    def __init__(self, sub: Dispatched):
        super().__init__(sub)
        self.ring: KeyRing[SubConsumer] | None = None
        # UNUSED until a consumer attaches, as `holder` and `redo`
        self.redo_hash: dict[int, int] = UNUSED   # the key hash of a redo entry
        self.unknown: Positions = UNUSED          # redo entries of unknown hash

    # ---- consumers -------------------------------------------------------------------------

    def add(self, c: SubConsumer) -> None:
        super().add(c)
        if self.redo_hash is UNUSED:
            self.redo_hash, self.unknown = {}, Positions()
        if self.ring is None:
            self.ring = KeyRing()
        if len(self.sub.consumers) > 1:
            c.join = pack(self.sub.position)
        self.ring.add(c, f"{c.name}/{c.seq}")

    def remove(self, c: SubConsumer) -> None:
        if self.ring is not None:
            self.ring.remove(c)
        super().remove(c)
        if not self.sub.consumers:
            self.ring = None

    # ---- dispatch --------------------------------------------------------------------------

    def wanted(self, wake: Callable[[], None]) -> int:
        if self.unknown or len(self.redo) >= MAX_REDO:
            return 0  # new entries wait: their keys' earlier entries must go out first
        return sum(c.permits for c in self.sub.consumers if c.can_take(wake))

    def _pick(self, entries: list[ReadEntry], ps: list[int], keep: list[int],
              takers: list[SubConsumer], room: dict[SubConsumer, int], fresh: bool
              ) -> dict[SubConsumer, list[int]]:
        """Key_Shared: to the owner of the entry's key hash, unless an earlier entry of the
        key waits in `redo` (`fresh` entries only) or the owner joined after it and has not
        seen everything before its join acknowledged."""
        sub = self.sub
        picks: dict[SubConsumer, list[int]] = {}
        first_unacked = pack(sub.cursor.read_position(sub.next_after))
        waiting: set[int] = set()  # key hashes with an earlier entry still in redo
        if fresh and self.redo:
            waiting = {h for p, h in self.redo_hash.items() if p in self.redo}
        for i in keep:
            p = ps[i]
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
            room[c] -= 1
            picks.setdefault(c, []).append(i)
        redo = self.redo
        if len(self.redo_hash) > 2 * len(redo) + 64:
            self.redo_hash = {p: h for p, h in self.redo_hash.items() if p in redo}
        return picks

    def _replaying(self, ps: list[int]) -> None:
        self.unknown.difference_update(ps)

    # ---- redelivery ------------------------------------------------------------------------

    def _forget(self, p: int) -> None:
        self.redo.discard(p)
        self.redo_hash.pop(p, None)
        self.unknown.discard(p)
        self.sub.counts.pop(p, None)

    def _requeue(self, positions: list[int], counted: bool = True) -> None:
        super()._requeue(positions, counted)
        is_acked, redo_hash = self.sub.cursor.is_acked, self.redo_hash
        for p in positions:
            if p not in redo_hash and not is_acked(unpack(p)):
                self.unknown.add(p)  # back in redo: its hash is learnt when replay reads it

    def _clear_redo(self) -> None:
        self.redo.clear()
        self.redo_hash.clear()
        self.unknown.clear()

    def reset(self) -> None:
        super().reset()
        for c in self.sub.consumers:
            c.join = None

    # ---- numbers ---------------------------------------------------------------------------

    def ranges(self, c: SubConsumer) -> list[tuple[int, int]]:
        return self.ring.ranges(c) if self.ring is not None else []
