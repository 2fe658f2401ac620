"""Encoded entries shared by the views of the same ledgers (source/read/encodings.py): the
shadows of one source on a broker encode each entry once, whatever their number."""
from __future__ import annotations

import asyncio

from support.fakes import Count, Outbox

from shadowtopic import wire
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.entry_cache import EntryCache
from shadowtopic.ledger.memory_view import MemoryView
from shadowtopic.ledger.view import ReadEntry
from shadowtopic.read.encodings import EncodingsPool
from shadowtopic.read.engine import ReadEngine
from shadowtopic.read.positions import Start

SOURCE = TopicName.parse("persistent://public/default/src")
SHADOWS = [TopicName.parse(f"persistent://public/default/src-shadow-{i}") for i in range(4)]


def _counting(monkeypatch) -> list[int]:
    calls = [0]
    real = wire.encode_entry

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(wire, "encode_entry", counted)
    return calls


async def _read_all(views: dict[TopicName, MemoryView], n: int) -> dict[TopicName, Outbox]:
    async def resolve(topic):
        return views[topic]

    engine = ReadEngine(resolve, lambda topic: Count())
    outboxes = {}
    for h, topic in enumerate(views):
        outboxes[topic] = Outbox(raise_errors=True)
        reader, _last = await engine.open(outboxes[topic], h, topic, Start())
        engine.flow(reader, 1 << 20)
    for _ in range(1000):  # 10 s at most
        if all(len(o.raws()) >= n for o in outboxes.values()):
            break
        await asyncio.sleep(0.01)
    return outboxes


def test_shadows_of_one_source_encode_each_entry_once(arun, monkeypatch):
    calls = _counting(monkeypatch)

    async def main():
        source = MemoryView(ledgers_of=SOURCE)
        raws = [f"m{i}".encode() for i in range(300)]
        source.append(raws[:150])
        source.roll()
        source.append(raws[150:])
        # four shadows' views over the source's ledgers, as a shadow broker has them
        views = {t: MemoryView(source._ledgers, ledgers_of=SOURCE) for t in SHADOWS}
        outboxes = await _read_all(views, len(raws))
        for t, o in outboxes.items():
            assert o.raws() == raws, t
            assert o.ids() == outboxes[SHADOWS[0]].ids()
        assert calls[0] == len(raws)

    arun(main())


def test_views_of_other_ledgers_keep_their_own_encodings(arun, monkeypatch):
    calls = _counting(monkeypatch)

    async def main():
        # two topics whose ledgers have the same ids (as MemoryViews do) but other bytes
        a, b = MemoryView(), MemoryView()
        a.append([b"a0", b"a1", b"a2"])
        b.append([b"b0", b"b1", b"b2"])
        outboxes = await _read_all({SHADOWS[0]: a, SHADOWS[1]: b}, 3)
        assert outboxes[SHADOWS[0]].raws() == [b"a0", b"a1", b"a2"]
        assert outboxes[SHADOWS[1]].raws() == [b"b0", b"b1", b"b2"]
        assert calls[0] == 6

    arun(main())


def test_the_last_user_releases_the_shared_charge():
    cache = EntryCache(1 << 20)
    pool = EncodingsPool()
    view = MemoryView(ledgers_of=SOURCE)
    view.entry_cache = cache
    first, second = pool.acquire(view), pool.acquire(view)
    assert first is second and len(pool) == 1
    encoded = first.encode([ReadEntry(7, i, 5, b"x" * 100) for i in range(10)])
    assert cache.held == sum(map(len, encoded)) == pool.encoded_bytes
    pool.release(first)
    assert cache.held == pool.encoded_bytes > 0 and len(second) == 10  # one user is left
    pool.release(second)
    assert cache.held == 0 and len(pool) == 0 and len(second) == 0
    # a later user starts afresh
    third = pool.acquire(view)
    assert third is not first and len(third) == 0
