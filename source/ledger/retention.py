"""Which ledgers retention deletes: a pure rule over a topic's ledger list.

From the oldest, sealed ledgers go while the oldest is past the time limit or the topic is
past the size limit (-1 = no limit), and only up to the ledger holding the first entry some
durable subscription has not acknowledged (`keep_from`): retention applies to acknowledged
data only, as in Pulsar. The open ledger never goes (truncate seals it first).
"""
from __future__ import annotations

from typing import Callable, Iterable

from source.core.message_id import MessageId
from source.pb.storage.v1 import metadata_pb2 as mpb


def victims(ledgers: Iterable[mpb.LedgerInfo], size_of: Callable[[mpb.LedgerInfo], int],
            cutoff_ms: int | None, size_bytes: int, keep_from: MessageId | None
            ) -> list[mpb.LedgerInfo]:
    """The ledgers to delete, oldest first. `cutoff_ms`: a ledger whose last entry was
    published before it is past the time limit (None: no limit)."""
    ledgers = list(ledgers)
    total = sum(size_of(i) for i in ledgers)
    out = []
    for info in ledgers:
        if info.state != mpb.LedgerState.SEALED:
            break
        if keep_from is not None and info.ledger_id >= keep_from.ledger_id:
            break
        old = cutoff_ms is not None and info.last_publish_ms < cutoff_ms
        big = size_bytes >= 0 and total > size_bytes
        if not (old or big):
            break
        out.append(info)
        total -= info.size_bytes
    return out
