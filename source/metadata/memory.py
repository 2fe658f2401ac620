"""`MemoryStore`: an in-memory twin of `EtcdStore` with the same semantics (for unit tests).

Mirrors etcd where callers can see it: an empty store is at revision 1 (the first write is
revision 2), writes that change nothing do not bump the revision, a txn may not put the same
key twice (or put a key it also deletes), puts with an unknown lease raise `LeaseNotFound`,
a value compare on a missing key fails unless the operand is None, and after `compact(rev)`
a watch may start at `rev` but not before (delete events at exactly `rev` are gone, as in
etcd). Leases expire lazily on every call and from a loop timer; while the store is
"unavailable" (`set_available(False)`) every call raises `MetadataUnavailable`, open watches
break, and leases do not expire (etcd restarts extend them): they get a full TTL again when
the store comes back.
"""
from __future__ import annotations

import asyncio
import bisect
import itertools
import operator
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace

from .base import (
    Compare,
    Delete,
    KeyValue,
    LeaseNotFound,
    MetadataError,
    MetadataStore,
    MetadataUnavailable,
    Put,
    RevisionCompacted,
    Snapshot,
    TxnResult,
    WatchEvent,
)

_OPS: dict[str, Callable[[int | bytes, int | bytes], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt}
#: what a watch's queue holds: events, the error that ends the watch, or None (store closed)
_WatchItem = list[WatchEvent] | BaseException | None


@dataclass
class _Lease:
    ttl: int
    deadline: float
    keys: set[str] = field(default_factory=set)


class MemoryStore(MetadataStore):
    def __init__(self) -> None:
        self._rev = 1
        self._kvs: dict[str, KeyValue] = {}
        self._history_revs: list[int] = []  # parallel to _history, for bisect
        self._history: list[list[WatchEvent]] = []  # one entry per write revision
        self._compact_rev = 0
        self._leases: dict[int, _Lease] = {}
        self._lease_ids = itertools.count(0x694d0000_00000001)
        # (prefix, start revision, queue) of each watch
        self._watchers: set[tuple[str, int, asyncio.Queue[_WatchItem]]] = set()
        self._available = True
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    # ---- test controls ------------------------------------------------------------------

    def set_available(self, available: bool) -> None:
        """Simulate the store going down (every call raises MetadataUnavailable) and back."""
        if available and not self._available:
            now = time.monotonic()
            for lease in self._leases.values():
                lease.deadline = now + lease.ttl
        self._available = available
        if not available:
            for _, _, q in list(self._watchers):
                q.put_nowait(MetadataUnavailable("memory store unavailable"))
        self._arm_timer()

    @property
    def revision(self) -> int:
        return self._rev

    # ---- internals ----------------------------------------------------------------------

    async def _enter(self) -> None:
        await asyncio.sleep(0)  # let other tasks interleave, as with a real network call
        self._check()

    def _check(self) -> None:
        if self._closed:
            raise MetadataUnavailable("store closed")
        if not self._available:
            raise MetadataUnavailable("memory store unavailable")
        self._expire_leases()
        if self._leases and (self._timer is None or self._timer_loop is not _running_loop()):
            self._arm_timer()

    def _expire_leases(self) -> None:
        if not self._available or self._closed:
            return
        now = time.monotonic()
        for lease_id in [i for i, lease in self._leases.items() if lease.deadline <= now]:
            self._drop_lease(lease_id)

    def _drop_lease(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id)
        self._commit([Delete(k) for k in sorted(lease.keys)])

    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_loop = None
        loop = _running_loop()
        if loop is None or not self._leases or not self._available or self._closed:
            return
        delay = min(lease.deadline for lease in self._leases.values()) - time.monotonic()
        self._timer = loop.call_later(max(delay, 0) + 0.001, self._on_timer)
        self._timer_loop = loop

    def _on_timer(self) -> None:
        self._timer = None
        self._expire_leases()
        self._arm_timer()

    def _commit(self, ops: Sequence[Put | Delete]) -> int:
        """Apply write ops as one revision (if anything changes); notify watchers."""
        rev = self._rev + 1
        events: list[WatchEvent] = []
        for op in ops:
            if isinstance(op, Put):
                old = self._kvs.get(op.key)
                if old is not None and old.lease in self._leases:
                    self._leases[old.lease].keys.discard(op.key)
                self._kvs[op.key] = KeyValue(op.key, op.value, old.create_revision if old else rev,
                                             rev, old.version + 1 if old else 1, op.lease)
                if op.lease:
                    self._leases[op.lease].keys.add(op.key)
                events.append(WatchEvent("put", op.key, op.value, rev))
            else:
                for key in self._matching(op):
                    old = self._kvs.pop(key)
                    if old.lease in self._leases:
                        self._leases[old.lease].keys.discard(key)
                    events.append(WatchEvent("delete", key, b"", rev))
        if not events:
            return 0
        self._rev = rev
        self._history_revs.append(rev)
        self._history.append(events)
        for prefix, start, q in list(self._watchers):
            batch = [e for e in events if e.key.startswith(prefix)]
            if batch and rev >= start:
                q.put_nowait(batch)
        return len(events)

    def _matching(self, op: Delete) -> list[str]:
        if op.prefix:
            return sorted(k for k in self._kvs if k.startswith(op.key))
        return [op.key] if op.key in self._kvs else []

    def _compare(self, c: Compare) -> bool:
        kv = self._kvs.get(c.key)
        if c.op not in _OPS:
            raise ValueError(f"bad compare {c}")
        if c.target == "value":
            if c.operand is None:
                if c.op not in ("==", "!="):
                    raise ValueError(f"value compare with None supports only == and !=: {c}")
                return (kv is None) == (c.op == "==")
            if not isinstance(c.operand, bytes):
                raise ValueError(f"value compare needs bytes or None: {c}")
            return kv is not None and _OPS[c.op](kv.value, c.operand)  # etcd: missing key fails
        if c.target not in ("version", "create_revision", "mod_revision"):
            raise ValueError(f"bad compare {c}")
        if not isinstance(c.operand, int) or isinstance(c.operand, bool):
            raise ValueError(f"{c.target} compare needs an int: {c}")
        actual = getattr(kv, c.target) if kv else 0
        return _OPS[c.op](actual, c.operand)

    def _validate_ops(self, ops: Sequence[Put | Delete]) -> None:
        puts: set[str] = set()
        for op in ops:
            if isinstance(op, Put):
                if op.key in puts:
                    raise ValueError("duplicate key given in txn request")
                puts.add(op.key)
                if op.lease and op.lease not in self._leases:
                    raise LeaseNotFound(f"lease {op.lease:x} not found")
            elif not isinstance(op, Delete):
                raise TypeError(f"not a txn op: {op!r}")
        for op in ops:
            if isinstance(op, Delete) and any(
                    (k.startswith(op.key) if op.prefix else k == op.key) for k in puts):
                raise ValueError("duplicate key given in txn request")

    # ---- KV -----------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        await self._enter()
        return self._kvs.get(key)

    async def get_prefix(self, prefix: str) -> Snapshot:
        await self._enter()
        items = [self._kvs[k] for k in sorted(k for k in self._kvs if k.startswith(prefix))]
        return Snapshot(items, self._rev)

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        await self._enter()
        ops = [Put(key, bytes(value), lease)]
        self._validate_ops(ops)
        self._commit(ops)
        return self._rev

    async def delete(self, key: str, prefix: bool = False) -> int:
        await self._enter()
        return self._commit([Delete(key, prefix)])

    async def txn(self, compares: Sequence[Compare], success: Sequence[Put | Delete],
                  failure: Sequence[Put | Delete] = ()) -> TxnResult:
        await self._enter()
        ok = all([self._compare(c) for c in compares])  # evaluate all: validates every compare
        ops = [replace(op, value=bytes(op.value)) if isinstance(op, Put) else op
               for op in (success if ok else failure)]
        self._validate_ops(ops)
        self._commit(ops)
        return TxnResult(ok, self._rev)

    # ---- leases -------------------------------------------------------------------------

    async def grant_lease(self, ttl: int) -> int:
        await self._enter()
        if ttl < 1:
            raise ValueError("lease ttl must be >= 1 s")
        lease_id = next(self._lease_ids)
        self._leases[lease_id] = _Lease(ttl, time.monotonic() + ttl)
        self._arm_timer()
        return lease_id

    async def refresh_lease(self, lease: int) -> None:
        await self._enter()
        entry = self._leases.get(lease)
        if entry is None:
            raise LeaseNotFound(f"lease {lease:x} not found")
        entry.deadline = time.monotonic() + entry.ttl
        self._arm_timer()

    async def revoke_lease(self, lease: int) -> None:
        await self._enter()
        if lease not in self._leases:
            raise LeaseNotFound(f"lease {lease:x} not found")
        self._drop_lease(lease)
        self._arm_timer()

    # ---- history ------------------------------------------------------------------------

    async def compact(self, revision: int) -> None:
        await self._enter()
        if revision > self._rev:
            raise MetadataError(f"compact: revision {revision} is a future revision")
        if revision <= self._compact_rev:
            return
        self._compact_rev = revision
        cut = bisect.bisect_left(self._history_revs, revision)
        del self._history_revs[:cut], self._history[:cut]
        if self._history_revs and self._history_revs[0] == revision:
            self._history[0] = [e for e in self._history[0] if e.type == "put"]

    async def watch_prefix(self, prefix: str,
                           start_revision: int) -> AsyncIterator[list[WatchEvent]]:
        await self._enter()
        if 0 < start_revision < self._compact_rev:
            raise RevisionCompacted(compact_revision=self._compact_rev)
        start = start_revision if start_revision > 0 else self._rev + 1
        q: asyncio.Queue[_WatchItem] = asyncio.Queue()
        backlog = [e for events in self._history[bisect.bisect_left(self._history_revs, start):]
                   for e in events if e.key.startswith(prefix)]
        if backlog:
            q.put_nowait(backlog)
        entry = (prefix, start, q)
        self._watchers.add(entry)
        try:
            while True:
                item = await q.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._watchers.discard(entry)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for _, _, q in list(self._watchers):
            q.put_nowait(None)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
