"""`SnapshotCursorStore`: a topic's cursors in files under the storage root, named by one
small pointer in etcd (batched cursor persistence, never one etcd write per ack: see
docs/ARCHITECTURE.md, "Metadata in etcd").

Layout (formats in proto/shadowtopic/pb/storage/v1/cursors.proto):

    <root>/cursors/<topic-dir>/<sequence:020d>-<token>.full    CursorFile: every cursor
    <root>/cursors/<topic-dir>/<sequence:020d>-<token>.delta   CursorFile: one save's changes
    /shadowtopic/topics/<topic-path>/cursors                   CursorPointer: sequence, the
                                                               full file and the deltas after
                                                               it (path, crc32c, size each)

<topic-dir> is `storage.topic_dir` (escaped); paths in the pointer are relative to the root.
The cursors of a topic are the full file with the deltas applied in order. A row is a
cursor's record (state.py): its acknowledgements and its subscription's last activity
(`last_active_ms`; files written before that column load with 0, "unknown").

`save(topic, changes, fence)`, one batch, serialised per topic:
1. Write one file: a delta holding just the changed cursors, or a full file holding all of
   them (the first save, every `compact_every`-th, or once the deltas outgrow the full file:
   a compaction). An `urgent` save (a reset or seek waiting to answer, issue 29) counts to
   `compact_every * URGENT_DEFER` deltas before it compacts: it writes its few cursors, and
   the next batched flush, which compacts at `compact_every`, rewrites the 100,000 others.
   Local roots: temp name, fsync, rename, fsync the directory; object stores: one upload.
   The name's random token keeps a deposed owner and the new owner, writing the same
   sequence, off each other's files.
2. Move the pointer with one etcd txn comparing the pointer's mod_revision and the fence
   (the owner's ownership key still holds its value). Refused because the owner changed ->
   the file is deleted and `errors.Fenced` raised. Refused while this owner still owns the
   topic -> the pointer moved under this object (a reply lost in an etcd outage, another
   store object): re-read pointer and files, then retry once; changes are whole cursor
   states, so applying them again is correct.
3. After a compaction, delete every file with a sequence below the new pointer's: the old
   pointer's files (only after the pointer moved) and orphans of failed saves. Files with a
   higher sequence are never touched (a newer owner may be writing them).

`load(topic)` reads the pointer, then the files, each checked against the pointer's size and
crc32c: a missing file raises `errors.DataLoss`, a mismatch `errors.ChecksumError`, an
undecodable or misplaced file `errors.DataLoss` (never a silent empty start). A file that
vanished because a compaction moved the pointer meanwhile (a reader that is not the owner)
is retried with the new pointer, a bounded number of times.

The store keeps the records last persisted for each topic it loaded or saved (one small
tuple per cursor) to write full files without reading them back; `forget` drops them.
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from itertools import chain, repeat
from typing import TypeVar

import google_crc32c
import pyarrow.fs as pafs

from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.cursors.state import CursorState, Record
from shadowtopic.cursors.store import CursorStore, Fence, check_fence, records
from shadowtopic.ledger.storage import Storage, topic_dir
from shadowtopic.ledger.wal import fsync_dir
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import Compare, Delete, MetadataStore, Put
from shadowtopic.pb.storage.v1 import cursors_pb2 as cpb

log = logging.getLogger(__name__)
T = TypeVar("T")
FORMAT = 1
LOAD_ATTEMPTS = 3
URGENT_DEFER = 8   # an urgent save compacts only past compact_every * this many deltas


def cursor_dir(topic: TopicName) -> str:
    """The topic's cursor files, relative to the storage root."""
    return f"cursors/{topic_dir(topic)}"


def file_sequence(rel: str) -> int | None:
    """The sequence a cursor file name starts with (None for foreign names)."""
    head = rel.rsplit("/", 1)[-1][:20]
    return int(head) if len(head) == 20 and head.isdigit() else None


# ---- file format (pure) ----------------------------------------------------------------------

def encode(topic: TopicName, sequence: int, full: bool,
           recs: Mapping[str, Record | None]) -> bytes:
    f = cpb.CursorFile(format=FORMAT, topic=str(topic), sequence=sequence, full=full)
    deleted = [n for n, r in recs.items() if r is None]
    live = {n: r for n, r in recs.items() if r is not None} if deleted else recs
    rows: list[Record] = list(live.values())  # type: ignore[arg-type]
    f.names.extend(live)
    f.mark_delete_ledger.extend([r[0] for r in rows])
    f.mark_delete_entry.extend([r[1] for r in rows])
    f.range_counts.extend([len(r[2]) >> 2 for r in rows])
    f.ranges.extend(chain.from_iterable([r[2] for r in rows if r[2]]))
    f.deleted.extend(deleted)
    f.last_active_ms.extend([r[3] for r in rows])
    return f.SerializeToString()


def apply_file(f: cpb.CursorFile, into: dict[str, Record]) -> None:
    """Apply one decoded file to `into` (a full file is applied to an empty dict). A file
    written before `last_active_ms` existed has none: its rows read as 0 (unknown)."""
    names, ledgers, entries = list(f.names), list(f.mark_delete_ledger), list(f.mark_delete_entry)
    counts, ranges, active = list(f.range_counts), list(f.ranges), list(f.last_active_ms)
    if not (len(ledgers) == len(entries) == len(counts) == len(names)
            and 4 * sum(counts) == len(ranges) and len(active) in (0, len(names))):
        raise errors.DataLoss(f"cursor file {f.sequence} of {f.topic}: columns disagree")
    for name in f.deleted:
        into.pop(name, None)
    actives = active or repeat(0)
    if not ranges:  # no holes anywhere: one C-speed zip
        # lengths checked above; repeat() is endless, so not strict
        into.update(zip(names, zip(ledgers, entries, repeat(()), actives, strict=False),
                        strict=True))
        return
    pos = 0
    for name, ledger, entry, count, last in zip(names, ledgers, entries, counts, actives,
                                                strict=False):  # lengths checked above
        if count:
            rec = (ledger, entry, tuple(ranges[pos:pos + 4 * count]), last)
            try:
                CursorState.from_record(rec)  # ranges sorted, disjoint, above mark-delete
            except ValueError as exc:
                raise errors.DataLoss(f"cursor {name!r} in file {f.sequence} of {f.topic}: "
                                      f"{exc}") from None
            into[name] = rec
            pos += 4 * count
        else:
            into[name] = (ledger, entry, (), last)


# ---- storage I/O (blocking: run in an executor) ----------------------------------------------

def write_file(storage: Storage, rel: str, data: bytes) -> None:
    path = storage.full(rel)
    parent = path.rsplit("/", 1)[0]
    if isinstance(storage.fs, pafs.LocalFileSystem):
        os.makedirs(parent, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        fsync_dir(parent)
    else:
        storage.fs.create_dir(parent, recursive=True)
        with storage.fs.open_output_stream(path) as out:
            out.write(data)


def _encode_and_write(storage: Storage, rel: str, topic: TopicName, sequence: int, full: bool,
                      recs: Mapping[str, Record | None]) -> cpb.CursorFileRef:
    data = encode(topic, sequence, full, recs)
    write_file(storage, rel, data)
    return cpb.CursorFileRef(path=rel, sequence=sequence, crc32c=google_crc32c.value(data),
                             size_bytes=len(data),
                             cursors=sum(r is not None for r in recs.values()))


class MissingFile(Exception):
    """A file the pointer names is not there (the caller decides whether data was lost)."""


def read_files(storage: Storage, topic: TopicName, ptr: cpb.CursorPointer) -> dict[str, Record]:
    """Every cursor the pointer names, checked against the pointer."""
    recs: dict[str, Record] = {}
    for ref in (ptr.full, *ptr.deltas):
        try:
            with storage.fs.open_input_file(storage.full(ref.path)) as src:
                data = src.read()
        except FileNotFoundError:
            raise MissingFile(ref.path) from None
        if len(data) != ref.size_bytes or google_crc32c.value(data) != ref.crc32c:
            raise errors.ChecksumError(f"cursor file {ref.path} of {topic}: checksum mismatch")
        try:
            f = cpb.CursorFile.FromString(data)
        except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError and friends
            raise errors.DataLoss(f"cursor file {ref.path} of {topic}: {exc}") from None
        if (f.format != FORMAT or f.topic != str(topic) or f.sequence != ref.sequence
                or f.full != (ref is ptr.full)):
            raise errors.DataLoss(f"cursor file {ref.path} is not the file its pointer names")
        apply_file(f, recs)
    return recs


def states(recs: dict[str, Record]) -> dict[str, CursorState]:
    return {name: CursorState.from_record(rec) for name, rec in recs.items()}


def collect(storage: Storage, topic: TopicName, below: int) -> None:
    """Delete the topic's cursor files with a sequence below `below`."""
    for rel in storage.list_dir(cursor_dir(topic)):
        seq = file_sequence(rel)
        if seq is not None and seq < below:
            storage.delete(rel)


def remove_all(storage: Storage, topic: TopicName) -> None:
    for rel in storage.list_dir(cursor_dir(topic)):
        storage.delete(rel)
    storage.delete_dir(cursor_dir(topic))


# ---- the store -------------------------------------------------------------------------------

@dataclass
class _Topic:
    records: dict[str, Record]
    pointer: cpb.CursorPointer | None
    revision: int        # the pointer key's mod_revision (0: no pointer)


class SnapshotCursorStore(CursorStore):
    def __init__(self, metadata: MetadataStore, storage: Storage,
                 executor: Executor | None = None, compact_every: int = 32):
        self.metadata = metadata
        self.storage = storage
        self.compact_every = compact_every
        self._executor = executor
        self._topics: dict[TopicName, _Topic] = {}
        self._locks: dict[TopicName, asyncio.Lock] = {}

    def _lock(self, topic: TopicName) -> asyncio.Lock:
        return self._locks.setdefault(topic, asyncio.Lock())

    async def _io(self, fn: Callable[..., T], *args) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        except OSError as exc:  # a full disk: StorageFull; a read-only one: StorageReadOnly
            raise errors.storage_error(exc, "cursor storage") from None

    # ---- load ------------------------------------------------------------------------------

    async def load(self, topic: TopicName) -> dict[str, CursorState]:
        async with self._lock(topic):
            t = self._topics[topic] = await self._read(topic)
        return await self._io(states, t.records)  # 100,000 objects: off the event loop

    async def _read(self, topic: TopicName) -> _Topic:
        key = keys.cursors(topic)
        attempt = 0
        while True:
            kv = await self.metadata.get(key)
            if kv is None:
                return _Topic({}, None, 0)
            try:
                ptr = cpb.CursorPointer.FromString(kv.value)
            except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError and friends
                raise errors.DataLoss(f"cursor pointer of {topic}: {exc}") from None
            try:
                recs = await self._io(read_files, self.storage, topic, ptr)
                return _Topic(recs, ptr, kv.mod_revision)
            except MissingFile as exc:
                attempt += 1
                again = await self.metadata.get(key)
                if (again is None or again.mod_revision == kv.mod_revision
                        or attempt >= LOAD_ATTEMPTS):
                    raise errors.DataLoss(f"cursor file {exc} of {topic} is missing") from None

    def forget(self, topic: TopicName) -> None:
        """Drop what this object keeps about `topic` (the topic was unloaded)."""
        self._topics.pop(topic, None)
        lock = self._locks.get(topic)
        if lock is not None and not lock.locked():
            del self._locks[topic]

    # ---- save ------------------------------------------------------------------------------

    async def save(self, topic: TopicName, changes: Mapping[str, CursorState | None],
                   fence: Fence, *, urgent: bool = False) -> None:
        recs = records(changes)
        if not recs:
            return
        async with self._lock(topic):
            for attempt in range(2):
                t = self._topics.get(topic)
                if t is None or attempt:
                    t = self._topics[topic] = await self._read(topic)
                if await self._commit(topic, t, recs, fence, urgent):
                    return
        raise errors.Fenced(f"{topic}: the cursor pointer keeps moving under its owner")

    async def _commit(self, topic: TopicName, t: _Topic, recs: dict[str, Record | None],
                      fence: Fence, urgent: bool = False) -> bool:
        """One save attempt: True when written, False when the pointer moved under us."""
        old = t.pointer
        seq = (old.sequence if old else 0) + 1
        every = self.compact_every * (URGENT_DEFER if urgent else 1)
        full = (old is None or len(old.deltas) >= every
                or sum(d.size_bytes for d in old.deltas) >= old.full.size_bytes)
        merged = _applied(t.records, recs) if full else None  # the whole set, for a full file
        body: Mapping[str, Record | None] = merged if merged is not None else recs
        kind = "full" if full else "delta"
        rel = f"{cursor_dir(topic)}/{seq:020d}-{secrets.token_hex(4)}.{kind}"
        ref = await self._io(_encode_and_write, self.storage, rel, topic, seq, full, body)
        new = cpb.CursorPointer(sequence=seq, written_ms=int(time.time() * 1000))
        if old is None or full:
            new.full.CopyFrom(ref)
        else:
            new.full.CopyFrom(old.full)
            new.deltas.extend(old.deltas)
            new.deltas.append(ref)
        key = keys.cursors(topic)
        # if this txn applies but its reply is lost, the next save's compare fails on the
        # pointer's revision and re-reads: the file written here stays named
        res = await self.metadata.txn([Compare(key, "mod_revision", "==", t.revision),
                                       *fence.compares()],
                                      [Put(key, new.SerializeToString())])
        if not res.succeeded:
            await self._io(self.storage.delete, rel)
            await check_fence(self.metadata, fence)
            return False
        t.pointer, t.revision = new, res.revision
        t.records = merged if merged is not None else _applied(t.records, recs, in_place=True)
        if full and old is not None:
            try:
                await self._io(collect, self.storage, topic, seq)
            except errors.ShadowTopicError as exc:  # garbage only: the next compaction retries
                log.warning("%s: could not delete old cursor files: %s", topic, exc)
        return True

    # ---- delete ----------------------------------------------------------------------------

    async def purge(self, topic: TopicName) -> None:
        async with self._lock(topic):
            self._topics.pop(topic, None)
            await self._io(remove_all, self.storage, topic)
        self.forget(topic)

    async def delete(self, topic: TopicName, fence: Fence) -> None:
        async with self._lock(topic):
            res = await self.metadata.txn(fence.compares(), [Delete(keys.cursors(topic))])
            if not res.succeeded:
                raise errors.Fenced(f"ownership {fence.key} moved: cursors not deleted")
            self._topics.pop(topic, None)
            await self._io(remove_all, self.storage, topic)


def _applied(base: dict[str, Record], recs: Mapping[str, Record | None],
             in_place: bool = False) -> dict[str, Record]:
    out = base if in_place else dict(base)
    for name, rec in recs.items():
        if rec is None:
            out.pop(name, None)
        else:
            out[name] = rec
    return out
