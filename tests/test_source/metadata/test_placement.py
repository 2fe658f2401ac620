"""Placement by load (source/metadata/placement.py) over the in-memory metadata store: the
least loaded live broker with the role gets a topic nobody owns (topics, then subscriptions,
then the topic's rendezvous rank), ownership records count at once, partitions spread, and
when an owner's lease expires the topic goes to the least loaded broker still alive."""
from __future__ import annotations

import asyncio

from shadowtopic.broker.ownership import BrokerSession
from shadowtopic.core.names import TopicName
from shadowtopic.metadata import MemoryStore, keys
from shadowtopic.metadata.placement import RecentPicks, pick_broker, pick_source, rank
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

C = "c"


async def _register(store, broker_id: str, roles=("shadow",), topics=0, subs=0,
                    wal_objects=False) -> int:
    lease = await store.grant_lease(30)
    info = mpb.BrokerInfo(broker_id=broker_id, url=f"127.0.0.1:{len(broker_id)}",
                          roles=list(roles), topics=topics, subscriptions=subs,
                          wal_objects=wal_objects)
    await store.put(keys.broker(C, broker_id), info.SerializeToString(), lease=lease)
    return lease


async def _own(store, topic: TopicName, broker_id: str, lease: int) -> None:
    own = mpb.Ownership(broker_id=broker_id, broker_url="x", epoch=1)
    await store.put(keys.ownership(C, topic), own.SerializeToString(), lease=lease)


def _t(name: str) -> TopicName:
    return TopicName.parse(f"persistent://t/ns/{name}")


def test_fewest_topics_then_subscriptions_then_id():
    async def body():
        store = MemoryStore()
        await _register(store, "b", topics=1, subs=0)
        await _register(store, "c", topics=0, subs=5)
        await _register(store, "d", topics=0, subs=2)
        await _register(store, "a", roles=("source",))   # not a shadow broker
        assert (await pick_broker(store, C, "shadow", _t("x"))).broker_id == "d"
        await _register(store, "e", topics=0, subs=2)
        await _register(store, "f", topics=0, subs=2)
        # a tie: the topic's rendezvous rank decides, the same answer for every asker
        tied = {"d", "e", "f"}
        want = min(tied, key=lambda b: rank(b, _t("x")))
        assert (await pick_broker(store, C, "shadow", _t("x"))).broker_id == want
        assert (await pick_broker(store, C, "shadow", _t("x"))).broker_id == want
        assert {(await pick_broker(store, C, "shadow", _t(f"y{i}"))).broker_id
                for i in range(30)} == tied
        assert await pick_broker(store, C, "compaction", _t("x")) is None
        await store.close()
    asyncio.run(body())


def test_owned_topics_count_before_the_next_load_report_so_placements_spread():
    async def body():
        store = MemoryStore()
        leases = {b: await _register(store, b) for b in ("s1", "s2")}
        placed = []
        for i in range(4):  # a partitioned shadow: each partition placed on its own
            topic = _t(f"sh-partition-{i}")
            b = await pick_broker(store, C, "shadow", topic)
            await _own(store, topic, b.broker_id, leases[b.broker_id])
            placed.append(b.broker_id)
        # each placement counts at once: the one after a placement goes to the other broker
        assert placed[0] != placed[1] and placed[2] != placed[3], placed
        await store.close()
    asyncio.run(body())


def test_partitions_placed_in_the_same_instant_spread_over_tied_brokers():
    """Nothing is owned yet when the replicators of a partitioned shadow all ask at once:
    the loads are equal, and the partitions still do not all go to one broker."""
    async def body():
        store = MemoryStore()
        for b in ("s1", "s2", "s3"):
            await _register(store, b)
        picks = await asyncio.gather(*(pick_broker(store, C, "shadow", _t(f"sh-partition-{i}"))
                                       for i in range(12)))
        counts = {b: sum(p.broker_id == b for p in picks) for b in ("s1", "s2", "s3")}
        assert all(counts.values()), counts
        assert max(counts.values()) <= 8, counts
        await store.close()
    asyncio.run(body())


def test_when_the_owner_dies_the_least_loaded_live_broker_takes_the_topic():
    async def body():
        store = MemoryStore()
        leases = {b: await _register(store, b) for b in ("s1", "s2", "s3")}
        await _own(store, _t("busy"), "s3", leases["s3"])
        await _own(store, _t("sh"), "s1", leases["s1"])
        await store.revoke_lease(leases["s1"])  # s1 dies: its registration and ownership go
        assert await store.get(keys.ownership(C, _t("sh"))) is None
        assert (await pick_broker(store, C, "shadow", _t("sh"))).broker_id == "s2"
        await store.close()
    asyncio.run(body())


def test_a_shadow_broker_answering_a_lookup_names_the_least_loaded_not_itself():
    async def body():
        store = MemoryStore()
        s1 = BrokerSession(store, C, "s1", "127.0.0.3:1", ["shadow"], ttl=5)
        await s1.start()
        await s1.wait_ready(10)
        other = await _register(store, "s2")
        await _own(store, _t("a"), "s1", s1.lease)
        picked = await s1.serving(_t("b"), "shadow")
        assert picked.broker_id == "s2"
        await store.revoke_lease(other)
        assert (await s1.serving(_t("b"), "shadow")).broker_id == "s1"
        assert (await s1.serving(_t("src"), "source")) is None  # no source broker
        await s1.stop()
        await store.close()
    asyncio.run(body())


def test_picks_of_one_process_made_at_once_spread_exactly():
    """With the process's RecentPicks (the source broker's replicators starting together),
    each pick counts until its ownership record is there: 4 shadows on 2 brokers, 2 each;
    a topic picked again before it is owned keeps its broker."""
    async def body():
        store = MemoryStore()
        leases = {b: await _register(store, b) for b in ("s1", "s2")}
        recent = RecentPicks()
        topics = [_t(f"sh-{i}") for i in range(4)]
        picks = await asyncio.gather(*(pick_broker(store, C, "shadow", t, recent)
                                       for t in topics))
        ids = [p.broker_id for p in picks]
        assert sorted(ids) == ["s1", "s1", "s2", "s2"], ids
        again = await pick_broker(store, C, "shadow", topics[0], recent)
        assert again.broker_id == ids[0]
        # once owned, a pick is no longer pending: the records count instead
        for t, b in zip(topics, ids):
            await _own(store, t, b, leases[b])
        await pick_broker(store, C, "shadow", _t("next"), recent)
        assert len(recent) == 1  # only "next" is pending now
        await store.close()
    asyncio.run(body())


def test_asking_again_does_not_keep_a_pick_that_never_became_ownership():
    """A shadow picked for a broker that never takes it (it refuses it: load shedding) is
    asked for again and again; the pick still expires and the next one is by load."""
    async def body():
        store = MemoryStore()
        for b in ("s1", "s2"):
            await _register(store, b)
        recent = RecentPicks(pending_s=0.3)
        topic = _t("sh")
        first = (await pick_broker(store, C, "shadow", topic, recent)).broker_id
        other = _t("other")  # placed on the other broker meanwhile: now the loads are equal
        await pick_broker(store, C, "shadow", other, recent)
        for _ in range(4):  # asked again every 0.05 s: the same broker while the pick holds
            assert (await pick_broker(store, C, "shadow", topic, recent)).broker_id == first
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.15)  # 0.35 s after the first pick, 0.15 s after the last ask
        assert len(recent.pending(set(), C)) == 0  # expired, though asked again
        await store.close()
    asyncio.run(body())


def test_a_source_topic_stays_with_the_asked_broker_unless_another_serves_clearly_fewer():
    async def body():
        store = MemoryStore()
        src = ("source",)
        await _register(store, "me", roles=src, topics=1, wal_objects=True)
        assert await pick_source(store, C, _t("x"), "me") is None  # the only source broker
        leases = {"other": await _register(store, "other", roles=src, topics=0,
                                           wal_objects=True)}
        await _register(store, "shadowy", roles=("shadow",), topics=0)  # not a source broker
        await _register(store, "local", roles=src, topics=0)  # its WAL is its own disk's
        await store.put(keys.broker(C, "junk"), b"\xff not a record")  # counts for nobody
        assert await pick_source(store, C, _t("x"), "me") is None  # one topic more: stays
        await _register(store, "me", roles=src, topics=2, wal_objects=True)
        picked = await pick_source(store, C, _t("x"), "me")
        assert picked is not None and picked.broker_id == "other"
        # ownership records count at once: two topics just taken by "other" even it out
        for name in ("o1", "o2"):
            await _own(store, _t(name), "other", leases["other"])
        assert await pick_source(store, C, _t("x"), "me") is None
        # a topic "me" just gave up (load shedding) goes to another, whatever the margin
        leaving = await pick_source(store, C, _t("x"), "me", leaving=True)
        assert leaving is not None and leaving.broker_id == "other"
        assert await pick_source(store, C, _t("x"), "stranger") is None  # not registered
        # its lease ends (the broker died): its records and registration go, "me" keeps it
        await store.revoke_lease(leases["other"])
        assert await pick_source(store, C, _t("x"), "me") is None
        assert await pick_source(store, C, _t("x"), "me", leaving=True) is None  # nowhere
        await store.close()
    asyncio.run(body())
