"""`GenerationReads` (source/broker/topics.py): opens that arrive before a read of their
topic's generation has started share it; an open never takes the answer of a read that
started before it arrived."""
from __future__ import annotations

import asyncio

from shadowtopic.broker.topics import GenerationReads
from shadowtopic.core.names import TopicName
from shadowtopic.metadata import MemoryStore, keys

T = TopicName.parse("persistent://t/ns/x")


class CountingStore(MemoryStore):
    def __init__(self):
        super().__init__()
        self.gets = 0

    async def get(self, key):
        self.gets += 1
        return await super().get(key)


def test_a_burst_of_opens_shares_one_read():
    async def main():
        store = CountingStore()
        await store.put(keys.topic_info(T), b"x")
        reads = GenerationReads(store)
        got = await asyncio.gather(*(reads.read(T) for _ in range(1000)))
        return store.gets, set(got), (await store.get(keys.topic_info(T))).create_revision
    gets, got, revision = asyncio.run(main())
    assert gets == 1 and got == {revision}


def test_an_open_after_a_read_started_waits_for_a_new_one():
    """A topic created again while a read is in flight: an open that arrives then sees the
    new generation, not the in-flight read's answer."""
    async def main():
        store = CountingStore()
        await store.put(keys.topic_info(T), b"first")
        old = (await store.get(keys.topic_info(T))).create_revision
        reads = GenerationReads(store)
        started = asyncio.Event()
        release = asyncio.Event()
        real_get = store.get

        async def slow_get(key):
            value = await real_get(key)
            started.set()
            await release.wait()
            return value
        store.get = slow_get
        first = asyncio.ensure_future(reads.read(T))
        await started.wait()                              # the first read has its answer
        store.get = real_get
        await store.delete(keys.topic_info(T))
        await store.put(keys.topic_info(T), b"again")      # created again meanwhile
        second = asyncio.ensure_future(reads.read(T))
        release.set()
        return old, await first, await second
    old, first, second = asyncio.run(main())
    assert first == old and second != old and second > 0
