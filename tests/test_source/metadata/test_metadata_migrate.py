"""The schema migrations (source/metadata/migrate.py) against MemoryStore and a real etcd.

The migration scans every topic and marks its end under a global key, so the etcd variant
runs on a private etcd (one per module) wiped before each test, not on the session one.
"""
from __future__ import annotations

import asyncio

import pytest

from shadowtopic.core.names import TopicName
from shadowtopic.metadata import EtcdServer, EtcdStore, MemoryStore, keys
from shadowtopic.metadata.migrate import BATCH, COMPACTION_JOB_KEYS, migrate, old_compaction_job

pytestmark = pytest.mark.timeout(60)

A = TopicName("t", "ns", "a")
A0 = TopicName("t", "ns", "a-partition-0")  # a's old keys are a string prefix of a0's
B = TopicName("t2", "ns", "b")
MARKER = keys.migration(COMPACTION_JOB_KEYS)


@pytest.fixture(scope="module")
def private_etcd():
    server = EtcdServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=["memory", pytest.param("etcd", marks=pytest.mark.integration)])
def store(request):
    if request.param == "memory":
        s = MemoryStore()
    else:
        s = EtcdStore(request.getfixturevalue("private_etcd").endpoint, timeout=5.0)
        asyncio.run(_wipe(s))
    yield s
    asyncio.run(s.close())


async def _wipe(s) -> None:
    await s.delete("/", prefix=True)


async def _values(store, prefix: str) -> dict[str, bytes]:
    return {kv.key: kv.value for kv in (await store.get_prefix(prefix)).items}


class Recording:
    """Passes calls to the store and records them (name, args)."""

    def __init__(self, store) -> None:
        self.store = store
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.calls.append((name, args))
            return attr(*args, **kwargs)
        return call


def test_moves_old_records(store, arun):
    async def body():
        old = {}
        for topic, n in ((A, 3), (A0, 2), (B, BATCH * 2 + 7)):  # B needs three transactions
            for i in range(n):
                key = old_compaction_job(topic, f"{i:08d}")
                old[key] = f"{topic}:{i}".encode()
                await store.put(key, old[key])
        others = {keys.compaction(A): b"pointer", keys.ledgers(A): b"ledgers",
                  keys.subscription(A, "compaction"): b"sub", keys.compaction(B): b"pointer b",
                  keys.compaction_request("c", A): b"request"}
        for k, v in others.items():
            await store.put(k, v)

        rec = Recording(store)
        assert await migrate(rec) == len(old)

        for topic in (A, A0, B):
            assert await _values(store, keys.compaction(topic) + "/") == {}  # none left
        for key, value in old.items():
            topic = TopicName(*key.split("/")[4:7])
            job_id = key.rsplit("/", 1)[1]
            assert (await store.get(keys.compaction_job(topic, job_id))).value == value
        for k, v in others.items():
            assert (await store.get(k)).value == v
        assert await store.get(MARKER) is not None
        for name, args in rec.calls:  # within etcd's default limits
            if name == "txn":
                compares, ops = args[0], args[1]
                assert len(compares) <= 100 and len(ops) <= 100
        assert sum(1 for name, _ in rec.calls if name == "txn") == 1 + 1 + 3
    arun(body())


def test_second_run_reads_only_the_marker(store, arun):
    async def body():
        await store.put(old_compaction_job(A, "1"), b"job")
        assert await migrate(store) == 1
        rec = Recording(store)
        assert await migrate(rec) == 0
        assert rec.calls == [("get", (MARKER,))]
        # an empty store: nothing to move, still marked
        await store.delete("/", prefix=True)
        assert await migrate(store) == 0
        assert await store.get(MARKER) is not None
    arun(body())


def test_the_newest_write_of_a_record_wins(store, arun):
    async def body():
        # job 1: the new-schema record was written after the old one: it stays
        await store.put(old_compaction_job(A, "1"), b"old 1")
        await store.put(keys.compaction_job(A, "1"), b"new 1")
        # job 2: an old-schema process wrote the old record last: it wins
        await store.put(keys.compaction_job(A, "2"), b"new 2")
        await store.put(old_compaction_job(A, "2"), b"old 2")
        assert await migrate(store) == 1
        assert await _values(store, keys.compaction_jobs_prefix(A)) == {
            keys.compaction_job(A, "1"): b"new 1", keys.compaction_job(A, "2"): b"old 2"}
        assert await _values(store, keys.compaction(A) + "/") == {}
    arun(body())


def test_concurrent_runs(store, arun):
    async def body():
        old = {}
        for topic in (A, A0, B):
            for i in range(BATCH + 5):
                key = old_compaction_job(topic, str(i))
                old[key] = key.encode()
                await store.put(key, old[key])
        others = [store]
        if isinstance(store, EtcdStore):  # separate clients, as separate processes have
            others = [EtcdStore(store.endpoints) for _ in range(2)]
        try:
            moved = await asyncio.gather(*[migrate(s) for s in others + [store]])
        finally:
            for s in others:
                if s is not store:
                    await s.close()
        assert sum(moved) == len(old)  # each record moved once
        for topic in (A, A0, B):
            assert await _values(store, keys.compaction(topic) + "/") == {}
            new = await _values(store, keys.compaction_jobs_prefix(topic))
            assert len(new) == BATCH + 5
            for key, value in new.items():
                assert old[old_compaction_job(topic, key.rsplit("/", 1)[1])] == value
        assert await store.get(MARKER) is not None
    arun(body())


class OldWriter:
    """A store beside a process still on the old schema: after every transaction it writes
    a fresh old record (for `times` transactions)."""

    def __init__(self, store, times: int) -> None:
        self.store, self.times, self.n = store, times, 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    async def txn(self, compares, success, failure=()):
        res = await self.store.txn(compares, success, failure)
        if self.times:
            self.times -= 1
            self.n += 1
            await self.store.put(old_compaction_job(A, f"late-{self.n}"), b"late")
        return res


def test_no_marker_while_old_records_keep_appearing(store, arun):
    async def body():
        await store.put(old_compaction_job(A, "1"), b"job")
        assert await migrate(OldWriter(store, times=100)) >= 1
        assert await store.get(MARKER) is None  # not done: the next start tries again
        assert await migrate(store) >= 1  # the old writer is gone
        assert await store.get(MARKER) is not None
        assert await _values(store, keys.compaction(A) + "/") == {}
    arun(body())
