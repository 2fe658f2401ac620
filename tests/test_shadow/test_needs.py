"""Shadows' needs (shadow/needs.py) and the source side of policy
`retention_keeps_shadow_backlog` (source/ledger/retention.py, ShadowFeature._shadow_needs
(shadow/feature.py)): the pure rules, the key schema, the policy's validation, and the publisher
and the retention read against the metadata twin."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from shadowtopic.broker.config import BrokerConfig
from shadowtopic.cli.commands import _policies
from shadowtopic.cli.main import build_parser
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import BOOL_FIELDS, DEFAULTS, RANGES, Policies
from shadowtopic.ledger import retention
from shadowtopic.metadata import keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.shadow.feature import ShadowFeature
from shadowtopic.shadow.needs import UNSET, NeedsPublisher, must_write, to_publish

M = MessageId
SRC = TopicName.parse("persistent://t/n/src")
SH = TopicName.parse("persistent://t/n/src-shadow")


# ---- pure rules -----------------------------------------------------------------------------

def test_earliest_keeps_from_the_earlier_position_and_none_is_nothing_to_keep():
    assert retention.earliest(None, None) is None
    assert retention.earliest(M(3, 4), None) == M(3, 4)
    assert retention.earliest(None, M(3, 4)) == M(3, 4)
    assert retention.earliest(M(3, 4), M(2, 9)) == M(2, 9)
    assert retention.earliest(M(3, 4), M(3, 1)) == M(3, 1)
    assert retention.earliest(M(3, 4, 2), M(5, 0)) == M(3, 4)  # no partition inside a topic


def test_a_need_is_stored_as_l_e_and_damaged_ones_do_not_parse():
    assert retention.encode_need(M(12, 345)) == b"12:345"
    assert retention.parse_need(b"12:345") == M(12, 345)
    for bad in (b"", b"x", b"1:-1", b"1:2:3:4", b"\xff"):
        assert retention.parse_need(bad) is None


def test_shadow_keep_from_counts_current_shadows_only():
    a, b, gone = (TopicName.parse(f"t/n/{x}") for x in ("a", "b", "gone"))
    needs = [(a, b"5:10"), (b, b"4:2"), (gone, b"1:0"), (None, b"0:0")]
    assert retention.shadow_keep_from(needs, {a, b}) == M(4, 2)
    assert retention.shadow_keep_from(needs, {a}) == M(5, 10)
    assert retention.shadow_keep_from(needs, set()) is None
    assert retention.shadow_keep_from([(a, b"junk"), (b, b"7:0")], {a, b}) == M(7, 0)


def test_retention_keeps_from_the_ledger_of_the_shadows_need():
    def led(i, state=mpb.LedgerState.SEALED):
        return mpb.LedgerInfo(ledger_id=i, state=state, entries=10, size_bytes=100,
                              last_publish_ms=1)
    ledgers = [led(1), led(2), led(3), led(4, mpb.LedgerState.OPEN)]
    size = lambda i: i.size_bytes  # noqa: E731
    assert [i.ledger_id for i in retention.victims(ledgers, size, 10, -1, None)] == [1, 2, 3]
    own, shadows = M(3, 0), M(2, 5)
    keep = retention.earliest(own, shadows)
    assert [i.ledger_id for i in retention.victims(ledgers, size, 10, -1, keep)] == [1]


def test_to_publish_moves_back_at_once_and_forward_one_tick_late():
    assert to_publish(UNSET, None) is None
    assert to_publish(UNSET, M(2, 0)) == M(2, 0)
    assert to_publish(M(2, 0), M(3, 0)) == M(2, 0)      # forward: last tick's (flushed)
    assert to_publish(M(3, 0), M(1, 0)) == M(1, 0)      # back: now
    assert to_publish(None, M(1, 0)) == M(1, 0)         # a new subscription: now
    assert to_publish(M(1, 0), None) == M(1, 0)         # the last one went: one tick late
    assert must_write(UNSET, None) and must_write(None, M(1, 0))
    assert not must_write(M(1, 0), M(1, 0)) and not must_write(None, None)


# ---- keys -----------------------------------------------------------------------------------

def test_the_need_key_is_under_the_sources_prefix_and_names_the_shadow():
    k = keys.shadow_needs(SRC, SH)
    assert k == "/shadowtopic/topics/persistent/t/n/src/shadow-needs/persistent/t/n/src-shadow"
    assert k.startswith(keys.topic_prefix(SRC)) and k.startswith(keys.shadow_needs_prefix(SRC))
    assert keys.shadow_from_needs_key(SRC, k) == SH
    p = keys.shadow_needs(SRC.partition(2), SH.partition(2))
    assert p.startswith(keys.topic_prefix(SRC.partition(2)))
    assert keys.shadow_from_needs_key(SRC.partition(2), p) == SH.partition(2)
    assert keys.shadow_from_needs_key(SRC, p) is None
    assert keys.shadow_from_needs_key(SRC, keys.shadow_needs_prefix(SRC) + "persistent/a/b") \
        is None


# ---- the policy -----------------------------------------------------------------------------

def test_the_policy_is_a_bool_off_by_default_and_round_trips():
    assert DEFAULTS.retention_keeps_shadow_backlog is False
    assert Policies().effective().retention_keeps_shadow_backlog is False
    assert "retention_keeps_shadow_backlog" in BOOL_FIELDS
    assert set(RANGES) | set(BOOL_FIELDS) == set(DEFAULTS.as_dict())
    p = Policies(retention_keeps_shadow_backlog=True)
    assert Policies.from_pb(p.to_pb()) == p
    assert p.to_pb().HasField("retention_keeps_shadow_backlog")
    assert not Policies(max_consumers=3).to_pb().HasField("retention_keeps_shadow_backlog")
    assert Policies(retention_size_bytes=5).merged(p).effective() \
        .retention_keeps_shadow_backlog is True
    for bad in ("yes", 1, 0, 1.0):
        with pytest.raises(errors.InvalidPolicies) as info:
            Policies(retention_keeps_shadow_backlog=bad).to_pb()
        assert "retention_keeps_shadow_backlog" in info.value.message


@pytest.mark.parametrize("text,value", [("true", True), ("false", False), ("on", True)])
def test_the_cli_flag_sets_the_policy(text, value):
    for cmd in (["topics", "set-policies", "t"], ["topics", "create", "t"]):
        args = build_parser().parse_args([*cmd, "--retention-keeps-shadow-backlog", text])
        assert _policies(args) == Policies(retention_keeps_shadow_backlog=value)


# ---- the publisher against the metadata twin ------------------------------------------------

class FakeSubs:
    def __init__(self, need=None):
        self.need = need
        self.closed = None

    def oldest_needed(self):
        return self.need


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_the_publisher_writes_changes_fenced_and_deletes_when_no_subscription_is_left():
    async def main():
        store = MemoryStore()
        own = ("/own/sh", b"me")
        await store.put(own[0], own[1])
        await store.put(keys.topic_info(SH), b"info")
        key = keys.shadow_needs(SRC, SH)
        await store.put(key, b"1:1")  # left by an older owner
        pub = NeedsPublisher(store, interval=3600)
        subs = FakeSubs()

        async def value():
            kv = await store.get(key)
            return kv.value if kv is not None else None

        need = pub.track(SH, SRC, own, subs)
        assert await pub.tick() == 1 and await value() is None  # none: the old one goes
        assert await pub.tick() == 0                              # unchanged: no write
        subs.need = M(5, 3)
        assert await pub.tick() == 1 and await value() == b"5:3"  # new subscription: at once
        subs.need = M(6, 0)
        assert await pub.tick() == 0 and await value() == b"5:3"  # forward: one tick late
        assert await pub.tick() == 1 and await value() == b"6:0"
        subs.need = M(2, 0)
        assert await pub.tick() == 1 and await value() == b"2:0"  # back (reset): at once
        subs.need = None
        await pub.tick()
        assert await value() == b"2:0"
        await pub.tick()
        assert await value() is None and need.writes == 5

        # a deposed owner writes nothing
        subs.need = M(9, 9)
        await store.put(own[0], b"someone else")
        assert await pub.tick() == 0 and await value() is None and need.failures == 1
        await store.put(own[0], own[1])
        assert await pub.tick() == 1 and await value() == b"9:9"
        # nor does a deleted shadow
        await store.delete(keys.topic_info(SH))
        subs.need = M(8, 0)
        assert await pub.tick() == 0 and await value() == b"9:9"
        # closed subscriptions and untracked topics are left alone
        await store.put(keys.topic_info(SH), b"info")
        subs.closed = errors.TopicNotOwned("x")
        assert await pub.tick() == 0
        subs.closed = None
        pub.untrack(need)
        assert await pub.tick() == 0 and pub.needs == {}
        await pub.close()
    run(main())


def test_the_publisher_task_runs_while_something_is_tracked():
    async def main():
        store = MemoryStore()
        await store.put("/own", b"me")
        await store.put(keys.topic_info(SH), b"info")
        pub = NeedsPublisher(store, interval=0.05)
        need = pub.track(SH, SRC, ("/own", b"me"), FakeSubs(M(3, 0)))
        for _ in range(100):
            if (kv := await store.get(need.key)) is not None:
                break
            await asyncio.sleep(0.02)
        assert kv.value == b"3:0"
        pub.untrack(need)
        await asyncio.sleep(0.2)
        assert pub._task.done()  # nothing tracked: the task ended
        pub.track(SH, SRC, ("/own", b"me"), FakeSubs(None))
        assert not pub._task.done()
        await pub.close()
    run(main())


# ---- the source's read of the needs ---------------------------------------------------------

def _manager(store) -> ShadowFeature:
    feature = ShadowFeature()  # _shadow_needs uses the store only
    feature.bind(SimpleNamespace(store=store, topics=SimpleNamespace(store=store),
                                 config=BrokerConfig()))
    return feature


def test_the_source_reads_the_needs_of_its_listed_shadows_and_removes_deleted_ones():
    async def main():
        store = MemoryStore()
        a, b, gone, back = (TopicName.parse(f"t/n/{x}") for x in ("a", "b", "gone", "back"))
        tm = _manager(store)
        assert await tm._shadow_needs(SRC) is None  # no need at all: the list is not read
        await store.put(keys.shadows(SRC), mpb.ShadowList(
            shadows=[str(a), str(b), str(back)]).SerializeToString())
        await store.put(keys.topic_info(back), b"info")
        for s, v in ((a, b"7:1"), (b, b"6:9"), (gone, b"1:0"), (back, b"9:0")):
            await store.put(keys.shadow_needs(SRC, s), v)
        assert await tm._shadow_needs(SRC) == M(6, 9)
        assert await store.get(keys.shadow_needs(SRC, gone)) is None   # removed
        assert await store.get(keys.shadow_needs(SRC, back)) is not None
        # a shadow taken off the list but whose info exists (being re-created): ignored, kept
        await store.put(keys.shadows(SRC), mpb.ShadowList(shadows=[str(a)]).SerializeToString())
        assert await tm._shadow_needs(SRC) == M(7, 1)
        assert await store.get(keys.shadow_needs(SRC, back)) is not None
    run(main())


def test_a_source_partition_counts_partition_i_of_its_parents_shadows():
    async def main():
        store = MemoryStore()
        tm = _manager(store)
        await store.put(keys.shadows(SRC), mpb.ShadowList(shadows=[str(SH)]).SerializeToString())
        for i in range(2):
            await store.put(keys.topic_info(SH.partition(i)), b"info")
        await store.put(keys.shadow_needs(SRC.partition(0), SH.partition(0)), b"3:0")
        await store.put(keys.shadow_needs(SRC.partition(1), SH.partition(1)), b"4:0")
        await store.put(keys.shadow_needs(SRC.partition(1), SH.partition(0)), b"1:0")  # stray
        assert await tm._shadow_needs(SRC.partition(0)) == M(3, 0)
        assert await tm._shadow_needs(SRC.partition(1)) == M(4, 0)
    run(main())
