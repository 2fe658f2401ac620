"""The ledger-view seam: what readers, cursors and dispatch need of a topic's entries.

The read engine (source/read/) and, later, subscriptions depend only on `LedgerView`. The
source's `ManagedLedger` implements it over the ledgers it writes; a shadow's `ShadowLedger`
(shadow/) implements it over the source's ledgers, reusing `LedgerListReader`
(source/ledger/ledger_reader.py) as it is. Everything crossing the seam is a domain type:
`MessageId`, `LedgerRange`, `ReadEntry` (whose `raw` is never decoded on the way to a
consumer) and `Trimmed`.

Change signals go to `ViewListener`s, one call per change for the whole topic (never one
per reader): entries became readable, ledgers were trimmed (retention, truncate), or the
view closed (this broker closed or lost the topic; a reader follows the reload).
"""
from __future__ import annotations

from typing import NamedTuple, Protocol

from source.core.errors import ShadowTopicError
from source.core.message_id import MessageId


class ReadEntry(NamedTuple):
    ledger_id: int
    entry_id: int
    publish_ms: int
    raw: bytes


class LedgerRange(NamedTuple):
    """One ledger as a reader sees it: entries `0 .. entries-1` are readable."""
    ledger_id: int
    entries: int
    sealed: bool
    size_bytes: int = 0


class Trimmed(NamedTuple):
    """Ledgers deleted from the front of a topic (retention, truncate, source trimming)."""
    ledgers: tuple[LedgerRange, ...]

    @property
    def entries(self) -> int:
        return sum(r.entries for r in self.ledgers)


class ViewListener(Protocol):
    def on_entries(self) -> None:
        """New entries are readable (called once per group commit, not per entry)."""

    def on_trimmed(self, trimmed: Trimmed) -> None:
        """Ledgers were deleted; positions inside them are gone."""

    def on_closed(self, reason: ShadowTopicError) -> None:
        """The view takes no more reads (closed or fenced); the topic may be reloaded."""


class LedgerView(Protocol):
    def ranges(self) -> list[LedgerRange]:
        """The readable ledgers in id order (the open one last, with its live count)."""

    def first_position(self) -> MessageId | None:
        """Id of the oldest readable entry, or None when the topic holds none."""

    def last_confirmed(self) -> MessageId | None:
        """Id of the newest durable entry, or None when the topic holds none."""

    def next_position(self) -> MessageId:
        """Id the next appended entry will take (a reader at 'latest' starts here)."""

    def valid_position(self, position: MessageId) -> MessageId:
        """The first position at or after `position` that holds an entry or will hold the
        next one (skips ends of ledgers and deleted ledgers)."""

    def entries_between(self, start: MessageId, end: MessageId) -> int:
        """How many readable entries have ids in [start, end)."""

    async def position_at_time(self, publish_ms: int) -> MessageId:
        """The first entry published at or after `publish_ms` (next_position() if none)."""

    async def read(self, start: MessageId, max_entries: int, max_bytes: int) -> list[ReadEntry]:
        """Entries with id >= start, in order (empty when none are available yet)."""

    @property
    def closed(self) -> ShadowTopicError | None:
        """Why this view serves no more reads, or None while it is live."""

    def add_listener(self, listener: ViewListener) -> None: ...

    def remove_listener(self, listener: ViewListener) -> None: ...
