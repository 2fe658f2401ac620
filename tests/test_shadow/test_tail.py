"""The shadow's tail readers (shadow/tail.py), in-process: a source ManagedLedger served by
`Storage.ReadEntries` (source/broker/storage_service.py) on a loopback gRPC server, and
ShadowLedgers of it whose storage either shares the source's WAL root (`FileTail`) or has
a WAL root of its own (`RemoteTail`: the WAL is not found, the entries come from the
server). Both must give the source's entries, byte for byte, with its ids."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest
from support.fakes import Outbox
from support.read_harness import SOURCE, TOPIC, Harness, ShadowDriver, msgs, until

from shadowtopic.broker.memory import ClientMemory
from shadowtopic.broker.storage_service import add_storage_service
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.ledger import wal
from shadowtopic.ledger.storage import Storage
from shadowtopic.ledger.view import ReadEntry
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import replication_pb2
from shadowtopic.read.positions import EARLIEST, Start
from shadowtopic.shadow import tail
from shadowtopic.shadow.ledger import ShadowLedger
from shadowtopic.shadow.replication import ReplicationService
from shadowtopic.shadow.tail import TailCache

FIRST = MessageId(0, 0)  # entry 0 of ledger 0: where the read_all helper starts by default


class Topics:
    """What the Storage service needs of a TopicManager: the source, loaded here."""

    def __init__(self):
        self.ledger = None  # the source's ManagedLedger once opened
        self.serving = True

    def loaded(self, topic):
        if self.serving and self.ledger is not None and topic == SOURCE:
            return SimpleNamespace(writer=self.ledger, ledger=self.ledger)
        return None

    async def info(self, topic):
        if topic != SOURCE:
            raise errors.TopicNotFound(f"{topic} does not exist")
        return mpb.TopicInfo()

    async def owner(self, topic):
        return None


class Driver(ShadowDriver):
    """ShadowDriver (tests/support/read_harness.py) whose shadows read the tail
    through a loopback Storage server: `remote` gives them a WAL root of their own."""

    def __init__(self, tmp_path, remote: bool):
        super().__init__(tmp_path)
        self.tmp_path = tmp_path
        self.remote = remote
        self.topics = Topics()
        self.server: grpc.aio.Server | None = None
        self.url = ""
        self.shadows: list[ShadowLedger] = []

    async def open(self) -> ShadowLedger:
        if self.server is None:
            self.server = grpc.aio.server()
            add_storage_service(self.server, self.topics, ClientMemory())
            self.url = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
            await self.server.start()
        if self.source is None:
            self.source = await self.managed.open()
            self.topics.ledger = self.source
        storage = Storage(self.managed.root, wal_dir=str(self.tmp_path / "shadow-wal")) \
            if self.remote else Storage(self.managed.root)
        sl = ShadowLedger(TOPIC, SOURCE, self.store, storage, self.executor, retry_delay=0.05)
        sl.source_url = self.url
        await sl.start()
        self.shadows.append(sl)
        last = self.source.last_confirmed()
        if last is not None:
            sl.on_replicated(last)
        await self.caught_up(sl)
        return sl

    async def close(self) -> None:
        for sl in self.shadows:
            await sl.close()
        await super().close()
        if self.server is not None:
            await self.server.stop(None)


def run(tmp_path, remote: bool, body, timeout: float = 30):
    async def main():
        h = Harness("shadow", tmp_path)
        h.driver = h.shadow = Driver(tmp_path, remote)
        await h.start()
        try:
            await body(h)
        finally:
            await h.close()
    asyncio.run(asyncio.wait_for(main(), timeout))


async def read_all(view, start=FIRST):
    out, pos = [], start
    for _ in range(1000):
        got = await view.read(pos, 7, 1 << 30)
        if not got:
            return out
        out += got
        pos = MessageId(got[-1].ledger_id, got[-1].entry_id + 1)
    raise AssertionError("read_all did not end")


@pytest.mark.parametrize("remote", [False, True], ids=["file", "remote"])
def test_a_shadow_reads_the_sources_tail_from_its_wal_or_its_owner(tmp_path, remote):
    async def body(h):
        sl, src = h.view, h.shadow.source
        out = Outbox()
        r, _ = await h.engine.open(out, 1, TOPIC, Start(EARLIEST))
        h.engine.flow(r, 1000)
        for i in range(5):  # sealed ledgers and an open one
            await h.append(msgs(i * 20, i * 20 + 20))
            if i % 2:
                await h.roll()
        await until(lambda: len(out.raws(1)) == 100)
        assert out.raws(1) == msgs(0, 100)
        assert [r.sealed for r in src.ranges()][-1] is False
        assert await read_all(sl) == await read_all(src)
        opened = src.ledgers()[-1]
        times = await sl.reader._publish_times(opened)  # through the tail reader
        assert times == await src.reader._publish_times(opened)
        assert await sl.position_at_time(times[3]) == await src.position_at_time(times[3])
        assert sl.remote is remote
        if remote:
            assert sl.remote_tail.calls > 0
            assert await sl.remote_tail.entries(opened, 0) == opened.entries
            assert await sl.remote_tail.entries(opened, 5) == opened.entries
        else:
            assert sl.remote_tail.calls == 0
            assert await sl.file_tail.entries(opened, 0) == opened.entries
    run(tmp_path, remote, body)


def test_the_remote_tail_says_why_it_cannot_read(tmp_path, monkeypatch):
    monkeypatch.setattr(tail, "RETRY_DELAY_S", 0.01)

    async def body(h):
        sl, src = h.view, h.shadow.source
        await h.append(msgs(0, 5))
        assert await read_all(sl) == await read_all(src)
        opened = src.ledgers()[-1]
        h.shadow.topics.serving = False  # the source moved away from that broker
        with pytest.raises(errors.TopicNotOwned):
            await sl.remote_tail.read(opened, 0, 5, 1 << 20)
        sl.source_url = None
        with pytest.raises(errors.ServiceUnavailable, match="not known"):
            await sl.remote_tail.read(opened, 0, 5, 1 << 20)
    run(tmp_path, True, body)


# ---- the tail cache: what the replicator sent with want_raw ---------------------------------

def entry(lid: int, eid: int, size: int = 10) -> ReadEntry:
    return ReadEntry(lid, eid, 1000 + eid, bytes([eid % 256]) * size)


def test_the_tail_cache_gives_contiguous_entries_within_its_bounds():
    cache = TailCache(limit=100)
    cache.add("s", [entry(1, i) for i in range(5)])
    cache.add("other", [entry(1, 7)])
    assert cache.get("s", 1, 0, 10, 1 << 20) == [entry(1, i) for i in range(5)]
    assert cache.get("s", 1, 2, 2, 1 << 20) == [entry(1, 2), entry(1, 3)]
    assert cache.get("s", 1, 1, 5, 15) == [entry(1, 1), entry(1, 2)]  # max_bytes passed
    assert cache.get("s", 1, 5, 3, 1 << 20) == []   # not held: the owner is asked
    assert cache.get("s", 2, 0, 3, 1 << 20) == []   # another ledger
    assert cache.get("other", 1, 7, 1, 1 << 20) == [entry(1, 7)]
    cache.add("s", [entry(1, i) for i in range(5, 10)])  # 110 bytes: the oldest goes
    assert cache.bytes <= 100
    assert cache.get("s", 1, 0, 10, 1 << 20) == []
    assert cache.get("s", 1, 5, 5, 1 << 20) == [entry(1, i) for i in range(5, 10)]
    cache.add("s", [entry(1, 9)])  # resent: kept once
    assert cache.bytes <= 100 and len(cache) <= 10


def test_a_remote_shadow_asks_for_raw_and_serves_the_tail_from_what_was_sent(tmp_path):
    """The replication receiver answers want_raw while its shadow reads remotely, keeps the
    bytes a batch carries in its tail cache, and the shadow reads them from there: with
    the owner's Storage service gone, the cached entries still read, byte-identical."""
    async def body(h):
        sl, src, driver = h.view, h.shadow.source, h.shadow
        topics = SimpleNamespace(store=driver.store)

        async def topic(name):
            assert name == TOPIC
            return SimpleNamespace(ledger=sl)
        topics.topic = topic
        service = ReplicationService(topics, "c")
        epoch = driver.managed.epoch

        async def replicate(entries, last):
            batch = replication_pb2.ReplicateBatch(
                shadow=str(TOPIC), source=str(SOURCE), batch_id=1, source_epoch=epoch,
                last_confirmed=last.to_pb())
            for e in entries:
                batch.entries.add(ledger_id=e.ledger_id, entry_id=e.entry_id,
                                  publish_time=e.publish_ms, raw=e.raw)

            async def batches():
                yield batch
            return [ack async for ack in service.Replicate(batches(), None)]

        await h.append(msgs(0, 5))
        acks = await replicate([], src.last_confirmed())
        assert not acks[0].HasField("error") and acks[0].want_raw is False  # WAL not tried
        assert await read_all(sl) == await read_all(src)  # the WAL is not here: remote
        acks = await replicate([], src.last_confirmed())
        assert acks[0].want_raw is True
        raws = msgs(5, 12)
        lid, first = await src.append(raws, wal.request_bytes(raws), sum(map(len, raws)))
        sent = await src.read(MessageId(lid, first), 100, 1 << 30)
        acks = await replicate(sent, src.last_confirmed())
        assert acks[0].last_persisted.entry_id == first + 6
        assert len(service.tail_cache) == 5 + 7  # what was read from the owner, and sent
        h.shadow.topics.serving = False  # the owner's service answers no more
        calls = sl.remote_tail.calls
        got = await sl.read(MessageId(lid, first), 100, 1 << 30)
        assert got == sent
        assert sl.remote_tail.calls == calls and service.tail_cache.hits >= 7
    run(tmp_path, True, body)


def test_one_shadow_stream_carries_the_bytes_the_others_send_ids(tmp_path):
    """Two shadows of one source on this broker (two streams): only the first is asked for
    the bytes; the other's ids wait for them, and once the carrier stops sending, the other
    takes over and its entries read from the source's owner."""
    async def body(h):
        sl, src, driver = h.view, h.shadow.source, h.shadow
        topics = SimpleNamespace(store=driver.store)

        async def topic(name):
            return SimpleNamespace(ledger=sl)  # both shadow names: the same view will do
        topics.topic = topic
        service = ReplicationService(topics, "c")
        service.carriers.wait_s = 2.0  # far past an ack's round trip, even loaded
        epoch = driver.managed.epoch
        streams = {}

        def stream(shadow):
            q: asyncio.Queue = asyncio.Queue()

            async def batches():
                while (b := await q.get()) is not None:
                    yield b
            streams[shadow] = q
            return service.Replicate(batches(), None).__aiter__()

        async def send(acks, shadow, entries=()):
            batch = replication_pb2.ReplicateBatch(
                shadow=shadow, source=str(SOURCE), batch_id=1, source_epoch=epoch,
                last_confirmed=src.last_confirmed().to_pb())
            for e in entries:
                batch.entries.add(ledger_id=e.ledger_id, entry_id=e.entry_id,
                                  publish_time=e.publish_ms, raw=e.raw)
            streams[shadow].put_nowait(batch)
            return await asyncio.wait_for(acks.__anext__(), 10)

        await h.append(msgs(0, 5))
        await read_all(sl)  # the WAL is not here: the shadow reads remotely
        a, b = str(TOPIC), str(TOPIC) + "-b"
        acks_a, acks_b = stream(a), stream(b)
        assert (await send(acks_a, a)).want_raw is True
        assert (await send(acks_b, b)).want_raw is False
        raws = msgs(5, 12)
        lid, first = await src.append(raws, wal.request_bytes(raws), sum(map(len, raws)))
        new = await src.read(MessageId(lid, first), 100, 1 << 30)
        before = sl.replicated
        await send(acks_b, b)                 # the id of entries nobody brought yet
        assert sl.replicated == before        # it waits for the carrier's bytes
        await send(acks_a, a, new)            # the carrier brings them: b's id applies
        assert sl.replicated == MessageId(lid, first + 6)
        assert len(service.tail_cache) == 7 and service.carriers.handovers == 0

        raws = msgs(12, 15)                   # now the carrier sends nothing more
        lid, first = await src.append(raws, wal.request_bytes(raws), sum(map(len, raws)))
        await send(acks_b, b)
        assert sl.replicated == MessageId(lid, first - 1)
        await until(lambda: sl.replicated == MessageId(lid, first + 2), 10)
        assert service.carriers.handovers == 1
        assert (await send(acks_b, b)).want_raw is True   # b carries from here on
        assert (await send(acks_a, a)).want_raw is False
        calls = sl.remote_tail.calls
        got = await sl.read(MessageId(lid, first), 100, 1 << 30)
        assert [e.raw for e in got] == raws and sl.remote_tail.calls > calls  # from the owner
        for q in streams.values():
            q.put_nowait(None)
    run(tmp_path, True, body)


def test_what_a_shadow_read_from_the_owner_serves_the_next_read_from_the_cache(tmp_path):
    """Entries fetched with ReadEntries go to the broker's tail cache: the next read of the
    range (another subscription, another shadow of the source) makes no call."""
    async def body(h):
        sl, src = h.view, h.shadow.source
        sl.remote_tail.cache = cache = TailCache()
        await h.append(msgs(0, 8))
        first = await read_all(sl)
        assert first == await read_all(src) and len(cache) == 8
        calls = sl.remote_tail.calls
        assert await read_all(sl) == first
        assert sl.remote_tail.calls == calls and cache.hits >= 8
    run(tmp_path, True, body)
