"""A `ManagedLedger`'s ledger list in etcd, as the topic's owner changes it.

- every change of the ledger list is one etcd transaction that compares the list's revision
  and this broker's ownership record, so a broker that lost the topic cannot change it
  (it is fenced and stops acknowledging).
- a change is a mutator applied to a copy of the list: on a CAS failure the list is re-read
  and the mutator runs again on the fresh copy (so it must be a pure function of the list).
- retention and truncate delete ledgers: which ones is chosen inside the list lock, from the
  list as it is then, so concurrent deletions never count a ledger twice; the list is
  written before the files are deleted. The retention rule itself is
  source/ledger/retention.py.

The ledger states and timestamps the other parts of the ManagedLedger write into the list
are here too (`OPEN`, `SEALED`, `now_ms`).
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.ledger import retention
from shadowtopic.ledger.view import LedgerRange, Trimmed
from shadowtopic.metadata.base import Compare, MetadataUnavailable, Put
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

T = TypeVar("T")
OPEN, SEALED = mpb.LedgerState.OPEN, mpb.LedgerState.SEALED


def now_ms() -> int:
    return int(time.time() * 1000)


class LedgerListUpdates:
    """The ManagedLedger's writes of its ledger list: the CAS every change goes through, and
    the deletions (retention, truncate).

    A part of `ManagedLedger` (source/ledger/managed.py), which sets up the state used here
    (`_list`, `_list_rev`, `_list_key`, `_list_lock`, the ownership record, `epoch`) and
    provides `fence` and `roll`.
    """

    # ---- the CAS ---------------------------------------------------------------------------

    async def _update_list(self, mutate: Callable[[mpb.LedgerList], T]) -> T:
        """Apply `mutate` to a copy of the ledger list and write it with one CAS; returns what
        the mutation that was written returned.

        On a CAS failure the list is re-read and `mutate` runs again on the fresh copy, so a
        mutator must be a pure function of the list it is given (no side effects outside
        it). If this broker no longer owns the topic (or the list still moves after three
        tries) it is fenced and the error is raised.
        """
        async with self._list_lock:
            new = mpb.LedgerList()
            new.CopyFrom(self._list)
            result = mutate(new)
            new.writer_epoch = self.epoch
            for _attempt in range(3):
                try:
                    res = await self.store.txn(
                        [Compare(self._list_key, "mod_revision", "==", self._list_rev),
                         Compare(self._own_key, "value", "==", self._own_value)],
                        [Put(self._list_key, new.SerializeToString())])
                    if res.succeeded:
                        self._list = new
                        self._list_rev = res.revision
                        return result
                    # the list moved under us (e.g. a write whose reply was lost) or we
                    # lost the topic: re-read both and retry only if we still own it
                    own = await self.store.get(self._own_key)
                    if own is None or own.value != self._own_value:
                        break
                    kv = await self.store.get(self._list_key)
                except MetadataUnavailable as exc:
                    raise errors.MetadataUnavailable(str(exc)) from None
                self._list = mpb.LedgerList.FromString(kv.value) if kv else mpb.LedgerList()
                self._list_rev = kv.mod_revision if kv else 0
                new = mpb.LedgerList()
                new.CopyFrom(self._list)
                result = mutate(new)
                new.writer_epoch = self.epoch
            err = errors.Fenced(f"{self.topic}: ownership lost (epoch {self.epoch})")
            self.fence(err)
            raise err

    # ---- retention and truncation ----------------------------------------------------------

    async def apply_retention(self, time_s: int, size_bytes: int,
                              keep_from: MessageId | None = None) -> tuple[int, int]:
        """Delete the sealed ledgers retention picks (source/ledger/retention.py): the oldest
        beyond the time / size limits (-1 = no limit), never from the ledger of `keep_from`
        (the first entry a durable subscription has not acknowledged) on.

        Returns (ledgers deleted, entries deleted).
        """
        cutoff = now_ms() - time_s * 1000 if time_s >= 0 else None
        return await self._delete_ledgers(lambda lst: retention.victims(
            lst.ledgers, self._size, cutoff, size_bytes, keep_from))

    async def truncate(self) -> tuple[int, int]:
        """Seal the current ledger and delete every sealed ledger (cursors move to the end)."""
        await self.roll()
        return await self._delete_ledgers(
            lambda lst: [i for i in lst.ledgers if i.state == SEALED])

    async def _delete_ledgers(self, select: Callable[[mpb.LedgerList], list]) -> tuple[int, int]:
        """Delete the ledgers `select` picks from the list as it is inside the list lock, so
        concurrent retention and truncate never count a ledger twice.

        The list is written first, then the files go and listeners hear of the trim.
        """

        def drop(lst: mpb.LedgerList) -> list[mpb.LedgerInfo]:
            victims = [mpb.LedgerInfo.FromString(i.SerializeToString()) for i in select(lst)]
            retention.remove_ledgers(lst, {i.ledger_id for i in victims})
            lst.entries_deleted += sum(i.entries for i in victims)
            return victims

        if not select(self._list):
            return 0, 0
        victims = await self._update_list(drop)
        for info in victims:
            self.reader.forget(info.ledger_id)
            self.storage.delete(info.path)
        if victims:
            trimmed = Trimmed(tuple(LedgerRange(i.ledger_id, i.entries, True, i.size_bytes)
                                    for i in victims))
            for listener in list(self._listeners):
                listener.on_trimmed(trimmed)
        return len(victims), sum(i.entries for i in victims)

    def _size(self, info: mpb.LedgerInfo) -> int:
        """A ledger's size: live for an unsealed ledger, else as the list records it."""
        mem = self._mem.get(info.ledger_id)
        return mem.size if mem is not None else info.size_bytes
