"""`OwnedLedgerList`: a source topic's ledger list in etcd, as the topic's owner changes it.

- every change of the ledger list is one etcd transaction that compares the list's revision
  and this broker's ownership record, so a broker that lost the topic cannot change it
  (it is fenced and stops acknowledging).
- a change is a mutator applied to a copy of the list: on a CAS failure the list is re-read
  and the mutator runs again on the fresh copy (so it must be a pure function of the list).
- retention and truncate delete ledgers: which ones is chosen inside the list lock, from the
  list as it is then, so concurrent deletions never count a ledger twice; the list is
  written before the files are deleted (by the caller, `ManagedLedger`). The retention rule
  itself is source/ledger/retention.py.

The ledger states and timestamps the other parts of the ManagedLedger write into the list
are here too (`OPEN`, `SEALED`, `now_ms`), and `Fencing`, what each part needs of the
ManagedLedger's fence.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import retention
from shadowtopic.metadata.base import Compare, MetadataStore, MetadataUnavailable, Put
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

T = TypeVar("T")
OPEN, SEALED = mpb.LedgerState.OPEN, mpb.LedgerState.SEALED


def now_ms() -> int:
    return int(time.time() * 1000)


class Fencing(Protocol):
    """The ManagedLedger's fence, as its parts see it: why it takes no more appends (None:
    it does), and fencing it (ownership lost; the first reason stays)."""

    @property
    def fenced(self) -> errors.ShadowTopicError | None: ...

    def fence(self, err: errors.ShadowTopicError) -> None: ...


class OwnedLedgerList:
    """The ledger list of a topic this broker owns: the list as last read or written, its
    etcd revision, the CAS every change goes through, and the deletions (retention,
    truncate)."""

    def __init__(self, topic: TopicName, key: str, store: MetadataStore,
                 ownership: tuple[str, bytes], epoch: int, fencing: Fencing):
        self._topic = topic
        self._key = key
        self._store = store
        self._own_key, self._own_value = ownership
        self._epoch = epoch
        self._fencing = fencing
        self._list = mpb.LedgerList()
        self._rev = 0
        self._lock = asyncio.Lock()

    @property
    def epoch(self) -> int:
        """The ownership epoch this list is written under."""
        return self._epoch

    @property
    def current(self) -> mpb.LedgerList:
        """The list as last read or written (replaced, never changed in place, by a write;
        read it, do not change it)."""
        return self._list

    def info(self, ledger_id: int) -> mpb.LedgerInfo | None:
        """The list's entry for a ledger, or None."""
        return next((i for i in self._list.ledgers if i.ledger_id == ledger_id), None)

    async def load(self) -> None:
        """Read the list from etcd (as the topic's new owner, before any change)."""
        kv = await self._store.get(self._key)
        if kv is not None:
            self._list.ParseFromString(kv.value)
            self._rev = kv.mod_revision
        for info in self._list.ledgers:
            if info.state == mpb.LedgerState.LEDGER_STATE_UNSPECIFIED:
                info.state = OPEN  # written before LedgerState had a zero value of its own

    # ---- the CAS ---------------------------------------------------------------------------

    async def update(self, mutate: Callable[[mpb.LedgerList], T]) -> T:
        """Apply `mutate` to a copy of the ledger list and write it with one CAS; returns what
        the mutation that was written returned.

        On a CAS failure the list is re-read and `mutate` runs again on the fresh copy, so a
        mutator must be a pure function of the list it is given (no side effects outside
        it). If this broker no longer owns the topic (or the list still moves after three
        tries) the ledger is fenced and the error is raised.
        """
        async with self._lock:
            new = mpb.LedgerList()
            new.CopyFrom(self._list)
            result = mutate(new)
            new.writer_epoch = self._epoch
            for _attempt in range(3):
                try:
                    res = await self._store.txn(
                        [Compare(self._key, "mod_revision", "==", self._rev),
                         Compare(self._own_key, "value", "==", self._own_value)],
                        [Put(self._key, new.SerializeToString())])
                    if res.succeeded:
                        self._list = new
                        self._rev = res.revision
                        return result
                    # the list moved under us (e.g. a write whose reply was lost) or we
                    # lost the topic: re-read both and retry only if we still own it
                    own = await self._store.get(self._own_key)
                    if own is None or own.value != self._own_value:
                        break
                    kv = await self._store.get(self._key)
                except MetadataUnavailable as exc:
                    raise errors.MetadataUnavailable(str(exc)) from None
                self._list = mpb.LedgerList.FromString(kv.value) if kv else mpb.LedgerList()
                self._rev = kv.mod_revision if kv else 0
                new = mpb.LedgerList()
                new.CopyFrom(self._list)
                result = mutate(new)
                new.writer_epoch = self._epoch
            err = errors.Fenced(f"{self._topic}: ownership lost (epoch {self._epoch})")
            self._fencing.fence(err)
            raise err

    # ---- retention and truncation ----------------------------------------------------------

    async def remove_retained(self, time_s: int, size_bytes: int, keep_from: MessageId | None,
                              size_of: Callable[[mpb.LedgerInfo], int]
                              ) -> list[mpb.LedgerInfo]:
        """Take the sealed ledgers retention picks (source/ledger/retention.py) off the list:
        the oldest beyond the time / size limits (-1 = no limit; `size_of` says a ledger's
        size), never from the ledger of `keep_from` on. Returns them (their files stay)."""
        cutoff = now_ms() - time_s * 1000 if time_s >= 0 else None
        return await self._remove(lambda lst: retention.victims(
            lst.ledgers, size_of, cutoff, size_bytes, keep_from))

    async def remove_sealed(self) -> list[mpb.LedgerInfo]:
        """Take every sealed ledger off the list (truncate). Returns them (their files stay)."""
        return await self._remove(lambda lst: [i for i in lst.ledgers if i.state == SEALED])

    async def _remove(self, select: Callable[[mpb.LedgerList], list[mpb.LedgerInfo]]
                      ) -> list[mpb.LedgerInfo]:
        """Remove the ledgers `select` picks from the list as it is inside the list lock, so
        concurrent retention and truncate never count a ledger twice."""

        def drop(lst: mpb.LedgerList) -> list[mpb.LedgerInfo]:
            victims = [mpb.LedgerInfo.FromString(i.SerializeToString()) for i in select(lst)]
            retention.remove_ledgers(lst, {i.ledger_id for i in victims})
            lst.entries_deleted += sum(i.entries for i in victims)
            return victims

        if not select(self._list):
            return []
        return await self.update(drop)
