"""Which ledgers retention deletes: a pure rule over a topic's ledger list.

From the oldest, sealed ledgers go while the oldest is past the time limit or the topic is
past the size limit (-1 = no limit), and only up to the ledger holding the first entry some
durable subscription has not acknowledged (`keep_from`): retention applies to acknowledged
data only, as in Pulsar. The open ledger never goes (truncate seals it first).

Shadows' needs (policy `retention_keeps_shadow_backlog`, off by default). Each shadow's
owner publishes the oldest position its durable subscriptions still need under
`keys.shadow_needs(source, shadow)` as ascii "L:E" (absent: no durable subscription). With
the policy on, the source's retention pass reads them all (one `get_prefix`) and keeps from
the earliest of its own subscriptions' and the needs of the shadows the source lists now
(`shadow_keep_from`): a need left behind by a deleted shadow holds nothing. Truncate is an
explicit request and still deletes every sealed ledger; shadow cursors skip it (C8).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable

from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

log = logging.getLogger(__name__)


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


def earliest(a: MessageId | None, b: MessageId | None) -> MessageId | None:
    """The earlier of two positions to keep from (None: nothing to keep)."""
    if a is None:
        return b
    if b is None:
        return a
    return min(MessageId(a.ledger_id, a.entry_id), MessageId(b.ledger_id, b.entry_id))


def encode_need(need: MessageId) -> bytes:
    """A shadow's need as stored: ascii "L:E"."""
    return f"{need.ledger_id}:{need.entry_id}".encode()


def parse_need(value: bytes) -> MessageId | None:
    """A stored need (None when it does not parse)."""
    try:
        m = MessageId.parse(value.decode("ascii"))
    except Exception:  # noqa: BLE001 - a damaged record
        return None
    return MessageId(m.ledger_id, m.entry_id)


def shadow_keep_from(needs: Iterable[tuple[TopicName | None, bytes]],
                     shadows: Collection[TopicName]) -> MessageId | None:
    """The earliest need of the shadows in `shadows` (the source's current shadows), from
    (shadow, stored value) pairs; needs of other shadows (deleted ones) and damaged values
    are left out. None: no current shadow needs anything."""
    keep = None
    for shadow, value in needs:
        if shadow is None or shadow not in shadows:
            continue
        need = parse_need(value)
        if need is None:
            log.warning("the need of shadow %s does not parse: %r", shadow, value[:40])
            continue
        keep = earliest(keep, need)
    return keep


def remove_ledgers(lst: mpb.LedgerList, ids: set[int]) -> None:
    """Drop the ledgers `ids` from a ledger list (retention, truncate, an empty ledger)."""
    keep = [i for i in lst.ledgers if i.ledger_id not in ids]
    del lst.ledgers[:]
    lst.ledgers.extend(keep)
