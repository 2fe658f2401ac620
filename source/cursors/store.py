"""Where cursors persist: the `CursorStore` interface and its in-memory twin.

A store keeps every cursor of a topic and is written in batches (`save` takes the cursors
that changed since the last save, `None` for a deleted one), never once per ack; a cursor is
its acknowledgements and its subscription's last activity (`CursorState.last_active`, kept
for subscription expiry across restarts). Every write is fenced: it carries the owner's
ownership key and value (`Fence`) and is refused with `errors.Fenced`, changing nothing,
once that key holds another value (another broker took the topic), so a deposed owner
cannot overwrite the new owner's cursors. A fence may also name the topic's incarnation
(its info key and generation: the key's etcd create revision): then a write of a topic
deleted, or deleted and created again, is refused too, so an old incarnation never writes
into a new one.

Both implementations read the states they are given before their first `await`, so callers
may keep mutating them while a save is in flight, and `load` returns fresh objects that share
nothing with the store. `SnapshotCursorStore` (snapshot.py) is the real one;
`MemoryCursorStore` below has the same semantics for unit tests (its `data` dict is the
"disk": hand the same dict to a new store to model a restart).
"""
from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import NamedTuple

from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.cursors.state import CursorState, Record
from shadowtopic.metadata.base import Compare, MetadataStore


class Fence(NamedTuple):
    """The owner's ownership record (the etcd key and the value this owner wrote there) and,
    when `info_key` is set, the topic's incarnation (its info key's create revision)."""
    key: str
    value: bytes
    info_key: str = ""
    generation: int = 0

    def compares(self) -> list[Compare]:
        """What a fenced transaction compares: it applies only while the fence holds."""
        out = [Compare(self.key, "value", "==", self.value)]
        if self.info_key:
            out.append(Compare(self.info_key, "create_revision", "==", self.generation))
        return out


class CursorStore(abc.ABC):
    @abc.abstractmethod
    async def load(self, topic: TopicName) -> dict[str, CursorState]:
        """Every cursor of `topic` (empty when none was saved). Raises `errors.DataLoss` /
        `errors.ChecksumError` when persisted cursors cannot be read back."""

    @abc.abstractmethod
    async def save(self, topic: TopicName, changes: Mapping[str, CursorState | None],
                   fence: Fence, *, urgent: bool = False) -> None:
        """Persist a batch of changed cursors (`None` = deleted) atomically: all or none.
        Raises `errors.Fenced` when `fence` no longer holds (nothing changes). `urgent`: a
        few cursors a caller waits for (`CursorFlusher.persist`); the store may put off
        housekeeping that would rewrite every cursor of the topic (snapshot.py)."""

    @abc.abstractmethod
    async def delete(self, topic: TopicName, fence: Fence) -> None:
        """Remove every cursor of `topic` (the topic is deleted); fenced like `save`."""

    def forget(self, topic: TopicName) -> None:
        """Drop whatever this object caches about `topic` (it was unloaded here); a store
        that caches nothing has nothing to do."""
        return None

    async def purge(self, topic: TopicName) -> None:
        """The topic was deleted (its metadata, the pointer included, is gone): remove
        whatever else is left of its cursors. Not fenced: nobody owns a deleted topic. A
        store that keeps nothing beside the metadata has nothing to do."""
        return None


def records(changes: Mapping[str, CursorState | None]) -> dict[str, Record | None]:
    """The changes as immutable records (taken synchronously, before any await). Names
    sharing one cursor object (a cohort, source/subscriptions/cohorts.py) share one record,
    taken once."""
    out: dict[str, Record | None] = {}
    taken: dict[int, Record] = {}  # id(state) -> its record (the states live meanwhile)
    for name, st in changes.items():
        if st is None:
            out[name] = None
            continue
        rec = taken.get(id(st))
        if rec is None:
            rec = taken[id(st)] = st.to_record()
        out[name] = rec
    return out


async def check_fence(metadata: MetadataStore, fence: Fence) -> None:
    """Raise `errors.Fenced` unless the ownership key still holds the fence's value (and the
    topic is still the incarnation the fence names)."""
    kv = await metadata.get(fence.key)
    if kv is None or kv.value != fence.value:
        raise errors.Fenced(f"ownership {fence.key} moved: cursors not written")
    if fence.info_key:
        info = await metadata.get(fence.info_key)
        if info is None or info.create_revision != fence.generation:
            raise errors.Fenced(f"{fence.info_key} was deleted (or deleted and created "
                                "again): cursors not written")


class MemoryCursorStore(CursorStore):
    """In-memory twin: cursors in a dict, ownership checked against a `MetadataStore`."""

    def __init__(self, metadata: MetadataStore,
                 data: dict[TopicName, dict[str, Record]] | None = None):
        self.metadata = metadata
        self.data = {} if data is None else data

    async def load(self, topic: TopicName) -> dict[str, CursorState]:
        return {name: CursorState.from_record(rec)
                for name, rec in self.data.get(topic, {}).items()}

    async def save(self, topic: TopicName, changes: Mapping[str, CursorState | None],
                   fence: Fence, *, urgent: bool = False) -> None:
        recs = records(changes)
        if not recs:
            return
        await check_fence(self.metadata, fence)
        # no await between the check and the write: atomic on the event loop
        cursors = self.data.setdefault(topic, {})
        for name, rec in recs.items():
            if rec is None:
                cursors.pop(name, None)
            else:
                cursors[name] = rec

    async def purge(self, topic: TopicName) -> None:
        self.data.pop(topic, None)

    async def delete(self, topic: TopicName, fence: Fence) -> None:
        await check_fence(self.metadata, fence)
        self.data.pop(topic, None)
