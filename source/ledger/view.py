"""The ledger-view seam: what readers, cursors and dispatch need of a topic's entries.

The read engine (source/read/) and the durable subscriptions (source/subscriptions/) depend
only on `LedgerView`. The source's `ManagedLedger` implements it over the ledgers it writes;
a shadow's `ShadowLedger` (shadow/) implements it over the source's ledgers, reusing
`LedgerListReader` (source/ledger/ledger_reader.py) as it is; the compaction feature's
`CompactedView` (compaction/view.py) wraps a topic's view for `read_compacted` readers
(`CompactedReads`). A broker serves a topic through a `ServedView`: a view it can also fence
and close. What readers need of a view is on the seam, never found by probing attributes.
Everything crossing the seam is a domain type:
`MessageId`, `LedgerRange`, `ReadEntry` (whose `raw` is never decoded on the way to a
consumer) and `Trimmed`.

Change signals go to `ViewListener`s, one call per change for the whole topic (never one
per reader): entries became readable, ledgers were trimmed (retention, truncate), or the
view closed (this broker closed or lost the topic; a reader follows the reload).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

from shadowtopic.core.errors import ShadowTopicError
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.entry_cache import EntryCache
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

if TYPE_CHECKING:
    import pyarrow as pa


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
    # read-only members: a view may hold them as attributes or derive them (properties)
    @property
    def ledgers_of(self) -> TopicName:
        """The topic whose ledgers this view reads: the topic itself, or a shadow's source
        (whose compaction pointer a `read_compacted` reader of the shadow follows, K10)."""

    @property
    def entry_cache(self) -> EntryCache | None:
        """The broker's entry-cache budget (source/ledger/entry_cache.py) that this view's
        reads use and the read engine charges encoded entries to; None when there is none."""

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

    async def read_columns(self, start: MessageId, max_entries: int) -> pa.Table | None:
        """Entries from `start` (at most `max_entries`) as Arrow columns (source/columns.py,
        READ_SCHEMA without `partition`) when they are stored as columns (a sealed or a
        compacted ledger: read from its file, no object per entry); None when they are not
        (the open ledger): read them with `read`."""

    async def read(self, start: MessageId, max_entries: int, max_bytes: int) -> list[ReadEntry]:
        """Entries with id >= start, in order (empty when none are available yet)."""

    @property
    def closed(self) -> ShadowTopicError | None:
        """Why this view serves no more reads, or None while it is live."""

    def add_listener(self, listener: ViewListener) -> None: ...

    def remove_listener(self, listener: ViewListener) -> None: ...


class CompactedReads(LedgerView, Protocol):
    """A topic as `read_compacted` readers see it (the compaction feature's `CompactedView`):
    the compacted prefix up to the horizon, then the raw entries after it."""

    def raw_needed(self, position: MessageId) -> MessageId:
        """The first raw position a reader at `position` reads (retention keeps from there)."""

    def last_readable(self) -> MessageId | None:
        """The newest id a compacted reader can read (GetLastMessageId with read_compacted)."""


class ServedView(LedgerView, Protocol):
    """A view a broker serves a topic through (the source's `ManagedLedger`, a shadow's
    `ShadowLedger`): the reads, plus what the broker needs to run and stop it."""

    def ledgers(self) -> list[mpb.LedgerInfo]:
        """The ledgers as their list records (stats)."""

    @property
    def entries_deleted(self) -> int:
        """Entries trimmed from the front so far (stats)."""

    def fence(self, reason: ShadowTopicError) -> None:
        """This broker lost the topic: take no more writes, serve no more reads."""

    async def close(self) -> None:
        """Stop; listeners hear `on_closed` (the topic may be loaded again)."""
