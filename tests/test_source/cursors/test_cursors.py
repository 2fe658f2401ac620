"""Durable cursors: one contract suite for every CursorStore (the in-memory twin,
SnapshotCursorStore on the metadata twin, SnapshotCursorStore on a real etcd) plus the
CursorFlusher on each. CursorState itself: tests/test_source/cursors/test_cursor_state.py."""
from __future__ import annotations

import asyncio
import random
import time
import uuid

import google_crc32c
import pytest

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.cursors import (
    CursorFlusher,
    CursorState,
    CursorStore,
    Fence,
    MemoryCursorStore,
    SnapshotCursorStore,
)
from shadowtopic.cursors.snapshot import cursor_dir, encode
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import EtcdStore, MemoryStore, MetadataUnavailable, keys
from shadowtopic.pb.storage.v1 import cursors_pb2 as cpb
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

pytestmark = pytest.mark.timeout(120)
M = MessageId


# ---- the store contract ----------------------------------------------------------------------

class Env:
    """One store kind over its durable medium; `store()` is a new object (a restart)."""

    def __init__(self, kind: str, metadata, tmp_path):
        self.kind = kind
        self.metadata = metadata
        self.storage = Storage(str(tmp_path / "data"))
        self.topic = TopicName.parse(f"persistent://t/ns/c-{uuid.uuid4().hex[:12]}")
        self.fence = Fence(keys.ownership("test", self.topic), b"owner-1")
        self.data: dict = {}

    def store(self, compact_every: int = 32, metadata=None) -> CursorStore:
        if self.kind == "memory":
            return MemoryCursorStore(metadata or self.metadata, self.data)
        return SnapshotCursorStore(metadata or self.metadata, self.storage,
                                   compact_every=compact_every)

    async def own(self, value: bytes) -> Fence:
        await self.metadata.put(self.fence.key, value)
        return Fence(self.fence.key, value)

    def files(self) -> list[str]:
        return sorted(self.storage.list_dir(cursor_dir(self.topic)))

    async def pointer(self) -> cpb.CursorPointer:
        kv = await self.metadata.get(keys.cursors(self.topic))
        return cpb.CursorPointer.FromString(kv.value)


def _env(request, tmp_path):
    if request.param == "snapshot-etcd":
        metadata = EtcdStore(request.getfixturevalue("etcd_server").endpoint, timeout=5.0)
    else:
        metadata = MemoryStore()
    e = Env(request.param, metadata, tmp_path)
    asyncio.run(e.own(b"owner-1"))
    return e


@pytest.fixture(params=["memory", "snapshot-memory",
                        pytest.param("snapshot-etcd", marks=pytest.mark.integration)])
def env(request, tmp_path):
    """Every CursorStore."""
    e = _env(request, tmp_path)
    yield e
    asyncio.run(e.metadata.close())


@pytest.fixture(params=["snapshot-memory",
                        pytest.param("snapshot-etcd", marks=pytest.mark.integration)])
def snapshot_env(request, tmp_path):
    """The stores that keep files and a pointer (SnapshotCursorStore)."""
    e = _env(request, tmp_path)
    yield e
    asyncio.run(e.metadata.close())


def sample(n: int, seed: int = 0, prefix: str = "sub") -> dict[str, CursorState]:
    """`n` cursors; every tenth has a few holes, some across ledgers; every third has a
    consumer attached (last_active 0), the others were last active at some time."""
    rnd = random.Random(seed)
    out = {}
    for i in range(n):
        c = CursorState.starting_at(M(5, 0))
        c.ack_cumulative(M(5, rnd.randrange(1000)))
        if i % 10 == 0:
            c.ack([M(5, 1000 + rnd.randrange(50)), M(5, 1060), M(6, rnd.randrange(4)), M(8, 0)])
        if i % 3:
            c.last_active = 1_700_000_000_000 + rnd.randrange(10**9)
        out[f"{prefix}-{i}"] = c
    return out


def test_round_trip_of_cursors_with_holes_and_restart(env, arun):
    async def main():
        saved = sample(500)
        saved["odd name/ü"] = CursorState.starting_at(M(1, 0))
        s = env.store()
        assert await s.load(env.topic) == {}
        await s.save(env.topic, saved, env.fence)
        expected = {n: c.copy() for n, c in saved.items()}
        saved["sub-0"].ack_cumulative(M(9, 9))               # after the save: not persisted
        assert await s.load(env.topic) == expected
        loaded = await env.store().load(env.topic)            # a restart
        assert loaded == expected and loaded["sub-10"].holes == expected["sub-10"].holes > 0
        loaded["sub-1"].ack_cumulative(M(9, 9))               # loads share nothing
        assert await env.store().load(env.topic) == expected
    arun(main())


def test_batches_updates_and_deletes(env, arun):
    async def main():
        s = env.store(compact_every=3)
        model: dict[str, CursorState] = {}
        rnd = random.Random(1)
        for round_ in range(10):
            changes: dict[str, CursorState | None] = {}
            for name in rnd.sample([f"s{i}" for i in range(40)], 12):
                if name in model and rnd.random() < 0.3:
                    changes[name] = None
                else:
                    c = model.get(name, CursorState.starting_at(M(2, 0))).copy()
                    c.ack([M(2, round_ * 3 + 5)])
                    c.ack_cumulative(M(2, round_))
                    c.last_active = rnd.choice([0, 1_700_000_000_000 + round_])
                    changes[name] = c
            await s.save(env.topic, changes, env.fence)
            for name, c in changes.items():
                if c is None:
                    model.pop(name, None)
                else:
                    model[name] = c.copy()
            assert await env.store().load(env.topic) == model
        await s.save(env.topic, {}, env.fence)                 # an empty batch writes nothing
        await s.save(env.topic, {"never-existed": None}, env.fence)
        assert await env.store().load(env.topic) == model
    arun(main())


def test_stale_owner_is_fenced_and_changes_nothing(env, arun):
    async def main():
        first = sample(20)
        s = env.store()
        await s.save(env.topic, first, env.fence)
        files = env.files()
        new_fence = await env.own(b"owner-2")                 # another broker took the topic
        with pytest.raises(errors.Fenced):
            await s.save(env.topic, sample(5, seed=9, prefix="late"), env.fence)
        with pytest.raises(errors.Fenced):
            await s.delete(env.topic, env.fence)
        assert env.files() == files
        assert await env.store().load(env.topic) == first
        second = sample(5, seed=3, prefix="new")
        await env.store().save(env.topic, second, new_fence)  # the new owner writes on
        assert await env.store().load(env.topic) == {**first, **second}
        await env.store().delete(env.topic, new_fence)
        assert await env.store().load(env.topic) == {} and env.files() == []
    arun(main())


def test_an_old_incarnation_is_fenced_by_its_generation(env, arun):
    """A topic deleted and created again under the same name (its info key's create
    revision changed): the old incarnation's owner, still holding the ownership key, writes
    nothing into the new one."""
    async def main():
        info_key = keys.topic_info(env.topic)  # a real TopicInfo: the etcd is the run's
        info = mpb.TopicInfo(name=str(env.topic)).SerializeToString()
        await env.metadata.put(info_key, info)
        kv = await env.metadata.get(info_key)
        old = env.fence._replace(info_key=info_key, generation=kv.create_revision)
        s = env.store()
        first = sample(5)
        await s.save(env.topic, first, old)
        await env.metadata.delete(info_key)
        await env.metadata.put(info_key, info)  # created again: a new create revision
        with pytest.raises(errors.Fenced):
            await s.save(env.topic, sample(3, seed=4, prefix="late"), old)
        assert await env.store().load(env.topic) == first
        new = old._replace(generation=(await env.metadata.get(info_key)).create_revision)
        await env.store().save(env.topic, sample(2, seed=5, prefix="new"), new)
        assert len(await env.store().load(env.topic)) == 7
        await env.metadata.delete(info_key)  # other tests list the run's topics
    arun(main())


def test_a_second_writer_of_the_same_owner_loses_no_batch(env, arun):
    async def main():
        a, b = env.store(), env.store()
        await a.load(env.topic)
        await b.load(env.topic)                               # b's view is now stale
        await a.save(env.topic, {"a": CursorState.starting_at(M(1, 1))}, env.fence)
        await b.save(env.topic, {"b": CursorState.starting_at(M(1, 2))}, env.fence)
        await a.save(env.topic, {"c": CursorState.starting_at(M(1, 3))}, env.fence)
        assert sorted(await env.store().load(env.topic)) == ["a", "b", "c"]
        a.forget(env.topic)                                    # unloaded: nothing cached
        assert env.topic not in getattr(a, "_topics", {})
        await a.save(env.topic, {"d": None}, env.fence)
        assert sorted(await env.store().load(env.topic)) == ["a", "b", "c"]
    arun(main())


def test_a_lost_txn_reply_loses_no_batch(snapshot_env, arun):
    env = snapshot_env

    async def main():
        s = env.store(metadata=LosesReply(env.metadata))
        await s.save(env.topic, {"a": CursorState.starting_at(M(1, 1))}, env.fence)
        with pytest.raises(errors.MetadataUnavailable):       # applied, but the reply is lost
            await s.save(env.topic, {"b": CursorState.starting_at(M(1, 2))}, env.fence)
        await s.save(env.topic, {"c": CursorState.starting_at(M(1, 3))}, env.fence)
        assert sorted(await env.store().load(env.topic)) == ["a", "b", "c"]
        ptr = await env.pointer()
        assert ptr.sequence == 3 and len(ptr.deltas) == 2
    arun(main())


class LosesReply:
    """A metadata store whose second txn applies but raises MetadataUnavailable."""

    def __init__(self, inner):
        self.inner = inner
        self.txns = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def txn(self, *args, **kwargs):
        res = await self.inner.txn(*args, **kwargs)
        self.txns += 1
        if self.txns == 2:
            raise MetadataUnavailable("reply lost")
        return res


@pytest.mark.parametrize("damage", ["missing-full", "flipped-byte", "missing-delta",
                                    "truncated-delta", "bad-pointer", "foreign-file",
                                    "bad-ranges"])
def test_missing_or_corrupt_files_raise_typed_errors(snapshot_env, arun, damage):
    env = snapshot_env

    async def main():
        s = env.store()
        await s.save(env.topic, sample(30), env.fence)
        await s.save(env.topic, sample(3, seed=2, prefix="x"), env.fence)
        ptr = await env.pointer()
        assert len(ptr.deltas) == 1
        full, delta = env.storage.full(ptr.full.path), env.storage.full(ptr.deltas[0].path)
        if damage == "missing-full":
            env.storage.delete(ptr.full.path)
        elif damage == "missing-delta":
            env.storage.delete(ptr.deltas[0].path)
        elif damage == "flipped-byte":
            data = bytearray(open(full, "rb").read())
            data[len(data) // 2] ^= 1
            open(full, "wb").write(bytes(data))
        elif damage == "truncated-delta":
            data = open(delta, "rb").read()
            open(delta, "wb").write(data[:-1])
        elif damage in ("foreign-file", "bad-ranges"):       # right checksum, wrong content
            data = open(delta, "rb").read() if damage == "foreign-file" else encode(
                env.topic, ptr.full.sequence, True, {"z": (5, 3, (5, 9, 5, 9, 5, 8, 5, 8), 0)})
            open(full, "wb").write(data)
            ptr.full.crc32c, ptr.full.size_bytes = google_crc32c.value(data), len(data)
            await env.metadata.put(keys.cursors(env.topic), ptr.SerializeToString())
        else:
            await env.metadata.put(keys.cursors(env.topic), b"\xff\xff not a pointer")
        want = errors.ChecksumError if damage in ("flipped-byte", "truncated-delta") \
            else errors.DataLoss
        with pytest.raises(want):
            await env.store().load(env.topic)
        with pytest.raises(want):                              # nor is it overwritten
            await env.store().save(env.topic, sample(1, prefix="y"), env.fence)
    arun(main())


def test_round_trip_of_last_active(env, arun):
    """The subscription's last activity is persisted with its cursor, through deltas and
    compactions: a restart reads the time the last save carried (0: a consumer was
    attached then)."""
    async def main():
        s = env.store(compact_every=2)
        a = CursorState.starting_at(M(3, 0))
        a.last_active = 1_700_000_000_001
        b = CursorState.starting_at(M(3, 0))                  # attached: 0
        await s.save(env.topic, {"a": a, "b": b}, env.fence)
        loaded = await env.store().load(env.topic)
        assert loaded["a"].last_active == 1_700_000_000_001 and loaded["b"].last_active == 0
        for t in range(2, 6):                                  # deltas, then a compaction
            b.last_active = 1_700_000_000_000 + t             # its consumer left at t ...
            await s.save(env.topic, {"b": b}, env.fence)
            loaded = await env.store().load(env.topic)
            assert loaded["b"].last_active == 1_700_000_000_000 + t
            assert loaded["a"].last_active == 1_700_000_000_001  # untouched rows keep theirs
        b.last_active = 0                                      # ... and one attached again
        await s.save(env.topic, {"b": b}, env.fence)
        assert (await env.store().load(env.topic))["b"].last_active == 0
    arun(main())


def _rewrite_full(env, ptr: cpb.CursorPointer, edit) -> None:
    """Rewrite the pointer's full file through `edit(CursorFile)`, checksums kept right."""
    path = env.storage.full(ptr.full.path)
    f = cpb.CursorFile.FromString(open(path, "rb").read())
    edit(f)
    data = f.SerializeToString()
    open(path, "wb").write(data)
    ptr.full.crc32c, ptr.full.size_bytes = google_crc32c.value(data), len(data)


def test_a_file_without_last_active_loads_as_unknown(snapshot_env, arun):
    """Files written before last_active was persisted have no `last_active_ms` column: they
    load, every cursor with 0 ("unknown": its subscription counts from the load); a delta
    written since carries the column for its rows. A column of the wrong length is
    DataLoss."""
    env = snapshot_env

    async def main():
        saved = sample(40)
        s = env.store()
        await s.save(env.topic, saved, env.fence)
        ptr = await env.pointer()
        _rewrite_full(env, ptr, lambda f: f.ClearField("last_active_ms"))
        await env.metadata.put(keys.cursors(env.topic), ptr.SerializeToString())
        old = cpb.CursorFile.FromString(open(env.storage.full(ptr.full.path), "rb").read())
        assert len(old.names) == 40 and not old.last_active_ms  # as written before the column
        loaded = await env.store().load(env.topic)
        assert {n: c.last_active for n, c in loaded.items()} == {n: 0 for n in saved}
        for c in saved.values():
            c.last_active = 0
        assert loaded == saved                                 # acknowledgements intact
        fresh = CursorState.starting_at(M(9, 0))
        fresh.last_active = 1_700_000_000_777
        s2 = env.store()
        await s2.save(env.topic, {"sub-1": fresh}, env.fence)  # a delta, with the column
        loaded = await env.store().load(env.topic)
        assert loaded["sub-1"].last_active == 1_700_000_000_777
        assert loaded["sub-2"].last_active == 0
        ptr = await env.pointer()
        _rewrite_full(env, ptr, lambda f: f.last_active_ms.extend([1]))  # one value too many
        await env.metadata.put(keys.cursors(env.topic), ptr.SerializeToString())
        with pytest.raises(errors.DataLoss):
            await env.store().load(env.topic)
    arun(main())


def test_compaction_keeps_only_the_files_the_pointer_names(snapshot_env, arun):
    env = snapshot_env

    async def main():
        s = env.store(compact_every=2)
        junk = f"{cursor_dir(env.topic)}/00000000000000000001-deadbeef.delta"
        model = {}
        for i in range(7):
            c = CursorState.starting_at(M(3, i))
            await s.save(env.topic, {f"s{i}": c}, env.fence)
            model[f"s{i}"] = c
            if i == 0:                                         # an orphan of a failed save
                env.storage.fs.open_output_stream(env.storage.full(junk)).close()
            ptr = await env.pointer()
            assert ptr.sequence == i + 1 and len(ptr.deltas) == i % 3
            named = sorted([ptr.full.path, *[d.path for d in ptr.deltas]])
            assert [f for f in env.files() if f != junk] == named
        assert junk not in env.files()                         # swept by a compaction
        assert await env.store().load(env.topic) == model
    arun(main())


def test_100k_cursors_save_and_load(env, arun):
    async def main():
        cursors = sample(100_000)
        s = env.store()
        t0 = time.perf_counter()
        await s.save(env.topic, cursors, env.fence)
        t1 = time.perf_counter()
        loaded = await env.store().load(env.topic)
        t2 = time.perf_counter()
        await s.save(env.topic, {"sub-7": cursors["sub-7"]}, env.fence)
        t3 = time.perf_counter()
        assert loaded == cursors
        print(f"\n{env.kind}: 100,000 cursors: save {t1 - t0:.3f}s, load {t2 - t1:.3f}s, "
              f"one-cursor save after that {t3 - t2:.3f}s")
    arun(main(), timeout=100)


# ---- the flusher -----------------------------------------------------------------------------

class Counting(CursorStore):
    """Counts saves (and can fail the next few) in front of another store."""

    def __init__(self, inner: CursorStore, fail: int = 0):
        self.inner = inner
        self.fail = fail
        self.saves: list[int] = []

    async def load(self, topic):
        return await self.inner.load(topic)

    async def save(self, topic, changes, fence):
        if self.fail:
            self.fail -= 1
            raise errors.MetadataUnavailable("down for a moment")
        await self.inner.save(topic, changes, fence)
        self.saves.append(len(changes))

    async def delete(self, topic, fence):
        await self.inner.delete(topic, fence)


async def until(check, timeout: float = 10.0) -> float:
    """Await a sync `check()`; return the seconds it took, fail after `timeout`."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout}s")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def test_flusher_saves_one_batch_per_interval(env, arun):
    async def main():
        store = Counting(env.store())
        flusher = CursorFlusher(store, env.topic, env.fence, interval=0.3).start()
        subs = {f"s{i}": CursorState.starting_at(M(4, 0)) for i in range(2000)}
        for entry in range(5):                                 # 10,000 acks
            for name, c in subs.items():
                c.ack_cumulative(M(4, entry))
                flusher.mark(name, c)
        took = await until(lambda: flusher.flushes == 1)
        assert took < 0.3 + 2.0 and store.saves == [2000]
        assert await env.store().load(env.topic) == subs
        subs["s1"].ack([M(4, 9)])
        flusher.mark("s1", subs["s1"])
        flusher.remove("s2")
        await until(lambda: flusher.flushes == 2)
        assert store.saves == [2000, 2]
        crashing = CursorFlusher(store, env.topic, env.fence, interval=3600).start()
        subs["s3"].ack_cumulative(M(4, 7))                     # then a crash: no close()
        crashing.mark("s3", subs["s3"])
        subs.pop("s2")
        restored = await env.store().load(env.topic)
        assert restored["s1"] == subs["s1"] and "s2" not in restored
        assert restored["s3"].mark_delete == M(4, 4)           # one interval old at most
    arun(main())


def test_flusher_retries_failures_and_close_flushes(env, arun):
    async def main():
        store = Counting(env.store(), fail=1)
        flusher = CursorFlusher(store, env.topic, env.fence, interval=0.2).start()
        c = CursorState.starting_at(M(4, 0))
        flusher.mark("a", c)
        await until(lambda: flusher.failures == 1)
        assert flusher.pending == 1                            # kept for the next tick
        await until(lambda: flusher.flushes == 1)
        assert store.saves == [1] and flusher.flushes == 1
        slow = CursorFlusher(store, env.topic, env.fence, interval=3600).start()
        c.ack_cumulative(M(4, 3))
        slow.mark("a", c)
        await slow.close()                                     # no waiting for the interval
        assert (await env.store().load(env.topic))["a"].mark_delete == M(4, 3)
        with pytest.raises(errors.AlreadyClosed):
            slow.mark("a", c)
        await flusher.close()
    arun(main())


def test_flusher_stops_when_fenced(env, arun):
    async def main():
        flusher = CursorFlusher(env.store(), env.topic, env.fence, interval=0.1).start()
        await env.own(b"owner-2")
        flusher.mark("a", CursorState.starting_at(M(4, 0)))
        await until(lambda: flusher.fenced is not None)
        assert isinstance(flusher.fenced, errors.Fenced)
        with pytest.raises(errors.Fenced):
            flusher.mark("b", CursorState.starting_at(M(4, 0)))
        with pytest.raises(errors.Fenced):
            await flusher.close()
        assert await env.store().load(env.topic) == {}
    arun(main())
