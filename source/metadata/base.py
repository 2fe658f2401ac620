"""The metadata store interface (docs/ARCHITECTURE.md, "Metadata in etcd"): an async
key-value store with etcd semantics.

Two implementations share one contract test suite: `EtcdStore` (a real etcd through the
`etcd3` module, called from asyncio through a thread pool) and `MemoryStore` (an in-memory
twin for unit tests). Semantics both must show:

- Every successful write bumps one global `revision` (as in etcd an empty store is at
  revision 1, so the first write is revision 2; a write that changes nothing bumps nothing).
  `KeyValue.create_revision` / `mod_revision` / `version` behave as in etcd (version 1 on
  create, +1 per put, reset by delete).
- `txn` evaluates all `Compare`s atomically; runs `success` ops when all hold, else `failure`.
  A compare on a missing key sees version 0, create/mod revision 0 and value None.
- Leases: `grant_lease(ttl)` -> lease id; keys put with that lease are deleted (with watch
  events) when the lease expires or is revoked; `refresh_lease` keeps it alive; refreshing
  an expired or revoked lease raises `LeaseNotFound`.
- `watch_prefix(prefix, start_revision)` yields batches of `WatchEvent` in revision order,
  starting at `start_revision` (inclusive). If `start_revision` has been compacted away it
  raises `RevisionCompacted(compact_revision)`; callers re-list with `get_prefix` and watch
  again from the listed revision + 1 (source/metadata/follow.py does that: `KeyFollower`
  for one key, `PrefixFollower` for every key under a prefix).
- Store unavailable (etcd down) -> `MetadataUnavailable` promptly (a few seconds at most).

Keys are `str` (UTF-8 on the wire), values are `bytes`.
"""
from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

# The store's errors are of the one hierarchy (source/core/errors.py): `MetadataError`, and
# under it `MetadataUnavailable` (etcd down, timeout: retriable), `LeaseNotFound` (expired or
# revoked), `RevisionCompacted`, and `MetadataUnauthenticated` / `MetadataPermissionDenied`
# (etcd refused the store's credentials, or a key its etcd roles do not grant). A caller lets
# them through; the error table gives each its gRPC status. They are named here too, where
# the store's users look for them.
from shadowtopic.core.errors import (
    LeaseNotFound,
    MetadataError,
    MetadataPermissionDenied,
    MetadataUnauthenticated,
    MetadataUnavailable,
    RevisionCompacted,
)

__all__ = ["Compare", "Delete", "KeyValue", "LeaseNotFound", "MetadataError",
           "MetadataPermissionDenied", "MetadataStore", "MetadataUnauthenticated",
           "MetadataUnavailable", "Put", "RevisionCompacted", "Snapshot", "TxnResult",
           "WatchEvent"]


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


@dataclass(frozen=True)
class WatchEvent:
    type: Literal["put", "delete"]
    key: str
    value: bytes  # b"" for deletes
    mod_revision: int  # revision of this event


@dataclass(frozen=True)
class Compare:
    key: str
    target: Literal["version", "create_revision", "mod_revision", "value"]
    op: Literal["==", "!=", "<", ">"]
    operand: int | bytes | None


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True)
class Delete:
    key: str
    prefix: bool = False


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int  # store revision after the txn (unchanged if it wrote nothing)


@dataclass
class Snapshot:
    """Result of `get_prefix`: the values and the revision they were read at."""

    items: list[KeyValue] = field(default_factory=list)
    revision: int = 0


class MetadataStore(abc.ABC):
    """Async etcd-like store. All methods may raise `MetadataUnavailable`."""

    @abc.abstractmethod
    async def get(self, key: str) -> KeyValue | None: ...

    @abc.abstractmethod
    async def get_prefix(self, prefix: str) -> Snapshot: ...

    @abc.abstractmethod
    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Write and return the new revision."""

    @abc.abstractmethod
    async def delete(self, key: str, prefix: bool = False) -> int:
        """Delete a key (or every key under a prefix); return how many were deleted."""

    @abc.abstractmethod
    async def txn(self, compares: Sequence[Compare], success: Sequence[Put | Delete],
                  failure: Sequence[Put | Delete] = ()) -> TxnResult: ...

    @abc.abstractmethod
    async def grant_lease(self, ttl: int) -> int: ...

    @abc.abstractmethod
    async def refresh_lease(self, lease: int) -> None: ...

    @abc.abstractmethod
    async def revoke_lease(self, lease: int) -> None: ...

    @abc.abstractmethod
    def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[list[WatchEvent]]:
        """Async iterator of event batches; cancel by closing it (`aclose`) or leaving the loop."""

    @abc.abstractmethod
    async def compact(self, revision: int) -> None:
        """Drop history before `revision` (etcd compaction); watches from older revisions fail."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    # ---- helpers built on the primitives (shared by both implementations) ----------------

    async def create(self, key: str, value: bytes, lease: int = 0) -> bool:
        """Put only if the key does not exist; True if created."""
        res = await self.txn([Compare(key, "version", "==", 0)], [Put(key, value, lease)])
        return res.succeeded

    async def cas(self, key: str, value: bytes, expected_mod_revision: int,
                  extra_compares: Sequence[Compare] = ()) -> bool:
        """Put if the key's mod_revision still equals `expected_mod_revision` (0 = absent)."""
        res = await self.txn([Compare(key, "mod_revision", "==", expected_mod_revision),
                              *extra_compares], [Put(key, value)])
        return res.succeeded

    async def get_keys(self, prefix: str, after: str = "", limit: int = 1000) -> list[str]:
        """Up to `limit` keys under `prefix` that sort after `after`, in key order, without
        their values: pages through a prefix too large for one `get_prefix` answer. Pages
        are read at different revisions (not a snapshot). EtcdStore reads keys only."""
        snap = await self.get_prefix(prefix)
        return [kv.key for kv in snap.items if kv.key > after][:limit]

    async def next_id(self, counter_key: str) -> int:
        """Cluster-unique increasing id from a counter key (CAS loop). First id is 1."""
        while True:
            kv = await self.get(counter_key)
            current = int(kv.value) if kv else 0
            nxt = current + 1
            if await self.cas(counter_key, str(nxt).encode(), kv.mod_revision if kv else 0):
                return nxt
