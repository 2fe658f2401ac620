"""The broker-wide entry cache (source/ledger/entry_cache.py): one budget for the entries
every topic holds, least recently used evicted first; evicted entries of an open ledger are
read back from its WAL (only the frames needed, CRC-checked), of sealed ledgers from
Parquet, byte-identical either way."""
from __future__ import annotations

import asyncio
import os
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.fakes import Count, Outbox

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import wal
from shadowtopic.ledger.entry_cache import EntryCache
from shadowtopic.ledger.ledger_reader import LedgerListReader
from shadowtopic.ledger.managed import LedgerConfig, ManagedLedger
from shadowtopic.ledger.memory_view import MemoryView
from shadowtopic.ledger.sealed import SealedLedger
from shadowtopic.ledger.storage import Storage
from shadowtopic.ledger.view import ReadEntry
from shadowtopic.metadata import keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import common_pb2
from shadowtopic.read.encodings import Encodings
from shadowtopic.read.engine import ReadEngine, TopicReaders
from shadowtopic.read.positions import Start

TOPICS = [TopicName.parse(f"persistent://t/ns/cache-{i}") for i in range(3)]
MAX_BATCH_BYTES = 8 * 600  # the largest batch the tests append (one WAL frame)
FIRST = MessageId(0, 0)  # entry 0 of ledger 0: where the read_all helper starts by default


class Env:
    """ManagedLedgers of several topics over one MemoryStore, one storage root and one
    EntryCache (as a broker has)."""

    def __init__(self, tmp_path, limit: int):
        self.store = MemoryStore()
        self.storage = Storage(str(tmp_path / "storage"))
        self.executor = ThreadPoolExecutor(4)
        self.cache = EntryCache(limit)
        self.epoch = 0

    async def open(self, topic: TopicName, cache: EntryCache | None = None,
                   **cfg) -> ManagedLedger:
        self.epoch += 1
        own_key = keys.ownership("c", topic)
        value = mpb.Ownership(broker_id="b", epoch=self.epoch).SerializeToString()
        await self.store.put(own_key, value)
        return await ManagedLedger.open(topic, self.store, self.storage, own_key, value,
                                        self.epoch, self.executor, LedgerConfig(**cfg),
                                        entry_cache=cache or self.cache)


def _raws(rng: random.Random, tag: str, n: int) -> list[bytes]:
    """Distinct, incompressible-ish entries of 1..600 bytes."""
    return [f"{tag}:{i}:".encode() + rng.randbytes(rng.randint(1, 580)) for i in range(n)]


async def _append(ml: ManagedLedger, raws: list[bytes]) -> tuple[int, int]:
    return await ml.append(raws, wal.request_bytes(raws), sum(map(len, raws)))


async def _read_all(ml, start=FIRST, n=37, max_bytes=1 << 30) -> list[ReadEntry]:
    """Read in small steps (many reads start inside a frame or straddle memory / WAL)."""
    out, pos = [], start
    while True:
        got = await ml.read(pos, n, max_bytes)
        if not got:
            return out
        out += got
        pos = MessageId(got[-1].ledger_id, got[-1].entry_id + 1)


def _held(ml: ManagedLedger) -> int:
    """Bytes really held: raws of the unsealed ledgers in memory + the reader's frames."""
    tails = sum(t.held() for t in ml.tails.values())
    frames = sum(len(r) for per in ml.reader._frames.values() for _p, raws, _i in per.values()
                 for r in raws)
    return tails + frames


# ---- the budget itself ---------------------------------------------------------------------

def test_budget_evicts_least_recently_used_first_and_stays_within_limit():
    cache = EntryCache(1000)
    evicted = []
    a = cache.charge(400, evicted.append, "a")
    b = cache.charge(400, evicted.append, "b")
    cache.touch(a)                          # a is now the most recently used
    c = cache.charge(300, evicted.append, "c")
    assert [i.data for i in evicted] == ["b"] and not b.live and a.live and c.live
    assert cache.held == 700 and cache.peak <= 1000
    cache.grow(c, 500)                      # 1200 > 1000: a (least recently used) goes
    assert [i.data for i in evicted] == ["b", "a"] and cache.held == 800
    cache.release(c)
    assert cache.held == 0 and len(cache) == 0 and not c.live
    d = cache.charge(100, evicted.append, "d")
    big = cache.charge(5000, evicted.append, "big")  # larger than the budget: dropped at once
    assert not big.live and d.live and cache.held == 100   # ... and alone
    assert cache.stats()["evicted_bytes"] == 400 + 400 + 5000
    zero = EntryCache(0)
    assert not zero.charge(1, evicted.append).live and zero.held == 0


# ---- open ledgers under a shared budget ----------------------------------------------------

def test_topics_share_one_budget_and_every_entry_reads_back_identical(tmp_path, arun):
    async def main():
        env = Env(tmp_path, limit=64 << 10)
        mls = [await env.open(t) for t in TOPICS]
        rng = random.Random(7)
        sent: dict[int, list[bytes]] = {i: [] for i in range(len(mls))}
        worst = 0
        for step in range(240):
            i = rng.randrange(len(mls))
            raws = _raws(rng, f"{i}-{step}", rng.randint(1, 8))
            await _append(mls[i], raws)
            sent[i] += raws
            held = sum(_held(ml) for ml in mls)
            assert env.cache.held == held, "the cache's count is not what is held"
            worst = max(worst, held)
        assert worst <= env.cache.limit + MAX_BATCH_BYTES
        assert env.cache.peak <= env.cache.limit
        total = sum(sum(map(len, v)) for v in sent.values())
        assert total > 4 * env.cache.limit and env.cache.evicted_bytes > 0
        tails = [ml.tails[ml.current_ledger[0]] for ml in mls]
        assert all(t.offset > 0 and t.held() > 0 for t in tails)
        # one budget across topics, oldest first: writing only to topic 0 takes the others'
        # memory (a budget per topic would leave theirs alone)
        hot = 0
        while hot < 2 * env.cache.limit:
            raws = _raws(rng, "hot", 4)
            await _append(mls[0], raws)
            sent[0] += raws
            hot += sum(map(len, raws))
        assert tails[1].held() == 0 and tails[2].held() == 0 and tails[0].held() > 0
        for i, ml in enumerate(mls):
            got = await _read_all(ml)
            assert [e.raw for e in got] == sent[i]
            assert [e.entry_id for e in got] == list(range(len(sent[i])))
            assert env.cache.held <= env.cache.limit  # the frames re-read are charged too
            assert env.cache.held == sum(_held(m) for m in mls)
        for ml in mls:
            await ml.close()
        assert env.cache.held == 0, "closed ledgers still count against the budget"

    arun(main(), timeout=60)


def test_evicted_entries_are_read_from_only_the_frames_needed(tmp_path, arun, monkeypatch):
    async def main():
        env = Env(tmp_path, limit=0)        # nothing stays in memory
        ml = await env.open(TOPICS[0])
        rng = random.Random(1)
        sent = []
        for b in range(100):
            raws = _raws(rng, f"b{b}", 5)
            await _append(ml, raws)
            sent += raws
        lid = ml.current_ledger[0]
        tail = ml.tails[lid]
        assert tail.offset == len(sent) and tail.held() == 0 and len(tail.frames) == 100
        spans = []
        real = wal.read_frames

        def recording(path, wanted):
            spans.extend(wanted)
            return real(path, wanted)

        monkeypatch.setattr(wal, "read_frames", recording)
        monkeypatch.setattr(wal, "recover", None)  # never the whole WAL
        got = await ml.read(MessageId(lid, 252), 6, 1 << 20)
        assert [e.raw for e in got] == sent[252:258]
        assert [e.entry_id for e in got] == list(range(252, 258))
        wal_size = os.path.getsize(tail.wal_path)
        assert sum(stop - start for start, stop in spans) < wal_size // 20
        assert len(spans) == 1  # frames 50 and 51, one contiguous read
        assert await ml.position_at_time(0) == MessageId(lid, 0)
        await ml.close()

    arun(main())


def test_a_damaged_frame_of_an_evicted_entry_is_a_checksum_error(tmp_path, arun):
    async def main():
        env = Env(tmp_path, limit=0)
        ml = await env.open(TOPICS[0])
        for b in range(4):
            await _append(ml, [f"entry-{b}-{i}".encode() * 20 for i in range(3)])
        lid = ml.current_ledger[0]
        tail = ml.tails[lid]
        start, stop = tail.frames.span(1)   # entries 3..5
        with open(tail.wal_path, "r+b") as f:
            f.seek(stop - 5)
            byte = f.read(1)
            f.seek(stop - 5)
            f.write(bytes([byte[0] ^ 0xFF]))
        assert len(await ml.read(MessageId(lid, 0), 3, 1 << 20)) == 3  # frame 0 is intact
        with pytest.raises(errors.ChecksumError):
            await ml.read(MessageId(lid, 4), 1, 1 << 20)
        await ml.close()

    arun(main())


def test_sealing_after_eviction_writes_every_entry(tmp_path, arun):
    async def main():
        env = Env(tmp_path, limit=16 << 10)
        ml = await env.open(TOPICS[0])
        other = await env.open(TOPICS[1])
        rng = random.Random(3)
        sent = []
        for b in range(60):
            raws = _raws(rng, f"s{b}", 4)
            await _append(ml, raws)
            sent += raws
            await _append(other, _raws(rng, f"o{b}", 2))  # competes for the budget
        tail = ml.tails[ml.current_ledger[0]]
        assert 0 < tail.offset < len(sent), "want a ledger partly in memory, partly evicted"
        info = await ml.roll()
        assert info.state == mpb.SEALED and info.entries == len(sent)
        assert info.size_bytes == sum(map(len, sent))
        reader = SealedLedger(env.storage.fs, env.storage.full(info.path), info.crc32c)
        pubs, raws = reader.read(0, len(sent) + 10, 1 << 30)
        assert raws == sent and len(pubs) == len(sent)
        assert [e.raw for e in await _read_all(ml)] == sent      # from Parquet now
        assert not os.path.exists(tail.wal_path)
        assert info.ledger_id not in ml.tails and tail.held() == 0
        more = _raws(rng, "after", 5)
        await _append(ml, more)
        got = await _read_all(ml)
        assert [e.raw for e in got] == sent + more               # Parquet, then memory
        await ml.close()
        await other.close()

    arun(main())


def test_rollovers_under_load_seal_every_entry(tmp_path, arun):
    """Ledgers roll by entries while appends, reads and evictions run concurrently."""
    async def main():
        env = Env(tmp_path, limit=8 << 10)
        ml = await env.open(TOPICS[0], max_entries=100)
        rng = random.Random(19)
        batches = [_raws(rng, f"r{b}", 7) for b in range(150)]
        reads = []

        async def reader():
            for _ in range(30):
                reads.append(await _read_all(ml, n=50))
                await asyncio.sleep(0)

        results, _ = await asyncio.gather(
            asyncio.gather(*[_append(ml, raws) for raws in batches]), reader())
        assert results == sorted(results)
        sent = [r for raws in batches for r in raws]
        for _ in range(100):
            if all(i.state == mpb.SEALED for i in ml.ledgers()[:-1]):
                break
            await asyncio.sleep(0.05)
        infos = ml.ledgers()
        assert len(infos) >= 10 and sum(i.entries for i in infos) == len(sent)
        assert all(i.state == mpb.SEALED for i in infos[:-1])
        assert [e.raw for e in await _read_all(ml)] == sent
        for got in reads:  # every concurrent read saw a prefix of what was sent
            assert [e.raw for e in got] == sent[:len(got)]
        assert env.cache.held <= env.cache.limit
        await ml.close()

    arun(main(), timeout=60)


def test_reads_straddle_parquet_wal_and_memory(tmp_path, arun):
    async def main():
        env = Env(tmp_path, limit=6 << 10)
        ml = await env.open(TOPICS[0])
        rng = random.Random(5)
        sent = []
        for b in range(10):
            raws = _raws(rng, f"p{b}", 5)
            await _append(ml, raws)
            sent += raws
        await ml.roll()
        for b in range(40):
            raws = _raws(rng, f"w{b}", 3)
            await _append(ml, raws)
            sent += raws
        tail = ml.tails[ml.current_ledger[0]]
        assert 0 < tail.offset < len(tail)
        for n in (1, 7, 50, 1000):
            got = await _read_all(ml, n=n)
            assert [e.raw for e in got] == sent
        # a byte limit cuts a read that crosses from the WAL into memory as before
        lid = ml.current_ledger[0]
        got = await ml.read(MessageId(lid, tail.offset - 2), 100, 1)
        assert len(got) == 1 and got[0].raw == sent[50 + tail.offset - 2]
        await ml.close()

    arun(main())


def test_a_crash_after_eviction_recovers_every_entry(tmp_path, arun):
    async def main():
        env = Env(tmp_path, limit=8 << 10)
        ml = await env.open(TOPICS[0])
        rng = random.Random(11)
        sent = []
        for b in range(50):
            raws = _raws(rng, f"c{b}", 3)
            await _append(ml, raws)
            sent += raws
        lid = ml.current_ledger[0]
        assert ml.tails[lid].offset > 0
        # the owner dies without closing; a new owner (its own cache) recovers the WAL
        ml2 = await env.open(TOPICS[0], cache=EntryCache(8 << 10))
        infos = ml2.ledgers()
        assert infos[0].ledger_id == lid and infos[0].state == mpb.SEALED
        assert infos[0].entries == len(sent)
        assert [e.raw for e in await _read_all(ml2)] == sent
        more = _raws(rng, "new", 200)
        for k in range(0, 200, 4):
            await _append(ml2, more[k:k + 4])
        assert ml2.entry_cache.held <= ml2.entry_cache.limit
        assert [e.raw for e in await _read_all(ml2)] == sent + more
        await ml2.close()

    arun(main())


def test_a_reader_without_the_writers_memory_bounds_its_wal_frames(tmp_path, arun):
    """A reader with no tail (a shadow's) scans the WAL's frame headers and keeps decoded
    frames within its cache; it never serves beyond the confirmed count."""
    async def main():
        env = Env(tmp_path, limit=1 << 20)
        ml = await env.open(TOPICS[0])
        rng = random.Random(13)
        sent = []
        for b in range(30):
            raws = _raws(rng, f"r{b}", 4)
            await _append(ml, raws)
            sent += raws
        lid = ml.current_ledger[0]
        confirmed = {lid: 100}
        cache = EntryCache(4 << 10)
        reader = LedgerListReader(env.storage, env.executor,
                                  lambda: ml.ledger_list.current.ledgers,
                                  confirmed=lambda info: confirmed.get(info.ledger_id, 0),
                                  cache=cache)
        got = await _read_all(reader, n=9)
        assert [e.raw for e in got] == sent[:100]
        assert cache.held <= cache.limit and cache.evictions > 0
        confirmed[lid] = 120
        got = await reader.read(MessageId(lid, 100), 100, 1 << 20)
        assert [e.raw for e in got] == sent[100:120]
        times = [e.publish_ms for e in got]
        assert await reader.position_at_time(times[-1] + 60_000) is None
        reader.forget(lid)
        assert cache.held == 0
        await ml.close()

    arun(main())


# ---- the read engine's encoded entries -----------------------------------------------------

class _Owner:
    def rehome(self, tr):
        pass

    def fail(self, member, error):
        pass

    def counters(self, topic):
        return None


def test_encoded_entries_count_against_the_budget(tmp_path, arun):
    async def main():
        cache = EntryCache(20_000)
        view = MemoryView()
        view.entry_cache = cache
        tr = TopicReaders(_Owner(), TOPICS[0], view)
        entries = [ReadEntry(1, i, 5, b"x" * 1000) for i in range(10)]
        encoded = tr.encoded(entries)
        assert len(encoded) == 10 and cache.held == sum(map(len, encoded))
        held = tr._encodings
        # another topic's entries take the budget: this topic's encodings are evicted
        other = cache.charge(19_000, lambda item: None)
        assert other.live and cache.held == 19_000 and len(held) == 0
        again = tr.encoded(entries[:2])       # encoded afresh, charged again (other goes)
        assert again == encoded[:2] and cache.held == sum(map(len, again)) and not other.live
        tr.drop_encodings()
        assert cache.held == 0 and len(cache) == 0

    arun(main())


def test_readers_from_earliest_read_everything_under_a_tiny_budget(tmp_path, arun,
                                                                   monkeypatch):
    evicted = []
    real = Encodings.evicted
    monkeypatch.setattr(Encodings, "evicted",
                        lambda self, item: (evicted.append(item), real(self, item)))

    async def main():
        env = Env(tmp_path, limit=32 << 10)
        mls = {t: await env.open(t) for t in TOPICS[:2]}
        rng = random.Random(17)
        sent = {t: [] for t in mls}
        for b in range(60):
            for t, ml in mls.items():
                raws = [common_pb2.Message(payload=r).SerializeToString()
                        for r in _raws(rng, f"{t}{b}", 5)]
                await _append(ml, raws)
                sent[t] += raws

        async def resolve(topic):
            return mls[topic]

        engine = ReadEngine(resolve, lambda topic: Count())
        outboxes = {}
        for h, t in enumerate(mls):
            outboxes[t] = Outbox(raise_errors=True)
            reader, _last = await engine.open(outboxes[t], h, t, Start())
            engine.flow(reader, 1 << 20)
        for _ in range(250):
            if all(len(outboxes[t].raws()) >= len(sent[t]) for t in mls):
                break
            await asyncio.sleep(0.02)
        for t in mls:
            assert outboxes[t].raws() == sent[t]
        assert env.cache.held <= env.cache.limit and env.cache.evictions > 0
        encoded = engine.encodings.encoded_bytes
        assert env.cache.held == sum(_held(ml) for ml in mls.values()) + encoded
        assert any(item is not None for item in evicted), "encodings were never charged"
        for ml in mls.values():
            await ml.close()

    arun(main(), timeout=60)
