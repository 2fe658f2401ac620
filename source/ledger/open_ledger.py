"""A topic's open ledger as its writer (source/ledger/writer.py) sees it: `OpenLedger` (its
WAL, confirmed entries and queue), `LedgerConfig` (when it rolls), the appends queued and
taken (`Pending`, `Taken`), and a group commit's steps that need no writer: taking a group
(each sequenced batch checked against the dedup map, entry ids assigned, WAL frames built:
`take_group`) and failing appends (`fail_pending`, `fail_group`). Its `ahead` writes its
Parquet file as it fills (source/ledger/seal_ahead.py). `InFlight` is a group the
pipelined writer (the WAL on object storage) is committing.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from shadowtopic.core import errors
from shadowtopic.ledger import wal as walmod
from shadowtopic.ledger.dedup import DEFAULT_IDLE_S, DedupMap, Duplicate
from shadowtopic.ledger.entry_cache import TailEntries
from shadowtopic.ledger.ledger_list import now_ms
from shadowtopic.ledger.seal_ahead import SealAhead

#: what an append resolves with: (ledger id, first entry id, duplicate)
AppendResult = tuple[int, int, bool]
#: an append queued on a ledger: (raws, request, size, future, (producer, first sequence id)
#: or None)
Pending = tuple[list[bytes], bytes, int, asyncio.Future[AppendResult], tuple[str, int] | None]
#: an append its writer took: (raws, frame, size, future, first entry id); a duplicate's or
#: a refused batch's frame is None, and its last field the original's ids or None
Taken = tuple[list[bytes], bytes | None, int, asyncio.Future[AppendResult],
              int | Duplicate | None]


@dataclass
class InFlight:
    """A group of the pipelined writer whose commit is under way (`task`; None: a group
    of duplicates only, nothing to commit), its frames at `at` in the local copy, and how
    many producer batches it staged in the dedup map."""

    task: asyncio.Future[None] | None
    group: list[Taken]
    publish_ms: int
    at: int
    staged: int


@dataclass
class LedgerConfig:
    """When the open ledger rolls over: once `max_entries` entries or `max_bytes` bytes have
    been queued on it, or once it has an entry queued and is `max_age_s` seconds old."""

    max_entries: int = 200_000
    max_bytes: int = 64 << 20
    max_age_s: float = 4 * 3600
    #: with the WAL on object storage, the flush windows (etcd commit records) a ledger takes
    #: before it rolls: its commits stay in etcd until it seals (source/ledger/object_wal.py)
    max_commits: int = 10_000
    #: idempotent producing: a producer idle this long is forgotten (source/ledger/dedup.py)
    dedup_idle_s: float = DEFAULT_IDLE_S


class OpenLedger:
    """A ledger taking appends: its WAL, its confirmed entries and its queue.

    `pending` holds the appends its writer has not taken yet; `queued_entries` and
    `queued_bytes` count every batch queued on it that did not fail, written or not (they
    decide when it is full). `after` is the previous ledger's writer, which this one's waits
    for before its first write; `closing` tells the writer to end once nothing is pending.
    """

    def __init__(self, ledger_id: int, wal: walmod.WalFile, wal_rel: str, entries: TailEntries):
        self.ledger_id = ledger_id
        self.wal = wal
        self.wal_rel = wal_rel
        self.entries = entries
        self.queued_entries = 0
        self.queued_bytes = 0
        self.created = time.monotonic()
        self.pending: list[Pending] = []
        self.wake = asyncio.Event()
        self.after: asyncio.Task[None] | None = None  # the previous ledger's writer
        self.closing = False
        self.writer: asyncio.Task[None] | None = None
        self.commits = 0  # groups committed to WAL objects (0 with the local WAL)
        self.ahead: SealAhead | None = None  # its Parquet file as it fills (or not)

    def full(self, cfg: LedgerConfig) -> bool:
        return (self.queued_entries >= cfg.max_entries or self.queued_bytes >= cfg.max_bytes
                or self.commits >= cfg.max_commits
                or (self.queued_entries > 0 and time.monotonic() - self.created >= cfg.max_age_s))



def fail_pending(led: OpenLedger, pending: list[Pending], err: BaseException) -> None:
    """Appends queued on a ledger that takes no more fail with `err`."""
    for raws, _request, size, fut, _seq in pending:
        led.queued_entries -= len(raws)
        led.queued_bytes -= size
        if not fut.done():
            fut.set_exception(err)

def fail_group(led: OpenLedger, group: list[Taken], err: BaseException) -> None:
    """Nothing of a group is acknowledged: its appends fail with `err`."""
    for raws, frame, size, fut, _first in group:
        if frame is not None:
            led.queued_entries -= len(raws)
            led.queued_bytes -= size
        if not fut.done():
            fut.set_exception(err)

def take_group(led: OpenLedger, pending: list[Pending], dedup: DedupMap,
               next_id: int | None = None) -> tuple[int, list[Taken]]:
    """Check the group's sequenced batches against the dedup map, assign entry ids and
    build the frames: each append becomes (raws, frame, size, future, first entry id);
    a duplicate's frame is None and its last field its original's ids; a refused
    batch's future fails and its frame is None too. Returns the group's publish time
    and the taken appends, in order."""
    encode = walmod.encode_batch
    publish_ms = now_ms()
    if next_id is None:
        next_id = len(led.entries)
    group: list[Taken] = []
    for raws, request, size, fut, seq in pending:
        if seq is not None:
            try:
                dup = dedup.check(seq[0], seq[1], len(raws))
            except errors.ShadowTopicError as exc:
                led.queued_entries -= len(raws)
                led.queued_bytes -= size
                if not fut.done():
                    fut.set_exception(exc)
                group.append((raws, None, size, fut, None))
                continue
            if dup is not None:
                led.queued_entries -= len(raws)
                led.queued_bytes -= size
                group.append((raws, None, size, fut, dup))
                continue
            dedup.stage(seq[0], seq[1], len(raws), led.ledger_id, next_id, publish_ms)
        group.append((raws, encode(next_id, publish_ms, request, len(raws)), size, fut,
                      next_id))
        next_id += len(raws)
    return publish_ms, group
