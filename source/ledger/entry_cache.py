"""The broker's entry cache: one memory budget for the entries every topic holds.

A broker holds entries in memory in three places: the confirmed entries of each topic's
open ledger (`TailEntries`, what appends fill and readers at the tail read), decoded WAL
frames its ledger readers re-read (source/ledger/ledger_reader.py), and each topic's
encoded-entry cache (source/read/engine.py). One `EntryCache` per broker process
(`--entry-cache-bytes`) accounts all of them.

Accounting. Holders charge the cache in chunks (`Item`s), never per entry: an open ledger
charges one item per ~`chunk_bytes` of raws it appends (the current chunk grows with each
group commit until it is full), a ledger reader one item per batch of frames it re-reads,
a topic's encoded cache one item that it resizes as it fills and empties. `held` is the sum
of the items (raw bytes, not Python object overhead); `peak` is the most ever held after
an eviction pass.

Eviction. Items sit in one LRU order across every topic: a new or grown chunk goes to the
end, a cache hit moves its item to the end, open-ledger chunks are never moved otherwise.
When a charge takes `held` over `limit`, items are evicted from the front (the least
recently used, across topics) until `held <= limit` (an item larger than the whole budget
is dropped at once, alone); so after every charge `held` is within the budget and each
charge costs O(1) plus the items it evicts. An evicted item's holder
drops what it covers: an open ledger its oldest in-memory entries up to the chunk's end
(its chunks are in FIFO order, so eviction always drops a prefix and `offset`, the first
entry still in memory, only grows), a reader the frames it had decoded, a topic its
encodings. Only confirmed entries are ever charged, i.e. entries fsynced in the WAL: an
evicted entry of an open ledger is read back from the WAL through the ledger's
`FrameIndex` (only the frames needed, CRC-checked); a sealed ledger's from Parquet.
Sealing reads every entry back from the WAL a frame at a time (source/ledger/sealed.py),
so it holds no copy of the ledger and needs nothing from memory.

Everything here runs on the event loop thread; eviction callbacks only drop references.
"""
from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from shadowtopic.ledger import wal as walmod

log = logging.getLogger(__name__)
DEFAULT_BYTES = 256 << 20
MAX_CHUNK = 1 << 20


class Item:
    """One charge against the budget. `live` turns False when it is evicted or released."""

    __slots__ = ("nbytes", "on_evict", "data", "live", "key")

    def __init__(self, key: int, nbytes: int, on_evict: Callable[[Item], None], data: Any):
        self.key = key
        self.nbytes = nbytes
        self.on_evict = on_evict
        self.data = data
        self.live = True


class EntryCache:
    """A broker-wide budget of entry bytes held in memory, evicting least recently used
    chunks across topics (see the module docstring)."""

    def __init__(self, limit: int = DEFAULT_BYTES):
        self.limit = max(0, int(limit))
        self.chunk_bytes = max(4 << 10, min(MAX_CHUNK, self.limit // 16))
        self.held = 0
        self.peak = 0
        self.evicted_bytes = 0
        self.evictions = 0
        self._items: OrderedDict[int, Item] = OrderedDict()
        self._next_key = 0
        self._next_log = self.limit or 1

    def __len__(self) -> int:
        return len(self._items)

    def charge(self, nbytes: int, on_evict: Callable[[Item], None], data: Any = None) -> Item:
        """A new item of `nbytes` at the most recently used end; evicts when over budget
        (possibly this very item: check `item.live`)."""
        self._next_key += 1
        item = Item(self._next_key, nbytes, on_evict, data)
        self._items[item.key] = item
        self.held += nbytes
        self._trim(item)
        return item

    def grow(self, item: Item, delta: int) -> None:
        """`item` holds `delta` more bytes (or fewer) and was just used."""
        if not item.live:
            return
        item.nbytes += delta
        self.held += delta
        self._items.move_to_end(item.key)
        if delta > 0:
            self._trim(item)

    def resize(self, item: Item, nbytes: int) -> None:
        self.grow(item, nbytes - item.nbytes)

    def touch(self, item: Item) -> None:
        """`item` was used: it is evicted last."""
        if item.live:
            self._items.move_to_end(item.key)

    def release(self, item: Item) -> None:
        """Its holder dropped it (no callback)."""
        if item.live:
            item.live = False
            del self._items[item.key]
            self.held -= item.nbytes

    def _trim(self, new: Item) -> None:
        if new.nbytes > self.limit:  # it can never fit: it goes alone, not after the rest
            self._evict(self._items.pop(new.key))
        items = self._items
        while self.held > self.limit and items:
            self._evict(items.popitem(last=False)[1])
        if self.held > self.peak:
            self.peak = self.held
        if self.evicted_bytes >= self._next_log:
            self._next_log = max(self._next_log * 2, self.evicted_bytes)
            log.info("entry cache: %s", self.describe())

    def _evict(self, item: Item) -> None:
        item.live = False
        self.held -= item.nbytes
        self.evicted_bytes += item.nbytes
        self.evictions += 1
        item.on_evict(item)

    def stats(self) -> dict[str, int]:
        return {"limit": self.limit, "held": self.held, "peak": self.peak,
                "items": len(self._items), "evictions": self.evictions,
                "evicted_bytes": self.evicted_bytes}

    def describe(self) -> str:
        s = self.stats()
        return " ".join(f"{k}={v}" for k, v in s.items())


class TailEntries(walmod.Entries):
    """The confirmed entries of one unsealed ledger this broker writes, charged to the
    broker's `EntryCache` and dropped from the front when it evicts them. `frames` says
    where each WAL frame starts, so a dropped entry is read back by frame."""

    def __init__(self, cache: EntryCache, wal_path: str):
        super().__init__()
        self.cache = cache
        self.wal_path = wal_path          # absolute path of the WAL
        self.frames = walmod.FrameIndex()
        self._chunks: deque[Item] = deque()  # live chunks, oldest first; data = end id

    def confirmed(self, publish_ms: int, raws: list[bytes], size: int, frame_offset: int,
                  frame_length: int) -> None:
        """The entries of a fsynced WAL frame (at `frame_offset`) become readable: they are
        indexed, held and charged to the cache, which may drop them at once."""
        self.frames.add(len(self), len(raws), publish_ms, frame_offset, frame_length)
        self.extend(publish_ms, raws, size)
        end = len(self)
        last = self._chunks[-1] if self._chunks else None
        if last is not None and last.live and last.nbytes < self.cache.chunk_bytes:
            last.data = end
            self.cache.grow(last, size)
            return
        item = self.cache.charge(size, self._evicted, end)
        if item.live:
            self._chunks.append(item)

    def _evicted(self, item: Item) -> None:
        end = item.data
        k = end - self.offset
        if k > 0:
            del self.raws[:k]
            self.offset = end
        chunks = self._chunks
        while chunks and chunks[0].data <= end:
            chunk = chunks.popleft()
            if chunk is not item:
                self.cache.release(chunk)

    def drop_all(self) -> None:
        """Release every chunk and drop every raw (the ledger sealed or closed)."""
        while self._chunks:
            self.cache.release(self._chunks.popleft())
        self.offset = len(self)
        self.raws = []

    def held(self) -> int:
        return sum(map(len, self.raws))
