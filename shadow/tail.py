"""Where a shadow reads the unsealed tail of its source: the `TailReader` seam.

A sealed ledger is read from its Parquet file in the shared storage root. The confirmed
entries of an unsealed ledger are in its WAL, on the disk of the source's owner. Two
readers:

- `FileTail`: the WAL itself, at the ledger's `wal_path` under this broker's WAL root: a
  shadow broker sharing the source's POSIX root (or its WAL directory) reads it there;
- `RemoteTail`: `Storage.ReadEntries` of the source's owner (source/broker/storage_service.py),
  for a shadow broker whose WAL root is not the source's (its own `--wal-dir`, on another
  machine). The owner's url is what the replication receiver last read of the source's
  ownership (`source_url`, set by shadow/replication.py).

`ShadowLedger` (shadow/ledger.py) starts on the file and moves to the owner, for good, the
first time the WAL of a ledger the source's list (read again) still holds unsealed is not
where its `wal_path` says (`FileTail.reachable`).

The tail cache. While a shadow reads from the owner, the replication receiver answers
`want_raw` and the source's replicator sends the entries' bytes with their ids
(shadow/replicator.py); the receiver keeps them in the broker's one `TailCache` (keyed by
source, so every shadow of a source shares them; at most TAIL_CACHE_BYTES of raw in all,
the oldest dropped first), and `RemoteTail.read` serves what it finds there, contiguous
from the first entry asked for, before asking the owner; what the owner returns goes there
too (the source's other shadows, and the other subscriptions of this one, read the same
ranges). The cache holds only entries the source sent as confirmed, byte for byte.

`entries(info, known)` is the final entry count of an unsealed ledger that takes no more
(a later ledger holds entries): from the file, its frame headers; from the owner, the
entries it returns from `known` on until it has no more (bounded calls of up to
COUNT_BYTES each).
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import Protocol

import grpc

from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import wal as walmod
from shadowtopic.ledger.ledger_reader import LedgerListReader
from shadowtopic.ledger.storage import Storage
from shadowtopic.ledger.view import ReadEntry
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import storage_pb2
from shadowtopic.security.dial import PLAINTEXT, Dial

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 10.0
MAX_MESSAGE = 80 << 20   # a response holds whole entries: one may be a 64 MiB message
COUNT_BYTES = 4 << 20    # raw per call while counting a ledger's entries
MAX_COUNT_CALLS = 10_000
RETRIES = 3              # a retriable failure (the owner moving) is tried again this often
RETRY_DELAY_S = 0.2
TAIL_CACHE_BYTES = 64 << 20  # raw the replicator sent, in all (every source of a broker)


def wal_entries(path: str) -> int:
    """How many entries the complete frames of a WAL hold (frame headers only)."""
    frames = walmod.scan_frames(path, 0, 0)
    if not frames:
        return 0
    first, count = frames[-1][0], frames[-1][1]
    return first + count


class TailReader(Protocol):
    async def read(self, info: mpb.LedgerInfo, first: int, count: int,
                   max_bytes: int) -> list[ReadEntry]:
        """Entries first .. first+count-1 of an unsealed ledger (fewer once `max_bytes` of
        raw are read, at least one). Raises DataLoss when they cannot be read."""

    async def publish_times(self, info: mpb.LedgerInfo, count: int) -> list[int]:
        """Publish times of the ledger's first `count` entries."""

    async def entries(self, info: mpb.LedgerInfo, known: int) -> int:
        """Entries of an unsealed ledger that takes no more (`known` are known to exist)."""

    async def close(self) -> None: ...


class FileTail:
    """The WAL in this broker's WAL root (shared with the source's owner)."""

    def __init__(self, reader: LedgerListReader, storage: Storage, executor: Executor):
        self._reader = reader
        self._storage = storage
        self._executor = executor

    def reachable(self, info: mpb.LedgerInfo) -> bool:
        """Whether the ledger's WAL is where its `wal_path` says, under this root."""
        return os.path.exists(self._storage.wal_path(info.wal_path))

    async def read(self, info, first, count, max_bytes):
        return await self._reader.read_wal(info, first, count, max_bytes)

    async def publish_times(self, info, count):
        return await self._reader.wal_publish_times(info, count)

    async def entries(self, info, known):
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, wal_entries,
                                              self._storage.wal_path(info.wal_path))
        except (OSError, ValueError) as exc:
            raise errors.DataLoss(f"WAL of ledger {info.ledger_id}: {exc}") from None

    async def close(self) -> None:
        pass


class TailCache:
    """Entries the source's replicators sent with their bytes, by (source, ledger, entry);
    at most `limit` bytes of raw, the oldest added dropped first."""

    def __init__(self, limit: int = TAIL_CACHE_BYTES):
        self.limit = limit
        self.bytes = 0
        self.hits = 0    # entries served from here
        self._entries: OrderedDict[tuple[str, int, int], ReadEntry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def holds(self, source: str, ledger_id: int, entry_id: int) -> bool:
        return (source, ledger_id, entry_id) in self._entries

    def add(self, source: str, entries: Iterable[ReadEntry]) -> None:
        for e in entries:
            key = (source, e.ledger_id, e.entry_id)
            if key in self._entries:
                continue
            self._entries[key] = e
            self.bytes += len(e.raw)
        while self.bytes > self.limit and self._entries:
            _, old = self._entries.popitem(last=False)
            self.bytes -= len(old.raw)

    def get(self, source: str, ledger_id: int, first: int, count: int,
            max_bytes: int) -> list[ReadEntry]:
        """Entries first .. first+count-1 held here, contiguous from `first` (fewer once
        `max_bytes` are taken, at least one; none when `first` is not held)."""
        out: list[ReadEntry] = []
        size = 0
        for i in range(first, first + count):
            e = self._entries.get((source, ledger_id, i))
            if e is None:
                break
            out.append(e)
            size += len(e.raw)
            if size >= max_bytes:
                break
        self.hits += len(out)
        return out


class RemoteTail:
    """`Storage.ReadEntries` of the source's owner (its url from `url()`)."""

    def __init__(self, source: TopicName, url: Callable[[], str | None],
                 dial: Dial = PLAINTEXT):
        self.source = source
        self._url = url
        self._dial = dial  # as the broker dials other brokers (source/security/tls.py)
        self._channel: grpc.aio.Channel | None = None
        self._channel_url = ""
        self._closing: set[asyncio.Task] = set()
        self.calls = 0  # ReadEntries calls made (stats, tests)
        #: the broker's cache of replicated bytes (set by the replication receiver)
        self.cache: TailCache | None = None

    def _stub(self) -> grpc.aio.UnaryStreamMultiCallable:
        url = self._url()
        if not url:
            raise errors.ServiceUnavailable(
                f"the owner of {self.source} is not known here yet (no replication from it)")
        if self._channel is None or url != self._channel_url:
            if self._channel is not None:  # the owner moved: the old channel closes
                task = asyncio.get_running_loop().create_task(self._channel.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            self._channel = self._dial.aio_channel(
                url, options=[("grpc.max_receive_message_length", MAX_MESSAGE)])
            self._channel_url = url
        return self._channel.unary_stream(
            "/shadowtopic.v1.Storage/ReadEntries",
            request_serializer=storage_pb2.ReadEntriesRequest.SerializeToString,
            response_deserializer=storage_pb2.ReadEntriesResponse.FromString)

    async def _call(self, lid: int, first: int, count: int, max_bytes: int) -> list[ReadEntry]:
        """One ReadEntries call (retried a few times while it fails retriably)."""
        req = storage_pb2.ReadEntriesRequest(topic=str(self.source), ledger_id=lid,
                                             from_entry=first, max_entries=count,
                                             max_bytes=max_bytes)
        for attempt in range(RETRIES + 1):
            try:
                out = []
                self.calls += 1
                async for resp in self._stub()(req, timeout=CALL_TIMEOUT_S):
                    out += [ReadEntry(e.ledger_id, e.entry_id, e.publish_time, e.raw)
                            for e in resp.entries]
                return out
            except grpc.aio.AioRpcError as exc:
                err = errors.from_rpc_error(exc)
            except errors.ShadowTopicError as exc:
                err = exc
            if not err.retriable or attempt == RETRIES:
                raise err
            await asyncio.sleep(RETRY_DELAY_S * (attempt + 1))
        raise AssertionError("unreachable")

    async def read(self, info, first, count, max_bytes):
        if self.cache is not None and count:
            got = self.cache.get(str(self.source), info.ledger_id, first, count, max_bytes)
            if got:
                return got
        got = await self._call(info.ledger_id, first, count, max_bytes)
        if count and (not got or got[0].entry_id != first):
            raise errors.DataLoss(f"the owner of {self.source} does not hold entry {first} "
                                  f"of ledger {info.ledger_id}")
        if self.cache is not None:  # the source's other shadows and readers here read them too
            self.cache.add(str(self.source), got)
        return got

    async def publish_times(self, info, count):
        times: list[int] = []
        while len(times) < count:
            got = await self.read(info, len(times), count - len(times), COUNT_BYTES)
            times += [e.publish_ms for e in got]
        return times

    async def entries(self, info, known):
        n = known
        for _ in range(MAX_COUNT_CALLS):
            got = await self._call(info.ledger_id, n, 0, COUNT_BYTES)
            if not got:
                return n
            n = got[-1].entry_id + 1
        raise errors.DataLoss(f"ledger {info.ledger_id} of {self.source}: still counting "
                              f"after {MAX_COUNT_CALLS} calls")

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()
