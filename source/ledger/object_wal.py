"""`ObjectWal`: a source broker's write-ahead log on object storage (`--wal s3://bucket/prefix`).

With it, a produce is acknowledged only once its frames are in an object *and* committed in
etcd under the topic owner's ownership record, so a source broker's machine can be lost with
its disk and nothing acknowledged goes (a new owner rebuilds each open ledger from the
commits: source/ledger/wal_restore.py). The local-disk WAL (source/ledger/wal.py, fsync) stays
the default.

Flush windows (group commit across the broker's topics):

- each topic's writer hands its group's WAL frames to `commit` (one *section*: one open
  ledger's frames of entries first .. first + count - 1, exactly as the local WAL holds them);
  a group that follows on from its ledger's section still waiting for a window joins that
  section (a writer sends its next group while the last one waits: without this, a topic
  had several sections, several commit keys and compares, per window);
- one flusher takes every section queued (waiting `window_s` after the first, and at most
  `MAX_OBJECT_BYTES` of them), writes them as **one object**, then commits them in **one
  etcd transaction** (more only past `MAX_TXN_OPS` sections: etcd's default limit on a
  transaction's operations), so the PUTs and transactions a second are bounded by the window
  (at most one object per `window_s`), not by the number of topics. Windows overlap (up to
  `max_flushes` in flight, `MAX_FLUSHES` by default): the next one opens while the last is
  still being written, so a batch waits for its own window's PUT and commit only. Their
  commits may land in any order; a topic's writer acknowledges its batches in entry
  order, and a restore stops at the first entry no commit holds, so a batch committed
  after one that failed is never acknowledged nor restored.
- the transaction compares every section's topic ownership record (key and value, which
  carry the owner's broker id and epoch) and puts one `WalCommit` per section at
  `keys.wal_commit(topic, ledger, first)`. A deposed owner's section therefore never
  commits: the transaction fails, the sections whose owner changed fail with `Fenced`, the
  others are committed by a second transaction. A transaction whose outcome is unknown
  (etcd unreachable) fails its sections with `fence=True`: the topic is reloaded and its
  recovery reads what the commits say.
- a PUT that fails commits nothing: its sections fail with `ServiceUnavailable`, the writer
  cuts its local copy back and reuses the entry ids.

Object layout: `<prefix>/<writer>/<seq:012d>.wal`, where `<writer>` is the broker id and a
random run id (unique per process). The object is `MAGIC` then the sections back to back; a
`WalCommit` records each section's offset and length, and each frame inside carries its own
CRC (source/ledger/wal.py), so a restore checks what it reads.

Deleting objects: an object this process wrote is deleted as soon as every ledger with a
section in it was sealed or removed (`release`, which also deletes the ledger's commits).
Objects nothing refers to any more (a dead broker's, a failed window's, a recovered ledger's)
are found by `sweep`: it lists the objects first, then reads every commit, and deletes the
objects no commit names that are older than the grace period (longer than any PUT-to-commit
delay: a broker paused past its lease can no longer commit).

Failpoints: `wal.object.after_put` (the object is written, not committed) and
`wal.object.after_commit` (committed, not yet acknowledged).
"""
from __future__ import annotations

import asyncio
import bisect
import logging
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from shadowtopic import failpoints
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import Compare, MetadataStore, MetadataUnavailable, Put
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

log = logging.getLogger(__name__)

MAGIC = b"STWOBJ01"
#: etcd's default `--max-txn-ops`: a transaction's compares and puts each stay within it
MAX_TXN_OPS = 128
MAX_OBJECT_BYTES = 8 << 20
#: windows whose object is being written or committed at once (default; `--wal-flushes`): a
#: window opens while the ones before it are in flight, so a batch waits for its own
#: window, not for theirs (an object store whose PUTs queue behind each other, as one
#: single-process server does, is better served by 1)
MAX_FLUSHES = 4
DEFAULT_WINDOW_S = 0.005
DEFAULT_GRACE_S = 600.0


class CommitFailed(Exception):
    """A section was not committed: `error` is what its appends fail with; `fence`: the
    outcome is unknown or the owner changed, so the ledger takes no more appends (its next
    owner's recovery decides what it holds); otherwise nothing was committed and the writer
    may reuse the entry ids."""

    def __init__(self, error: errors.ShadowTopicError, fence: bool):
        super().__init__(error.message)
        self.error = error
        self.fence = fence


@dataclass
class Section:
    """One open ledger's frames in one flush window."""

    topic: TopicName
    ownership: tuple[str, bytes]
    ledger_id: int
    first_entry_id: int
    count: int
    parts: list[bytes]  # the frames of the groups in this section, in entry order
    size: int  # their bytes
    done: asyncio.Future[None] = field(repr=False)
    since: float = 0.0  # the event loop's time when it was queued

    @property
    def ref(self) -> tuple[str, int]:
        return self.topic.path, self.ledger_id


#: the latency histograms' bucket bounds, seconds (an object store's PUT: milliseconds to a
#: few hundred of them)
LATENCY_BUCKETS = (0.002, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
                   0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)


@dataclass
class Latency:
    """A histogram of durations (what Prometheus's histogram type exports)."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """[(upper bound, observations at or below it)], "+Inf" last."""
        out, n = [], 0
        for bound, c in zip([*map(str, LATENCY_BUCKETS), "+Inf"], self.counts, strict=True):
            n += c
            out.append((bound, n))
        return out


@dataclass
class WalStats:
    """What the broker's metrics report of the object WAL."""

    puts: int = 0
    put_bytes: int = 0
    txns: int = 0
    sections: int = 0
    deleted_objects: int = 0
    failed_puts: int = 0
    put_seconds: Latency = field(default_factory=Latency)  # each PUT's
    txn_seconds: Latency = field(default_factory=Latency)  # each commit transaction's


def encode_object(sections: Sequence[Section]) -> tuple[bytes, list[int]]:
    """The object's bytes and each section's offset in it (pure)."""
    offsets, at = [], len(MAGIC)
    for s in sections:
        offsets.append(at)
        at += s.size
    return b"".join([MAGIC, *(f for s in sections for f in s.parts)]), offsets


def chunks(sections: list[Section], limit: int = MAX_TXN_OPS) -> list[list[Section]]:
    """Sections in groups whose transaction stays within etcd's operation limit: at most
    `limit` sections (one put each) and `limit` distinct ownership records (one compare each)."""
    out: list[list[Section]] = []
    cur: list[Section] = []
    owners: set[tuple[str, bytes]] = set()
    for s in sections:
        if len(cur) >= limit or (s.ownership not in owners and len(owners) >= limit):
            out.append(cur)
            cur, owners = [], set()
        cur.append(s)
        owners.add(s.ownership)
    if cur:
        out.append(cur)
    return out


class ObjectWal:
    """A broker's flush windows to one object-store prefix, the commits in etcd, and the
    deletion of objects nothing needs (module docstring). Shared by every topic the broker
    owns; each topic's writer calls `commit` through its `ObjectSink`
    (source/ledger/wal_sink.py)."""

    def __init__(self, fs: pafs.FileSystem, base: str, uri_prefix: str, store: MetadataStore,
                 writer_id: str, executor: Executor, window_s: float = DEFAULT_WINDOW_S,
                 max_object_bytes: int = MAX_OBJECT_BYTES, max_flushes: int = MAX_FLUSHES):
        self.fs = fs
        self.base = base.rstrip("/")  # the prefix's path in `fs`
        self.uri_prefix = uri_prefix.rstrip("/")  # the same as a URI (what commits record)
        self._store = store
        self._executor = executor
        self.window_s = window_s
        self._max_bytes = max_object_bytes
        self._writer = f"{writer_id}-{uuid.uuid4().hex[:8]}"
        self._seq = 0
        self._pending: list[Section] = []
        self._tails: dict[tuple[str, int], Section] = {}  # each ledger's pending section
        self._wake: asyncio.Event | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._flushing: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(max_flushes)
        self._closed = False
        self._in_flight: set[str] = set()  # objects written, their commit not settled
        # objects this process wrote -> the (topic path, ledger) sections in them not yet
        # released, and the reverse
        self._refs: dict[str, set[tuple[str, int]]] = {}
        self._objects_of: dict[tuple[str, int], set[str]] = {}
        self.stats = WalStats()

    # ---- the write path --------------------------------------------------------------------

    async def commit(self, topic: TopicName, ownership: tuple[str, bytes], ledger_id: int,
                     first_entry_id: int, count: int, frames: bytes) -> None:
        """Queue one section on the current window; return once it is in an object and
        committed. Raises `CommitFailed`."""
        if self._closed:
            raise CommitFailed(errors.TopicNotOwned("this broker is closing"), fence=True)
        ref = (topic.path, ledger_id)
        sec = self._tails.get(ref)
        if (sec is not None and sec.ownership == ownership
                and sec.first_entry_id + sec.count == first_entry_id
                and sec.size + len(frames) <= self._max_bytes // 4):
            sec.parts.append(frames)  # joins the section still waiting for its window
            sec.count += count
            sec.size += len(frames)
            await asyncio.shield(sec.done)  # (shared: one waiter cancelled cancels none)
            return
        loop = asyncio.get_running_loop()
        sec = Section(topic, ownership, ledger_id, first_entry_id, count, [frames],
                      len(frames), loop.create_future(), loop.time())
        self._pending.append(sec)
        self._tails[ref] = sec
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_loop(), name="wal-objects")
        await asyncio.shield(sec.done)

    async def _flush_loop(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while not self._closed or self._pending:
            await self._wake.wait()
            self._wake.clear()
            if not self._pending:
                continue
            # a slot first (at most max_flushes windows in flight), then the window: it
            # closes `window_s` after its oldest section came, so sections that came while
            # every slot was busy go out as soon as one frees (taking the window before the
            # slot left them for the window after it: a flush later)
            await self._slots.acquire()
            if self.window_s > 0 and not self._closed:
                await asyncio.sleep(max(0.0, self._pending[0].since + self.window_s
                                        - loop.time()))
            take, size = 0, 0
            while take < len(self._pending) and (take == 0 or size + self._pending[
                    take].size <= self._max_bytes):
                size += self._pending[take].size
                take += 1
            window, self._pending = self._pending[:take], self._pending[take:]
            for sec in window:  # no longer open to joiners
                if self._tails.get(sec.ref) is sec:
                    del self._tails[sec.ref]
            task = asyncio.create_task(self._flush_guarded(window))
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)
            if self._pending:
                self._wake.set()
        if self._flushing:
            await asyncio.gather(*self._flushing, return_exceptions=True)

    async def _flush_guarded(self, window: list[Section]) -> None:
        try:
            await self._flush(window)
        except Exception as exc:  # never leave an append waiting
            log.exception("WAL object flush failed")
            _fail(window, CommitFailed(errors.Internal(f"WAL object flush: {exc}"),
                                       fence=True))
        finally:
            self._slots.release()

    def _next_name(self) -> str:
        self._seq += 1
        return f"{self._writer}/{self._seq:012d}.wal"

    async def _flush(self, window: list[Section]) -> None:
        name = self._next_name()
        path, uri = f"{self.base}/{name}", f"{self.uri_prefix}/{name}"
        data, offsets = encode_object(window)
        loop = asyncio.get_running_loop()
        self._in_flight.add(path)
        try:
            started = time.perf_counter()
            try:
                await loop.run_in_executor(self._executor, self._put, path, data)
            except OSError as exc:
                self.stats.failed_puts += 1
                reason = " ".join(str(exc).split())
                _fail(window, CommitFailed(errors.ServiceUnavailable(
                    f"WAL object store: cannot write {uri}: {reason}"), fence=False))
                return
            self.stats.puts += 1
            self.stats.put_bytes += len(data)
            self.stats.put_seconds.observe(time.perf_counter() - started)
            failpoints.hit("wal.object.after_put")
            for sec in window:
                self._ref(path, sec.ref)
            records = {id(s): mpb.WalCommit(object=uri, offset=off, length=s.size,
                                            first_entry_id=s.first_entry_id, count=s.count)
                       for s, off in zip(window, offsets, strict=True)}
            for group in chunks(window):
                await self._commit_group(group, records)
        finally:
            self._in_flight.discard(path)
            if not self._refs.get(path):
                self._refs.pop(path, None)
                await loop.run_in_executor(self._executor, self._delete, path)

    def _put(self, path: str, data: bytes) -> None:
        if isinstance(self.fs, pafs.LocalFileSystem):  # an object store has no directories
            self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with self.fs.open_output_stream(path) as out:
            out.write(data)

    async def _commit_group(self, group: list[Section], records: dict[int, mpb.WalCommit]
                            ) -> None:
        """One transaction for `group`; after a failed compare, the sections whose owner
        changed fail with `Fenced` and the rest are committed by the next try."""
        while group:
            owners = list(dict.fromkeys(s.ownership for s in group))
            try:
                started = time.perf_counter()
                res = await self._store.txn(
                    [Compare(k, "value", "==", v) for k, v in owners],
                    [Put(keys.wal_commit(s.topic, s.ledger_id, s.first_entry_id),
                         records[id(s)].SerializeToString()) for s in group])
                self.stats.txns += 1
                self.stats.txn_seconds.observe(time.perf_counter() - started)
                if res.succeeded:
                    failpoints.hit("wal.object.after_commit")
                    self.stats.sections += len(group)
                    for s in group:
                        if not s.done.done():
                            s.done.set_result(None)
                    return
                lost = set()
                for k, v in owners:
                    kv = await self._store.get(k)
                    if kv is None or kv.value != v:
                        lost.add((k, v))
            except MetadataUnavailable as exc:
                # committed or not, the next owner's recovery says: the object stays until
                # these ledgers are released (or, released elsewhere, for the sweep)
                _fail(group, CommitFailed(errors.MetadataUnavailable(
                    f"WAL commit: outcome unknown: {exc}"), fence=True))
                return
            if not lost:  # nothing changed between the two reads: try again
                continue
            gone = [s for s in group if s.ownership in lost]
            self._unref(gone)
            _fail(gone, CommitFailed(errors.Fenced(
                "ownership lost: this broker's WAL commit was refused"), fence=True))
            group = [s for s in group if s.ownership not in lost]

    # ---- references and deletion -----------------------------------------------------------

    def _ref(self, path: str, ref: tuple[str, int]) -> None:
        self._refs.setdefault(path, set()).add(ref)
        self._objects_of.setdefault(ref, set()).add(path)

    def _unref(self, sections: list[Section]) -> None:
        for s in sections:
            for path in list(self._objects_of.get(s.ref, ())):
                refs = self._refs.get(path)
                if refs is not None:
                    refs.discard(s.ref)

    async def release(self, topic: TopicName, ledger_id: int) -> None:
        """A ledger was sealed or left the list: delete its commits, then every object of
        this process that no unreleased ledger needs. Raises `MetadataUnavailable` (the
        commits stay; the topic's next load deletes them: `wal_restore.drop_stale`)."""
        await self._store.delete(keys.wal_commits_of_ledger(topic, ledger_id), prefix=True)
        ref = (topic.path, ledger_id)
        dead = []
        for path in self._objects_of.pop(ref, set()):
            refs = self._refs.get(path)
            if refs is not None:
                refs.discard(ref)
                if not refs and path not in self._in_flight:
                    del self._refs[path]
                    dead.append(path)
        if dead:
            await asyncio.get_running_loop().run_in_executor(self._executor,
                                                             self._delete_all, dead)

    def _delete_all(self, paths: list[str]) -> None:
        for path in paths:
            self._delete(path)

    def _delete(self, path: str) -> None:
        try:
            self.fs.delete_file(path)
            self.stats.deleted_objects += 1
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot delete WAL object %s (the sweep retries): %s", path, exc)

    async def sweep(self, grace_s: float = DEFAULT_GRACE_S) -> int:
        """Delete the objects under the prefix that no commit names and that are older than
        `grace_s`; returns how many. Lists the objects before it reads the commits, so an
        object committed meanwhile is seen as named."""
        loop = asyncio.get_running_loop()
        infos = await loop.run_in_executor(self._executor, self._list)
        snap = await self._store.get_prefix(keys.WAL_COMMITS_PREFIX)
        named = set()
        for kv in snap.items:
            try:
                named.add(mpb.WalCommit.FromString(kv.value).object)
            except Exception:  # noqa: BLE001 - an unreadable commit names nothing we know
                continue
        cutoff = time.time() - grace_s
        dead = [i.path for i in infos
                if f"{self.uri_prefix}/{i.path[len(self.base) + 1:]}" not in named
                and i.path not in self._in_flight and i.path not in self._refs
                and i.mtime is not None and i.mtime.timestamp() < cutoff]
        if dead:
            await loop.run_in_executor(self._executor, self._delete_all, dead)
        return len(dead)

    def _list(self) -> list[pafs.FileInfo]:
        sel = pafs.FileSelector(self.base, recursive=True, allow_not_found=True)
        return [i for i in self.fs.get_file_info(sel)
                if i.type == pafs.FileType.File and i.path.endswith(".wal")]

    async def close(self) -> None:
        """Flush what is queued, then take no more sections."""
        self._closed = True
        if self._wake is not None:
            self._wake.set()
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)


def _fail(sections: Sequence[Section], exc: CommitFailed) -> None:
    for s in sections:
        if not s.done.done():
            s.done.set_exception(exc)
