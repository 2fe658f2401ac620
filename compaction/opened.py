"""`OpenedLedgers`: the compacted ledgers open on one broker, one per manifest.

Every view that reads a source's compacted ledger on a broker (the source's own, where it is
served there, and each of its shadows': a shadow reads its source's, K10) follows the same
compaction pointer and so asks for the same manifest. Opening it once for all of them means
its files are checked and their ids loaded once, and the row groups it has read are cached
once (compaction/ledger.py keeps them as entries): one shadow's subscriptions read what
another's just read, and the broker's encodings (source/read/encodings.py, by `ledgers_of`)
then encode each entry once for all of them, as for live entries.

A ledger is kept while a view holds it (a weak map, by the manifest's bytes: the same job
id written again would be another manifest) and dropped with the last one; an open under way
is shared by every view that asks meanwhile, and a failed one is not kept (the next ask opens
again). A view made without an `OpenedLedgers` opens its own (`Unshared`).
"""
from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Protocol

from shadowtopic.compaction.ledger import CompactedLedger
from shadowtopic.ledger.storage import Storage
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

#: opens one manifest's ledger (blocking: run in the executor); compaction/view.py's
#: `open_ledger` with its failpoint
Open = Callable[[Storage, mpb.CompactedManifest], CompactedLedger]


class LedgerOpener(Protocol):
    async def open(self, manifest: mpb.CompactedManifest) -> CompactedLedger: ...


class Unshared:
    """Each call opens the ledger anew (a view of its own, as tests make them)."""

    def __init__(self, storage: Storage, executor: Executor | None, opener: Open):
        self.storage, self.executor, self.opener = storage, executor, opener

    async def open(self, manifest: mpb.CompactedManifest) -> CompactedLedger:
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, self.opener, self.storage, manifest)


class OpenedLedgers:
    """One broker's open compacted ledgers (see the module doc)."""

    def __init__(self, storage: Storage, executor: Executor | None, opener: Open):
        self.storage, self.executor, self.opener = storage, executor, opener
        self._open: weakref.WeakValueDictionary[bytes, CompactedLedger] = \
            weakref.WeakValueDictionary()
        self._opening: dict[bytes, asyncio.Future[CompactedLedger]] = {}
        self.opens = 0  # ledgers opened (a shared one counts once)

    def __len__(self) -> int:
        return len(self._open)

    async def open(self, manifest: mpb.CompactedManifest) -> CompactedLedger:
        key = manifest.SerializeToString(deterministic=True)
        ledger = self._open.get(key)
        if ledger is not None:
            return ledger
        opening = self._opening.get(key)
        if opening is None:
            self.opens += 1
            opening = asyncio.get_running_loop().run_in_executor(
                self.executor, self.opener, self.storage, manifest)
            self._opening[key] = opening
            opening.add_done_callback(lambda f: self._opened(key, f))
        # shielded: one asker cancelled (its topic closing) does not fail the others
        return await asyncio.shield(opening)

    def _opened(self, key: bytes, done: asyncio.Future[CompactedLedger]) -> None:
        if self._opening.get(key) is done:
            del self._opening[key]
        if not done.cancelled() and done.exception() is None:
            self._open[key] = done.result()
