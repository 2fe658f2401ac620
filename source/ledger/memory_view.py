"""`MemoryView`: an in-memory `LedgerView` (source/ledger/view.py), the twin of the
`ManagedLedger` for unit tests of whatever reads through the seam (the read engine, the
subscription engine). tests/test_source/read/test_read_engine.py runs the same tests on it, the
ManagedLedger and a shadow's ShadowLedger.

Ledgers are lists of (publish_ms, raw) in id order; the last one is open. Driving calls
(`append`, `roll`, `trim`, `close`) notify listeners as the managed ledger does: once per
append, once per trim, once on close. `reopened()` is a new view of the same ledgers, as a
broker has after it reloads a topic.
"""
from __future__ import annotations

import time

import pyarrow as pa

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.view import LedgerRange, ReadEntry, Trimmed, ViewListener

Ledger = tuple[int, list[tuple[int, bytes]], bool]  # (ledger id, entries, sealed)


class MemoryView:
    entry_cache = None  # reads and encodings are not charged to a budget

    def __init__(self, ledgers: list[Ledger] | None = None, next_id: int = 1,
                 ledgers_of: TopicName | None = None):
        self._ledgers: list[Ledger] = ledgers if ledgers is not None else []
        #: a name of its own: ledger ids here are not unique across views, and views of
        #: one `ledgers_of` share their encoded entries (source/read/encodings.py)
        self.ledgers_of = ledgers_of or TopicName.parse(f"memory-view-{id(self._ledgers)}")
        self._next_id = next_id
        self._listeners: list[ViewListener] = []
        self._closed: errors.ShadowTopicError | None = None
        if not self._ledgers:
            self.roll()

    # ---- driving it ------------------------------------------------------------------------

    def append(self, raws: list[bytes]) -> None:
        now = int(time.time() * 1000)
        self._ledgers[-1][1].extend((now, r) for r in raws)
        for listener in list(self._listeners):
            listener.on_entries()

    def roll(self) -> None:
        """Seal the open ledger and open the next one."""
        if self._ledgers:
            lid, entries, _ = self._ledgers[-1]
            self._ledgers[-1] = (lid, entries, True)
        self._ledgers.append((self._next_id, [], False))
        self._next_id += 1

    def trim(self, n: int | None = None) -> None:
        """Delete the `n` oldest ledgers (default: every sealed one)."""
        if n is None:
            n = sum(1 for _, _, sealed in self._ledgers if sealed)
        gone, self._ledgers = self._ledgers[:n], self._ledgers[n:]
        trimmed = Trimmed(tuple(LedgerRange(lid, len(e), True) for lid, e, _ in gone))
        for listener in list(self._listeners):
            listener.on_trimmed(trimmed)

    def close(self) -> None:
        self._closed = errors.TopicNotOwned("closed")
        for listener in list(self._listeners):
            listener.on_closed(self._closed)

    def reopened(self) -> MemoryView:
        """A new view of the same entries, of this view's class."""
        return type(self)(self._ledgers, self._next_id, self.ledgers_of)

    # ---- LedgerView ------------------------------------------------------------------------

    def ranges(self) -> list[LedgerRange]:
        return [LedgerRange(lid, len(e), sealed) for lid, e, sealed in self._ledgers]

    def first_position(self) -> MessageId | None:
        return next((MessageId(lid, 0) for lid, e, _ in self._ledgers if e), None)

    def last_confirmed(self) -> MessageId | None:
        return next((MessageId(lid, len(e) - 1) for lid, e, _ in reversed(self._ledgers) if e),
                    None)

    def next_position(self) -> MessageId:
        lid, e, _ = self._ledgers[-1]
        return MessageId(lid, len(e))

    def valid_position(self, position: MessageId) -> MessageId:
        for lid, e, _ in self._ledgers:
            first = position.entry_id if lid == position.ledger_id else 0
            if lid >= position.ledger_id and first < len(e):
                return MessageId(lid, first)
        return max(MessageId(position.ledger_id, position.entry_id), self.next_position())

    def entries_between(self, start: MessageId, end: MessageId) -> int:
        return sum(1 for lid, e, _ in self._ledgers for i in range(len(e))
                   if start <= MessageId(lid, i) < end)

    async def position_at_time(self, publish_ms: int) -> MessageId:
        for lid, e, _ in self._ledgers:
            for i, (p, _raw) in enumerate(e):
                if p >= publish_ms:
                    return MessageId(lid, i)
        return self.next_position()

    async def read_columns(self, start: MessageId, max_entries: int) -> pa.Table | None:
        return None  # entries held in memory: read with `read`

    async def read(self, start: MessageId, max_entries: int, max_bytes: int) -> list[ReadEntry]:
        out: list[ReadEntry] = []
        size = 0
        for lid, e, _ in self._ledgers:
            if lid < start.ledger_id:
                continue
            for i in range(start.entry_id if lid == start.ledger_id else 0, len(e)):
                if len(out) >= max_entries or size >= max_bytes:
                    return out
                out.append(ReadEntry(lid, i, e[i][0], e[i][1]))
                size += len(e[i][1])
        return out

    @property
    def closed(self) -> errors.ShadowTopicError | None:
        return self._closed

    def add_listener(self, listener: ViewListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: ViewListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)
