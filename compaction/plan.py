"""The plan of one compaction: which files it reads, up to which id.

A request's horizon is the last entry of the newest ledger its broker sealed for it (the
open ledger is sealed first, so the job covers everything produced before the request).
Incremental (K12, docs/BEHAVIOURS.md): the input is the previous compacted ledger (the current
pointer's manifest) plus the ledgers sealed after its horizon, up to the new horizon; a full
plan (`full=True`) reads every sealed ledger up to the horizon instead. Ledgers that
retention deleted are simply not in the list: what they held survives in the previous
compacted ledger (K15).
"""
from __future__ import annotations

from dataclasses import dataclass

from source.core.message_id import MessageId
from source.core.names import TopicName
from source.pb.storage.v1 import metadata_pb2 as mpb


@dataclass(frozen=True)
class Plan:
    topic: TopicName
    job_id: str
    horizon: MessageId | None                 # None: nothing to compact
    ledgers: tuple[mpb.LedgerInfo, ...]       # SEALED ledgers to read, in id order
    previous: mpb.CompactedManifest | None    # the compacted ledger this one builds on
    retain_null_key: bool

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


def make_plan(topic: TopicName, job_id: str, ledger_list: mpb.LedgerList,
              horizon: MessageId | None, pointer: mpb.CompactionPointer | None,
              retain_null_key: bool, full: bool = False) -> Plan:
    previous = pointer.manifest if pointer is not None and not full else None
    after = previous.horizon.ledger_id if previous is not None else 0
    ledgers: tuple[mpb.LedgerInfo, ...] = ()
    if horizon is not None:
        ledgers = tuple(sorted(
            (info for info in ledger_list.ledgers
             if info.state == mpb.LedgerState.SEALED and info.entries
             and after < info.ledger_id <= horizon.ledger_id),
            key=lambda info: info.ledger_id))
    return Plan(topic, job_id, horizon, ledgers, previous, retain_null_key)
