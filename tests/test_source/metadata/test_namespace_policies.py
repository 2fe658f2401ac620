"""Namespace policies (source/metadata/namespace_policies.py, source/core/policies.py): the
merge order DEFAULTS <- namespace <- topic, a partition following its parent, setting and
removing fields in the store, the key schema, and the broker's follower of every namespace,
over MemoryStore."""
from __future__ import annotations

import asyncio

import pytest

from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import DEFAULTS, FIELD_NAMES, Policies
from shadowtopic.metadata import MemoryStore, keys, namespace_policies
from shadowtopic.metadata.namespace_policies import NamespaceFollower
from shadowtopic.metadata.policies_record import to_record
from shadowtopic.metadata.topic_info import effective_policies
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

pytestmark = pytest.mark.timeout(60)


# ---- merge order ---------------------------------------------------------------------------

def test_topic_over_namespace_over_defaults_field_by_field():
    ns = Policies(message_ttl_seconds=60, subscription_expiration_seconds=3600,
                  max_producers=2)
    topic = Policies(message_ttl_seconds=5)
    eff = topic.effective(ns)
    assert eff.message_ttl_seconds == 5                     # the topic's own wins
    assert eff.subscription_expiration_seconds == 3600      # the namespace's fills in
    assert eff.max_producers == 2
    assert eff.ledger_max_entries == DEFAULTS.ledger_max_entries  # else the default
    assert set(eff.as_dict()) == set(FIELD_NAMES)


def test_no_namespace_policies_is_the_defaults_under_the_topic():
    topic = Policies(retention_time_seconds=10)
    assert topic.effective() == topic.effective(Policies()) == DEFAULTS.merged(topic)
    assert Policies().effective(Policies(max_consumers=3)).max_consumers == 3


def test_a_topic_value_equal_to_the_default_still_wins_over_the_namespace():
    eff = Policies(message_ttl_seconds=0).effective(Policies(message_ttl_seconds=30))
    assert eff.message_ttl_seconds == 0


def test_without_unsets_and_rejects_unknown_names():
    p = Policies(message_ttl_seconds=5, max_producers=1)
    assert p.without(["message_ttl_seconds"]) == Policies(max_producers=1)
    with pytest.raises(errors.InvalidPolicies, match="no such policy: message_ttl"):
        p.without(["message_ttl"])


# ---- keys ----------------------------------------------------------------------------------

def test_namespace_key_round_trip_and_no_topic_key_is_one():
    key = keys.namespace_policies("t/ns")
    assert key == "/shadowtopic/namespaces/t/ns/policies"
    assert key.startswith(keys.NAMESPACES_PREFIX)
    assert keys.namespace_from_policies_key(key) == "t/ns"
    topic = TopicName("t", "ns", "policies")
    assert keys.namespace_from_policies_key(keys.topic_info(topic)) is None
    assert keys.namespace_from_policies_key(keys.NAMESPACES_PREFIX + "t/policies") is None
    assert not keys.topic_info(topic).startswith(keys.NAMESPACES_PREFIX)


# ---- the store -----------------------------------------------------------------------------

def test_update_sets_merges_removes_and_deletes_the_key_when_empty():
    async def main():
        store = MemoryStore()
        assert await namespace_policies.read(store, "t/ns") == Policies()
        got = await namespace_policies.update(store, "t/ns", Policies(message_ttl_seconds=9))
        assert got == Policies(message_ttl_seconds=9)
        got = await namespace_policies.update(store, "t/ns", Policies(max_producers=1))
        assert got == Policies(message_ttl_seconds=9, max_producers=1)
        assert await namespace_policies.read(store, "t/ns") == got
        assert await namespace_policies.read(store, "t/other") == Policies()
        got = await namespace_policies.update(store, "t/ns", Policies(),
                                              ["message_ttl_seconds"])
        assert got == Policies(max_producers=1)
        await namespace_policies.update(store, "t/ns", Policies(), ["max_producers"])
        assert await store.get(keys.namespace_policies("t/ns")) is None
        # removing what is not set changes nothing and writes nothing
        assert await namespace_policies.update(store, "t/ns", Policies(),
                                               ["max_producers"]) == Policies()
        assert await store.get(keys.namespace_policies("t/ns")) is None
    asyncio.run(main())


def test_update_refuses_bad_values_and_names_before_writing():
    async def main():
        store = MemoryStore()
        with pytest.raises(errors.InvalidPolicies, match="message_ttl_seconds"):
            await namespace_policies.update(store, "t/ns", Policies(message_ttl_seconds=-5))
        with pytest.raises(errors.InvalidPolicies, match="no such policy"):
            await namespace_policies.update(store, "t/ns", Policies(), ["ttl"])
        with pytest.raises(errors.InvalidArgument, match="both set and removed"):
            await namespace_policies.update(store, "t/ns", Policies(max_producers=1),
                                            ["max_producers"])
        assert await store.get(keys.namespace_policies("t/ns")) is None
    asyncio.run(main())


def test_a_value_that_does_not_decode_counts_as_none():
    async def main():
        store = MemoryStore()
        await store.put(keys.namespace_policies("t/ns"), b"\xff\xff not a protobuf")
        return await namespace_policies.read(store, "t/ns")
    assert asyncio.run(main()) == Policies()


def test_effective_policies_of_a_topic_and_of_a_partition():
    async def main():
        store = MemoryStore()
        parent = TopicName.parse("persistent://t/ns/p")
        await store.put(keys.topic_info(parent), mpb.TopicInfo(
            name=str(parent), partitions=2,
            policies=to_record(Policies(max_producers=4))).SerializeToString())
        part = parent.partition(1)
        await store.put(keys.topic_info(part), mpb.TopicInfo(
            name=str(part), partition_of=str(parent), partition_index=1).SerializeToString())
        plain = TopicName.parse("persistent://t/ns/plain")
        await store.put(keys.topic_info(plain), mpb.TopicInfo(
            name=str(plain)).SerializeToString())
        await namespace_policies.update(store, "t/ns", Policies(message_ttl_seconds=7,
                                                                max_producers=1))
        return [await effective_policies(store, t) for t in (parent, part, plain)]
    parent, part, plain = asyncio.run(main())
    assert parent == part                       # a partition follows its parent
    assert part.max_producers == 4 and part.message_ttl_seconds == 7
    assert plain.max_producers == 1 and plain.message_ttl_seconds == 7


# ---- the follower --------------------------------------------------------------------------

async def _until(cond, what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_follower_reports_changed_namespaces_and_retries_a_failed_change():
    async def main():
        store = MemoryStore()
        await namespace_policies.update(store, "t/a", Policies(max_producers=1))
        calls: list[set[str] | None] = []
        fail = {"next": False}

        async def on_change(namespaces):
            if fail["next"]:
                fail["next"] = False
                raise RuntimeError("apply failed")
            calls.append(namespaces)

        f = NamespaceFollower(store, on_change, retry_delay=0.05)
        await f.follower.start()
        try:
            assert calls == [None]  # the first list: any namespace may have changed
            assert f.changes("t/a") == 1 and f.changes("t/b") == 0
            await namespace_policies.update(store, "t/b", Policies(message_ttl_seconds=3))
            await _until(lambda: len(calls) == 2, "the change of t/b")
            assert calls[1] == {"t/b"} and f.changes("t/b") == 1
            await namespace_policies.update(store, "t/a", Policies(), ["max_producers"])
            await _until(lambda: len(calls) == 3, "the removal in t/a")
            assert calls[2] == {"t/a"}
            fail["next"] = True  # this one fails once: the re-list offers it again
            await namespace_policies.update(store, "t/b", Policies(message_ttl_seconds=4))
            await _until(lambda: len(calls) == 4, "the change offered again")
            assert calls[3] == {"t/b"}
            await store.put("/shadowtopic/namespaces/t/b/other", b"x")  # not a policies key
            await asyncio.sleep(0.2)
            assert len(calls) == 4
        finally:
            await f.close()
    asyncio.run(main())
