"""`Tails`: the in-memory entries of a `ManagedLedger`'s unsealed ledgers, by ledger id.

A ledger's entries are here from when its writer starts (or from when a seal that could not
be written keeps a recovered ledger open) until the ledger is sealed, deleted, or the topic
closes; reads of unsealed ledgers go through them (source/ledger/ledger_reader.py). Their
memory counts against the broker's `EntryCache` (source/ledger/entry_cache.py).
"""
from __future__ import annotations

from collections.abc import Iterator

from shadowtopic.ledger.entry_cache import EntryCache, TailEntries


class Tails:
    """The unsealed ledgers' `TailEntries`, by ledger id, over one `EntryCache`."""

    def __init__(self, cache: EntryCache):
        self._cache = cache
        self._by_id: dict[int, TailEntries] = {}

    def get(self, ledger_id: int) -> TailEntries | None:
        return self._by_id.get(ledger_id)

    def __getitem__(self, ledger_id: int) -> TailEntries:
        return self._by_id[ledger_id]

    def __contains__(self, ledger_id: object) -> bool:
        return ledger_id in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_id)

    def values(self) -> list[TailEntries]:
        return list(self._by_id.values())

    def add(self, ledger_id: int, wal_path: str) -> TailEntries:
        """Start (or replace) a ledger's entries, read back from the WAL at `wal_path` once
        the cache evicts them."""
        tail = self._by_id[ledger_id] = TailEntries(self._cache, wal_path)
        return tail

    def forget(self, ledger_id: int) -> None:
        """Drop a ledger's entries (it sealed or left the list)."""
        tail = self._by_id.pop(ledger_id, None)
        if tail is not None:
            tail.drop_all()

    def drop_all(self) -> None:
        """Release every ledger's entries from the cache (the topic closes: what is left is
        read from the WALs, if at all)."""
        for tail in self._by_id.values():
            tail.drop_all()
