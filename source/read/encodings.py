"""Encoded entries: the `EncodedEntry` bytes (source/wire.py) of recently read entries,
kept so that one entry is encoded once however many dispatch groups send it.

An entry's encoding depends only on its id, publish time and `raw` bytes, and those never
change for an id: ledger ids come from one cluster-wide counter, a ledger's entries are
immutable once confirmed, and a compacted ledger keeps its rows' ids and `raw`
(compaction/ledger.py). So every view of the same ledgers on a broker can share them: a
source's readers and its durable subscriptions, its compacted readers, and on a shadow
broker every shadow of the same source (a shadow serves its source's entries under the
source's ids). `LedgerView.ledgers_of` names those ledgers, and is the key here.

    EncodingsPool   one per broker: the `Encodings` of each `ledgers_of` that a dispatch
                    group (`TopicReaders`, source/read/engine.py) uses, counted by user;
                    the last user's release drops them
    Encodings       an LRU of (ledger_id, entry_id) -> bytes, at most ENCODED_CACHE_BYTES,
                    charged to the broker's entry-cache budget (source/ledger/
                    entry_cache.py) when the view has one; the budget evicting them
                    empties them. Members at nearby positions read the same entries a
                    frame or two apart, but subscriptions spread over a backlog (each
                    loading a compacted view at its own pace) read them far apart: with
                    4 MiB, 100 subscriptions loading 50,000 keys over a source and 4
                    shadows encoded an entry again for one delivery in 4-5 (the brokers'
                    CPU halved at 16 MiB: bench/compacted_fanout.py --mode receive)
"""
from __future__ import annotations

from collections import OrderedDict

from shadowtopic import wire
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.entry_cache import EntryCache, Item
from shadowtopic.ledger.view import LedgerView, ReadEntry

ENCODED_CACHE_BYTES = 16 << 20  # per `ledgers_of`


class Encodings:
    """Recent encodings of one `ledgers_of`'s entries (every user on this broker shares
    them)."""

    def __init__(self, key: TopicName, budget: EntryCache | None):
        self.key = key
        self.users = 0
        self.encoded_bytes = 0
        self._cache: OrderedDict[tuple[int, int], bytes] = OrderedDict()  # oldest first
        self._last_publish = wire.LastPublish()  # the entries of a batch share their time
        self._budget = budget
        self._charge: Item | None = None  # the budget's Item for all of them (resized)

    def __len__(self) -> int:
        return len(self._cache)

    def encode(self, entries: list[ReadEntry]) -> list[bytes]:
        """The entries as EncodedEntry bytes, encoding only those not held."""
        cache = self._cache
        enc, last = wire.encode_entry, self._last_publish
        out = []
        for e in entries:
            key = (e.ledger_id, e.entry_id)
            b = cache.get(key)
            if b is None:
                b = cache[key] = enc(e.ledger_id, e.entry_id, e.publish_ms, e.raw, 0, last)
                self.encoded_bytes += len(b)
            out.append(b)
        while self.encoded_bytes > ENCODED_CACHE_BYTES and cache:
            self.encoded_bytes -= len(cache.popitem(last=False)[1])
        if self._budget is not None:
            item = self._charge
            if item is not None and item.live:
                self._budget.resize(item, self.encoded_bytes)
            elif self.encoded_bytes:
                item = self._budget.charge(self.encoded_bytes, self.evicted)
                self._charge = item if item.live else None
        return out

    def evicted(self, _item: Item | None) -> None:
        """The entry cache evicted them (least recently used), or they are dropped."""
        self._charge = None
        self._cache.clear()
        self.encoded_bytes = 0

    def drop(self) -> None:
        """Release them and their charge (no user is left)."""
        if self._charge is not None and self._budget is not None:
            self._budget.release(self._charge)
        self.evicted(None)


class EncodingsPool:
    """The `Encodings` of every `ledgers_of` some dispatch group reads, on one broker."""

    def __init__(self) -> None:
        self._by_source: dict[TopicName, Encodings] = {}

    def __len__(self) -> int:
        return len(self._by_source)

    @property
    def encoded_bytes(self) -> int:
        """The bytes of every encoding held."""
        return sum(enc.encoded_bytes for enc in self._by_source.values())

    def acquire(self, view: LedgerView) -> Encodings:
        """The encodings `view`'s entries share (one more user)."""
        enc = self._by_source.get(view.ledgers_of)
        if enc is None:
            enc = self._by_source[view.ledgers_of] = Encodings(view.ledgers_of,
                                                               view.entry_cache)
        enc.users += 1
        return enc

    def release(self, enc: Encodings) -> None:
        """One user less; the last one drops them."""
        enc.users -= 1
        if enc.users <= 0 and self._by_source.get(enc.key) is enc:
            del self._by_source[enc.key]
            enc.drop()
