"""Shadow topic admin without etcd: the checks on names and sources, the transaction plans
(one transaction when it fits, chunks with the parent last otherwise), and `ShadowAdmin` over
the in-memory metadata twin: chunked creation and deletion, concurrent changes (another
shadow of the same source, the source's info changing, the source deleted between chunks),
and a source delete racing a shadow's creation."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from shadowtopic.broker.config import BrokerConfig
from shadowtopic.broker.topic_admin import TopicAdmin
from shadowtopic.broker.topics import TopicManager
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import Policies
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import Delete, Put
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.shadow import admin as sa
from shadowtopic.shadow.admin import create_plan, delete_plan, shadow_infos
from shadowtopic.shadow.feature import ShadowFeature

SRC = TopicName.parse("persistent://t/ns/src")
SHD = TopicName.parse("persistent://t/ns/shd")


# ---- pure checks -----------------------------------------------------------------------------

def test_a_topic_cannot_shadow_itself():
    with pytest.raises(errors.InvalidArgument, match="cannot be a shadow of itself"):
        sa.check_names(SRC, SRC)


def test_a_shadow_cannot_have_a_partition_name():
    with pytest.raises(errors.InvalidTopicName, match="reserved for partitions"):
        sa.check_names(TopicName.parse("t/ns/x-partition-0"), SRC)


def test_the_source_cannot_be_a_partition():
    with pytest.raises(errors.InvalidArgument, match=r"create the shadow of persistent://t/ns/src"):
        sa.check_names(SHD, SRC.partition(2))
    info = mpb.TopicInfo(name=str(SRC.partition(2)), kind=mpb.TopicKind.SOURCE,
                         partition_of=str(SRC), partition_index=2)
    with pytest.raises(errors.InvalidArgument, match="is a partition of"):
        sa.check_source(SRC.partition(2), info)


def test_the_source_cannot_be_a_shadow():
    info = mpb.TopicInfo(name=str(SRC), kind=mpb.TopicKind.SHADOW, source="persistent://t/ns/o")
    with pytest.raises(errors.NotAllowed, match="is itself a shadow of persistent://t/ns/o"):
        sa.check_source(SRC, info)


def test_an_existing_shadow_names_its_source():
    info = mpb.TopicInfo(name=str(SHD), kind=mpb.TopicKind.SHADOW, source=str(SRC))
    err = sa.already_exists(SHD, info)
    assert isinstance(err, errors.TopicAlreadyExists)
    assert "already exists as a shadow of persistent://t/ns/src" in err.message


def test_shadow_infos_follow_the_source_partition_by_partition():
    src = mpb.TopicInfo(name=str(SRC), kind=mpb.TopicKind.SOURCE, partitions=3)
    infos = shadow_infos(SHD, SRC, src, {"k": "v"}, 123)
    parent, parts = infos[0], infos[1:]
    assert (parent.name, parent.kind, parent.source, parent.partitions,
            parent.partition_index, dict(parent.properties), parent.created_ms) == \
        (str(SHD), mpb.TopicKind.SHADOW, str(SRC), 3, -1, {"k": "v"}, 123)
    assert [(p.name, p.source, p.partition_of, p.partition_index, p.kind) for p in parts] == [
        (f"{SHD}-partition-{i}", f"{SRC}-partition-{i}", str(SHD), i, mpb.TopicKind.SHADOW)
        for i in range(3)]


# ---- plans -----------------------------------------------------------------------------------

def _infos(n: int) -> list[mpb.TopicInfo]:
    return shadow_infos(SHD, SRC, mpb.TopicInfo(name=str(SRC), partitions=n), {}, 1)


def test_a_small_create_is_one_transaction():
    [txn] = create_plan(_infos(4), SRC, 7, 0, ["persistent://t/ns/other"])
    assert len(txn.ops) == 6 and len(txn.compares) == 3 + 4
    lists = [op for op in txn.ops if op.key == keys.shadows(SRC)]
    assert mpb.ShadowList.FromString(lists[0].value).shadows == [
        "persistent://t/ns/other", str(SHD)]


def test_a_large_create_is_chunked_with_the_parent_last():
    txns = create_plan(_infos(250), SRC, 7, 9, [], limit=100)
    assert len(txns) > 2
    for txn in txns:
        assert len(txn.ops) <= 100 and len(txn.compares) <= 100
        # every chunk holds only while the source is as read
        assert any(c.key == keys.topic_info(SRC) and c.operand == 7 for c in txn.compares)
    puts = [op.key for txn in txns[:-1] for op in txn.ops]
    assert puts == [keys.topic_info(SHD.partition(i)) for i in range(250)]
    assert [op.key for op in txns[-1].ops] == [keys.topic_info(SHD), keys.shadows(SRC)]


def test_delete_plans_remove_the_shadow_from_the_list():
    [txn] = delete_plan(SHD, 2, 5, SRC, 6, [str(SHD), "persistent://t/ns/b"])
    assert [(op.key, op.prefix) for op in txn.ops if isinstance(op, Delete)] == [
        (keys.topic_prefix(SHD.partition(0)), True),
        (keys.replicator(SRC.partition(0), SHD.partition(0)), False),
        (keys.topic_prefix(SHD.partition(1)), True),
        (keys.replicator(SRC.partition(1), SHD.partition(1)), False),
        (keys.topic_prefix(SHD), True), (keys.replicator(SRC, SHD), False),
        (keys.topic_grants(SHD), False)]  # its grants go with it
    [put] = [op for op in txn.ops if isinstance(op, Put)]
    assert mpb.ShadowList.FromString(put.value).shadows == ["persistent://t/ns/b"]
    [txn] = delete_plan(SHD, 0, 5, SRC, 6, [str(SHD)])
    assert Delete(keys.shadows(SRC)) in txn.ops  # the last shadow: no empty list is left
    txns = delete_plan(SHD, 300, 5, SRC, 6, [str(SHD)], limit=100)
    assert txns[-1].ops[0] == Delete(keys.topic_prefix(SHD), prefix=True)  # parent last
    assert all(len(t.ops) <= 100 and len(t.compares) <= 100 for t in txns)


# ---- ShadowAdmin over the in-memory store ----------------------------------------------------

class HookedStore(MemoryStore):
    """Runs `hook(compares, ops)` once before the first txn that `when` matches."""

    def __init__(self):
        super().__init__()
        self.hook = self.when = None
        self.txns = 0

    async def txn(self, compares, success, failure=()):
        if self.hook is not None and self.when(compares, success):
            hook, self.hook = self.hook, None
            await hook()
        self.txns += 1
        return await super().txn(compares, success, failure)


@pytest.fixture
def env(tmp_path):
    store = HookedStore()
    topics = TopicManager(store, Storage(str(tmp_path)), session=None)
    feature = ShadowFeature()  # `topics delete` of a source asks it; of a shadow, it deletes
    feature.bind(SimpleNamespace(topics=topics, store=store, storage=topics.storage,
                                 config=BrokerConfig(), session=None))
    yield store, TopicAdmin(topics, [feature]), feature.admin
    topics.executor.shutdown(wait=False)


async def _infos_in(store, prefix="/shadowtopic/topics/") -> dict[str, mpb.TopicInfo]:
    snap = await store.get_prefix(prefix)
    return {kv.key: mpb.TopicInfo.FromString(kv.value) for kv in snap.items
            if kv.key.endswith("/info")}


async def _shadow_list(store, source=SRC) -> list[str] | None:
    kv = await store.get(keys.shadows(source))
    return list(mpb.ShadowList.FromString(kv.value).shadows) if kv else None


def test_chunked_create_and_delete_of_a_partitioned_shadow(env, arun):
    store, topics, admin = env
    admin.txn_ops = 10

    async def go():
        await topics.create(SRC, 25, Policies(), {})
        before = store.txns
        await admin.create(SHD, SRC, {"a": "b"})
        assert store.txns - before > 2  # chunked
        infos = await _infos_in(store)
        for i in range(25):
            p = infos[keys.topic_info(SHD.partition(i))]
            assert (p.kind, p.source, p.partition_of) == (
                mpb.TopicKind.SHADOW, str(SRC.partition(i)), str(SHD))
        assert infos[keys.topic_info(SHD)].partitions == 25
        assert await _shadow_list(store) == [str(SHD)]
        assert await admin.shadows(SRC.partition(3)) == [str(SHD.partition(3))]
        assert await store.get(keys.ledgers(SHD)) is None
        assert await store.get(keys.ledgers(SHD.partition(0))) is None
        await admin.delete(SHD)
        assert not [k for k in await _infos_in(store) if "/shd" in k]
        assert await _shadow_list(store) is None
        assert len(await _infos_in(store)) == 26  # the source and its partitions stay
    arun(go())


def test_a_source_change_between_chunks_is_retried_without_leftovers(env, arun):
    store, topics, admin = env
    admin.txn_ops = 10

    async def go():
        await topics.create(SRC, 20, Policies(), {})
        # set-policies on the source just before the parent's (last) transaction
        store.when = lambda compares, ops: any(getattr(o, "key", "") == keys.topic_info(SHD)
                                               for o in ops)
        store.hook = lambda: topics.set_policies(SRC, Policies(max_producers=3))
        await admin.create(SHD, SRC, {})
        infos = await _infos_in(store)
        assert len([k for k in infos if "/shd" in k]) == 21
        assert await _shadow_list(store) == [str(SHD)]
    arun(go())


def test_a_source_deleted_between_chunks_leaves_no_partition_behind(env, arun):
    store, topics, admin = env
    admin.txn_ops = 10

    async def go():
        await topics.create(SRC, 20, Policies(), {})
        store.when = lambda compares, ops: any(getattr(o, "key", "") == keys.topic_info(SHD)
                                               for o in ops)
        store.hook = lambda: topics.delete(SRC)
        with pytest.raises(errors.TopicNotFound, match="source topic .* does not exist"):
            await admin.create(SHD, SRC, {})
        assert await _infos_in(store) == {}
    arun(go())


def test_concurrent_shadows_of_one_source_all_land_in_its_list(env, arun):
    store, topics, admin = env

    async def go():
        await topics.create(SRC, 0, Policies(), {})
        names = [TopicName.parse(f"t/ns/s{i}") for i in range(40)]
        await asyncio.gather(*(admin.create(n, SRC, {}) for n in names))
        assert sorted(await _shadow_list(store)) == sorted(map(str, names))
        await asyncio.gather(*(admin.delete(n) for n in names[:25]))
        assert sorted(await _shadow_list(store)) == sorted(map(str, names[25:]))
    arun(go())


def test_a_shadow_created_while_its_source_is_deleted_stops_the_delete(env, arun):
    store, topics, admin = env

    async def go():
        await topics.create(SRC, 0, Policies(), {})
        # the shadow lands after the delete checked the list, before it deletes
        store.when = lambda compares, ops: Delete(keys.topic_prefix(SRC), prefix=True) in ops
        store.hook = lambda: admin.create(SHD, SRC, {})
        with pytest.raises(errors.HasShadowTopics, match=str(SHD)):
            await topics.delete(SRC)
        assert await store.get(keys.topic_info(SRC)) is not None
        assert await store.get(keys.ledgers(SRC)) is not None
        await topics.delete(SHD)  # `topics delete` of a shadow deletes it as a shadow
        await topics.delete(SRC)
        assert await _infos_in(store) == {}
    arun(go())


def test_refusals_create_nothing(env, arun):
    store, topics, admin = env

    async def go():
        await topics.create(SRC, 0, Policies(), {})
        await admin.create(SHD, SRC, {})
        other = TopicName.parse("t/ns/other")
        await topics.create(other, 0, Policies(), {})
        revision = (await store.get_prefix("/")).revision
        cases = [
            (admin.create(TopicName.parse("t/ns/x"), TopicName.parse("t/ns/missing"), {}),
             errors.TopicNotFound, "source topic persistent://t/ns/missing does not exist"),
            (admin.create(TopicName.parse("t/ns/x"), SHD, {}), errors.NotAllowed,
             "is itself a shadow of"),
            (admin.create(SHD, other, {}), errors.TopicAlreadyExists,
             f"already exists as a shadow of {SRC}"),
            (admin.create(other, SRC, {}), errors.TopicAlreadyExists,
             f"topic {other} already exists"),
            (admin.create(TopicName.parse("t/ns/x"), SRC, {"k": 1}), errors.InvalidArgument,
             "properties must map strings to strings"),
            (admin.source_of(SRC), errors.NotAllowed, "is not a shadow topic"),
            (admin.delete(SRC), errors.NotAllowed, "is not a shadow topic"),
            (admin.shadows(TopicName.parse("t/ns/missing")), errors.TopicNotFound,
             "does not exist"),
        ]
        for coro, exc, text in cases:
            with pytest.raises(exc, match=text):
                await coro
        assert (await store.get_prefix("/")).revision == revision
        assert await admin.source_of(SHD) == str(SRC)
        assert await admin.shadows(SHD) == []
    arun(go())
