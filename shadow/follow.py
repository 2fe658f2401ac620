"""Following one metadata key the way docs/ARCHITECTURE.md says watchers do: list, then watch from
the listed revision; re-list when that revision was compacted away or the store went away.

`KeyFollower` hands every new value of one key (or its deletion) to a synchronous callback,
**version-monotonically**: a value is applied only when its mod revision is higher than the
one already held, so a re-list, a `refresh` and the watch may all deliver the same update in
any order and it is applied once, and an older value never replaces a newer one.

Nothing is lost while it starts: `start` lists the key (errors reach the caller), applies
it, and only then starts the watch task, which watches from the listed revision + 1, so an
update written after the list and before the watch exists is replayed by the watch (or, if
the store compacted that revision meanwhile, found by the re-list the watch's
`RevisionCompacted` leads to).

The `ShadowLedger` follows the source's ledger list with it. (A shadow's compacted view
follows the source's compaction pointer, `keys.compaction(source)`, with source's own
`CompactionFollower` in source/ledger/compacted_view.py.)
It only reads: no method of the store that writes is ever called.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from source.metadata.base import (MetadataStore, MetadataUnavailable, RevisionCompacted,
                                  Snapshot, WatchEvent)

log = logging.getLogger(__name__)

#: apply(value, revision): the key's new value (None: deleted) as of `revision`
Apply = Callable[[bytes | None, int], None]


class KeyFollower:
    def __init__(self, store: MetadataStore, key: str, apply: Apply,
                 retry_delay: float = 0.5):
        self.store = store
        self.key = key
        self._apply = apply
        self.retry_delay = retry_delay
        #: mod revision of the value held (of the deletion when it was deleted); 0: none yet
        self.revision = 0
        self._present = False
        self.relists = 0  # re-lists after the start (compacted revision, store unavailable)
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """List the key and apply it, then follow it in a task. Raises
        `MetadataUnavailable` when the first list fails (nothing is started then)."""
        snap = await self.store.get_prefix(self.key)
        self._take_snapshot(snap)
        self._task = asyncio.get_running_loop().create_task(
            self._follow(snap.revision), name=f"follow {self.key}")

    async def refresh(self) -> bool:
        """Read the key now (a reader found the state it holds outdated: a WAL that was
        sealed and removed, a file retention deleted). True when that changed it."""
        try:
            snap = await self.store.get_prefix(self.key)
        except MetadataUnavailable as exc:
            log.info("%s: refresh failed: %s", self.key, exc)
            return False
        return self._take_snapshot(snap)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # ---- applying ------------------------------------------------------------------------

    def _offer(self, value: bytes | None, revision: int) -> bool:
        if revision <= self.revision:
            return False  # already held, or older than what is held
        if value is None and not self._present:
            self.revision = revision
            return False  # deleted, and we never held it: nothing changes
        self._apply(value, revision)  # raises: not held, the next list offers it again
        self.revision = revision
        self._present = value is not None
        return True

    def _take_snapshot(self, snap: Snapshot) -> bool:
        kv = next((kv for kv in snap.items if kv.key == self.key), None)
        if kv is not None:
            return self._offer(kv.value, kv.mod_revision)
        # absent at snap.revision: deleted at or before it (any later put is newer)
        return self._offer(None, snap.revision)

    def _take_events(self, events: list[WatchEvent]) -> None:
        mine = [e for e in events if e.key == self.key]  # the prefix may match longer keys
        if mine:  # each value is the key's whole state: the last one of a batch is enough
            last = mine[-1]
            self._offer(last.value if last.type == "put" else None, last.mod_revision)

    # ---- following -----------------------------------------------------------------------

    async def _follow(self, listed: int | None) -> None:
        revision = listed
        while True:
            try:
                if revision is None:
                    snap = await self.store.get_prefix(self.key)
                    self._take_snapshot(snap)
                    revision = snap.revision
                watch = self.store.watch_prefix(self.key, revision + 1)
                try:
                    async for events in watch:
                        self._take_events(events)
                finally:  # close the watch now, not at garbage collection
                    aclose = getattr(watch, "aclose", None)
                    if aclose is not None:
                        await aclose()
                raise MetadataUnavailable("watch ended")
            except RevisionCompacted as exc:
                log.info("%s: %s; listing again", self.key, exc)
                self.relists += 1
                revision = None
            except MetadataUnavailable as exc:
                log.info("%s: %s; listing again in %.1fs", self.key, exc, self.retry_delay)
                self.relists += 1
                revision = None
                await asyncio.sleep(self.retry_delay)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a bad value must not end the following
                log.exception("%s: following failed; listing again", self.key)
                self.relists += 1
                revision = None
                await asyncio.sleep(self.retry_delay)
