"""The ledger-view interface: what readers, cursors and dispatch need of a topic's entries.

The source's `ManagedLedger` implements it; a shadow's `ShadowLedger` (shadow/) implements it
over the source's ledgers. Entries come back as `ReadEntry` tuples whose `raw` is never
decoded on the way to a consumer.
"""
from __future__ import annotations

from typing import NamedTuple, Protocol

from source.core.message_id import MessageId


class ReadEntry(NamedTuple):
    ledger_id: int
    entry_id: int
    publish_ms: int
    raw: bytes


class LedgerView(Protocol):
    def first_position(self) -> MessageId | None:
        """Id of the oldest readable entry, or None when the topic holds none."""

    def last_confirmed(self) -> MessageId | None:
        """Id of the newest durable entry, or None when the topic holds none."""

    def next_position(self) -> MessageId:
        """Id the next appended entry may take (a reader at 'latest' starts here)."""

    async def read(self, start: MessageId, max_entries: int, max_bytes: int) -> list[ReadEntry]:
        """Entries with id >= start, in order (empty when none are available yet)."""

    async def wait_for_entries(self, position: MessageId, timeout: float) -> bool:
        """Wait until an entry with id >= `position` exists (True) or the timeout passes."""
