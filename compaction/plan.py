"""The plan of one compaction: which files it reads, up to which id.

A request's horizon is the last entry of the newest ledger its broker sealed for it (the
open ledger is sealed first, so the job covers everything produced before the request).
Incremental (K12, docs/BEHAVIOURS.md): the input is the previous compacted ledger (the current
pointer's manifest) plus the ledgers sealed after its horizon, up to the new horizon; a full
plan (`full=True`) reads every sealed ledger up to the horizon instead. Ledgers that
retention deleted are simply not in the list: what they held survives in the previous
compacted ledger (K15). A ledger up to the horizon that is in the list but not SEALED (its
broker was still sealing it) fails the plan (`NotAllowed`) rather than being skipped.

Deletes (K18): a key whose latest message is a tombstone (an empty payload) keeps that
tombstone in the compacted ledger while it is recent, as Kafka's delete.retention.ms does, so
a reader or durable subscription that was between the previous horizon and the delete when
this job ran still reads the delete. The job's `tombstone_cutoff_ms` is fixed when the job
is requested (`tombstone_cutoff`: the request time minus the topic's
`delete_retention_seconds`, both in the `CompactionRequest`): a tombstone published at or
after it is kept, an older one dropped with its key; `None` (delete_retention 0) keeps
none. Because the rule looks only at the key's latest message and a fixed cutoff, an
incremental job equals a full one at the same cutoff whenever cutoffs do not go back
(a later job's cutoff is not below an earlier one's: a tombstone an earlier job dropped
is not there to keep). Keyless messages follow `retain_null_key` as before.
"""
from __future__ import annotations

from dataclasses import dataclass

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb


@dataclass(frozen=True)
class Plan:
    topic: TopicName
    job_id: str
    horizon: MessageId | None                 # None: nothing to compact
    ledgers: tuple[mpb.LedgerInfo, ...]       # SEALED ledgers to read, in id order
    previous: mpb.CompactedManifest | None    # the compacted ledger this one builds on
    retain_null_key: bool
    tombstone_cutoff_ms: int | None = None    # tombstones published at or after it are kept

    def input_files(self) -> list[str]:
        """Storage-relative paths: the previous compacted ledger's files, then the ledgers'."""
        prev = [f.path for f in self.previous.files] if self.previous is not None else []
        return prev + [info.path for info in self.ledgers]

    def input_sizes(self) -> list[int]:
        """The bytes of each of `input_files`."""
        prev = [f.size_bytes for f in self.previous.files] if self.previous is not None else []
        return prev + [info.size_bytes for info in self.ledgers]

    @property
    def input_entries(self) -> int:
        prev = self.previous.entries if self.previous is not None else 0
        return prev + sum(info.entries for info in self.ledgers)

    @property
    def input_bytes(self) -> int:
        prev = self.previous.output_bytes if self.previous is not None else 0
        return prev + sum(info.size_bytes for info in self.ledgers)


def tombstone_cutoff(requested_ms: int, delete_retention_seconds: int) -> int | None:
    """The publish time from which a job requested at `requested_ms` keeps tombstones
    (None: it keeps none, delete_retention 0); never below 1, so 0 can mean none in a
    manifest or job record."""
    if delete_retention_seconds <= 0:
        return None
    return max(1, requested_ms - delete_retention_seconds * 1000)


def keeps_tombstone(publish_ms: int, cutoff_ms: int | None) -> bool:
    """Whether a key's latest message, a tombstone published at `publish_ms`, is kept."""
    return cutoff_ms is not None and publish_ms >= cutoff_ms


def make_plan(topic: TopicName, job_id: str, ledger_list: mpb.LedgerList,
              horizon: MessageId | None, pointer: mpb.CompactionPointer | None,
              retain_null_key: bool, full: bool = False,
              tombstone_cutoff_ms: int | None = None) -> Plan:
    previous = pointer.manifest if pointer is not None and not full else None
    after = previous.horizon.ledger_id if previous is not None else 0
    ledgers: tuple[mpb.LedgerInfo, ...] = ()
    if horizon is not None:
        # a ledger up to the horizon that is not sealed yet would be skipped below, its
        # messages missing from the compacted view for good: the job fails instead (brokers
        # file a horizon only once every ledger up to it is sealed, compaction/admin.py)
        unsealed = [info.ledger_id for info in ledger_list.ledgers
                    if info.state != mpb.LedgerState.SEALED
                    and after < info.ledger_id <= horizon.ledger_id]
        if unsealed:
            raise errors.NotAllowed(
                f"{topic}: ledger {unsealed[0]} is not sealed yet, and it is at or before the "
                f"horizon {horizon}: the job would leave its messages out; compact again")
        ledgers = tuple(sorted(
            (info for info in ledger_list.ledgers
             if info.state == mpb.LedgerState.SEALED and info.entries
             and after < info.ledger_id <= horizon.ledger_id),
            key=lambda info: info.ledger_id))
    return Plan(topic, job_id, horizon, ledgers, previous, retain_null_key, tombstone_cutoff_ms)
