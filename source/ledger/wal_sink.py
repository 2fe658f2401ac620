"""Where a group commit's frames become durable: the seams between a topic's writer
(source/ledger/writer.py) and the broker's choice of WAL.

- `WalSink`, `LocalSink` (the default): the frames are appended to the open ledger's local
  WAL and fdatasynced (source/ledger/wal.py); raises `OSError` (nothing durable, the WAL cut
  back).
- `CommitPipeline`, `ObjectSink` (`--wal s3://...`): the frames are appended to the local WAL
  without an fsync (`write_copy`: a copy this broker reads evicted entries and seals from),
  then committed through the broker's `ObjectWal` (`commit`, source/ledger/object_wal.py):
  durable once in an object and committed in etcd under the topic's ownership record; it
  raises `CommitFailed` (`fence` says whether the ledger may take more appends). Several
  groups of a ledger are committed at once (`depth`); when one fails with nothing after it
  in flight, the writer cuts the local copy back to where it began (`cut_back`).
"""
from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from typing import Protocol

from shadowtopic.core.names import TopicName
from shadowtopic.ledger import wal as walmod
from shadowtopic.ledger.object_wal import CommitFailed, ObjectWal

__all__ = ["CommitFailed", "CommitPipeline", "LocalSink", "ObjectSink", "WalSink"]


class WalSink(Protocol):
    async def persist(self, wal: walmod.WalFile, ledger_id: int, first_entry_id: int,
                      count: int, frames: bytes) -> None:
        """Make `frames` (entries first_entry_id .. + count - 1 of the ledger) durable."""
        ...


class CommitPipeline(Protocol):
    """A sink that commits several groups of a ledger at once (the writer then acknowledges
    them in entry order): `depth` groups in flight at most."""

    depth: int

    async def write_copy(self, wal: walmod.WalFile, frames: bytes) -> None:
        """Append `frames` to the local copy (no fsync); raises `OSError`."""
        ...

    async def commit(self, ledger_id: int, first_entry_id: int, count: int,
                     frames: bytes) -> None:
        """Make the frames durable; raises `CommitFailed`."""
        ...

    async def cut_back(self, wal: walmod.WalFile, size: int) -> None:
        """Cut the local copy back to `size` bytes (frames never made durable)."""
        ...


class LocalSink:
    def __init__(self, executor: Executor):
        self._executor = executor

    async def persist(self, wal: walmod.WalFile, ledger_id: int, first_entry_id: int,
                      count: int, frames: bytes) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, wal.write_sync,
                                                         frames)


class ObjectSink:
    """The `CommitPipeline` over the broker's `ObjectWal`."""

    depth = 8  # groups of a ledger in flight

    def __init__(self, objects: ObjectWal, topic: TopicName, ownership: tuple[str, bytes],
                 executor: Executor):
        self._objects = objects
        self._topic = topic
        self._ownership = ownership
        self._executor = executor

    async def write_copy(self, wal: walmod.WalFile, frames: bytes) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, wal.write, frames)

    async def commit(self, ledger_id: int, first_entry_id: int, count: int,
                     frames: bytes) -> None:
        await self._objects.commit(self._topic, self._ownership, ledger_id, first_entry_id,
                                   count, frames)

    async def cut_back(self, wal: walmod.WalFile, size: int) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, wal.cut_back, size)
