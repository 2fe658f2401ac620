"""A broker's registration in etcd (source/broker/ownership.py `BrokerSession`): its load
is rewritten when it changes, and a registration whose write failed is made again (before,
the lease granted stayed and was kept alive with no registration under it)."""
from __future__ import annotations

import asyncio

from shadowtopic.broker.ownership import BrokerSession, topics_load
from shadowtopic.metadata import MemoryStore, MetadataUnavailable, keys
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb


class FlakyPut(MemoryStore):
    """A MemoryStore whose next `fail_puts` puts fail as an unavailable etcd's do."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_puts = 0

    async def put(self, key, value, lease=0):
        if self.fail_puts:
            self.fail_puts -= 1
            raise MetadataUnavailable("etcd away")
        return await super().put(key, value, lease)


async def _registered(store, deadline: float = 10.0) -> mpb.BrokerInfo:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while (kv := await store.get(keys.broker("c", "b1"))) is None:
        assert loop.time() < end, "never registered"
        await asyncio.sleep(0.02)
    return mpb.BrokerInfo.FromString(kv.value)


def test_the_registration_carries_the_load_and_follows_it():
    async def body():
        store = MemoryStore()
        load = [3, 7]
        s = BrokerSession(store, "c", "b1", "127.0.0.1:1", ["source"], ttl=1)
        s.load = lambda: tuple(load)
        s.load_interval = 0.1
        await s.start()
        try:
            info = await _registered(store)
            assert (info.topics, info.subscriptions) == (3, 7) and info.load_ms > 0
            lease = s.lease
            load[:] = [4, 9]
            for _ in range(100):  # written after a later keepalive (every ttl/4)
                info = await _registered(store)
                if (info.topics, info.subscriptions) == (4, 9):
                    break
                await asyncio.sleep(0.05)
            assert (info.topics, info.subscriptions) == (4, 9)
            assert (await store.get(keys.broker("c", "b1"))).lease == lease == s.lease
        finally:
            await s.stop()
    asyncio.run(body())


def test_a_registration_whose_write_failed_is_made_again():
    async def body():
        store = FlakyPut()
        store.fail_puts = 1  # the first registration's write fails after its lease
        s = BrokerSession(store, "c", "b1", "127.0.0.1:1", ["source"], ttl=1)
        await s.start()
        try:
            info = await _registered(store)
            assert info.broker_id == "b1"
            kv = await store.get(keys.broker("c", "b1"))
            assert kv.lease == s.lease != 0
            await s.wait_ready(5)
        finally:
            await s.stop()
    asyncio.run(body())


def test_topics_load_counts_topics_and_their_subscriptions():
    class Subs:
        def __init__(self, n):
            self.subs = {f"s{i}": None for i in range(n)}

    class T:
        def __init__(self, n):
            self.subscriptions = Subs(n) if n is not None else None

    assert topics_load([T(2), T(None), T(5)]) == (3, 7)
    assert topics_load([]) == (0, 0)
