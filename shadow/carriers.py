"""Carriers: which of a source's shadows on this broker brings the source's bytes.

A shadow broker that does not share the source's WAL reads the unsealed tail from the
broker's `TailCache` (shadow/tail.py), filled by the replication streams that carry the
entries' `raw` bytes (an ack's `want_raw`). Every shadow of a source has a stream of its own
(one replicator per source/shadow pair, shadow/replicator.py), but the bytes are the same:
ONE stream per source carries them, so the source reads and sends them once per shadow
broker, not once per shadow, and this broker parses them once.

    carrier   per source, the shadow whose acks say `want_raw`: the first to ask, for as
              long as its batches keep coming (a stream sends at least a heartbeat every
              0.5 s; one not heard of for CARRIER_IDLE_S hands over to the next to ask)
    waiting   the other shadows' streams send ids only. An id the cache does not hold yet
              (the carrier's batch with those bytes is still on its way) is applied when it
              arrives, or after WAIT_S at the latest: the shadow then reads them from the
              source's owner (`Storage.ReadEntries`), and takes over as carrier, as the
              one at the tail (the carrier is behind: catching up, or gone)

At most one waiting id per shadow (ids only move forward: a newer one replaces it).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

CARRIER_IDLE_S = 1.5
WAIT_S = 0.1

Id = tuple[int, int]  # (ledger id, entry id)


class _Waiting:
    __slots__ = ("last", "apply", "timer")

    def __init__(self, last: Id, apply: Callable[[], None], timer: asyncio.TimerHandle):
        self.last, self.apply, self.timer = last, apply, timer


class Carriers:
    def __init__(self, idle_s: float = CARRIER_IDLE_S, wait_s: float = WAIT_S):
        self.idle_s = idle_s
        self.wait_s = wait_s
        self._carrier: dict[str, tuple[str, float]] = {}  # source -> (shadow, last heard)
        self._newest: dict[str, Id] = {}                 # source -> newest id carried
        self._waiting: dict[str, dict[str, _Waiting]] = {}  # source -> shadow -> its id
        self.handovers = 0  # a waiting shadow took over (stats, tests)

    def carries(self, source: str, shadow: str) -> bool:
        """Whether `shadow`'s stream should carry `source`'s bytes (it just sent a batch)."""
        now = asyncio.get_running_loop().time()
        cur = self._carrier.get(source)
        if cur is None or cur[0] == shadow or now - cur[1] > self.idle_s:
            self._carrier[source] = (shadow, now)
            return True
        return False

    def carried(self, source: str, last: Id) -> None:
        """Entries of `source` up to `last` are in the cache: the ids waiting for them apply."""
        if last > self._newest.get(source, (-1, -1)):
            self._newest[source] = last
        waiting = self._waiting.get(source)
        if not waiting:
            return
        for shadow, w in list(waiting.items()):
            if w.last <= last:
                del waiting[shadow]
                w.timer.cancel()
                w.apply()

    def when_carried(self, source: str, shadow: str, last: Id,
                     apply: Callable[[], None]) -> None:
        """Call `apply` once the cache holds `source`'s entries up to `last`, or after the
        wait at the latest (then `shadow` becomes the carrier)."""
        if last <= self._newest.get(source, (-1, -1)):
            apply()
            return
        waiting = self._waiting.setdefault(source, {})
        w = waiting.get(shadow)
        if w is not None:  # a newer id of the same shadow: it replaces the older one
            w.last, w.apply = max(w.last, last), apply
            return
        timer = asyncio.get_running_loop().call_later(self.wait_s, self._late, source, shadow)
        waiting[shadow] = _Waiting(last, apply, timer)

    def _late(self, source: str, shadow: str) -> None:
        w = self._waiting.get(source, {}).pop(shadow, None)
        if w is None:
            return
        self._carrier[source] = (shadow, asyncio.get_running_loop().time())
        self.handovers += 1
        w.apply()

    def forget(self, shadow: str) -> None:
        """`shadow`'s stream ended: what it waits for applies now (no id is held back)."""
        for source, waiting in list(self._waiting.items()):
            w = waiting.pop(shadow, None)
            if w is not None:
                w.timer.cancel()
                w.apply()
            if not waiting:
                del self._waiting[source]
