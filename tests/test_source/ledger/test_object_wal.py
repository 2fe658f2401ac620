"""The WAL on object storage (source/ledger/object_wal.py, wal_sink.py, wal_restore.py) in
`ManagedLedger`s over the in-memory metadata store, with a local directory as the object
store (the same pyarrow filesystem calls as S3; the real S3 server is in
tests/test_integration/test_object_wal.py): one object and one transaction per flush window
for every topic, a new owner rebuilding open ledgers from the commits alone, a deposed
owner's window never committed nor acknowledged, a failed PUT reusing its entry ids, and
objects deleted once nothing needs them."""
from __future__ import annotations

import asyncio
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow.fs as pafs
import pytest

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.managed import LedgerConfig, ManagedLedger
from shadowtopic.ledger.object_wal import MAX_TXN_OPS, ObjectWal, Section, chunks
from shadowtopic.ledger.storage import Storage
from shadowtopic.ledger.wal_restore import drop_stale_everywhere
from shadowtopic.metadata import keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.storage.v1 import views_pb2


def topic(i: int = 0) -> TopicName:
    return TopicName.parse(f"persistent://public/default/t{i}")


class Env:
    """One metadata store, one object-store directory; each `broker()` is a broker of its
    own (its own WAL dir, its own ObjectWal), as on another machine."""

    def __init__(self, tmp_path, window_s: float = 0.0):
        self.tmp = tmp_path
        self.store = MemoryStore()
        self.objects_dir = str(tmp_path / "bucket" / "wal")
        os.makedirs(self.objects_dir)
        self.executor = ThreadPoolExecutor(4)
        self.window_s = window_s
        self.n = 0

    def broker(self) -> tuple[Storage, ObjectWal]:
        self.n += 1
        storage = Storage(str(self.tmp / "root"), wal_dir=str(self.tmp / f"disk{self.n}"))
        wal = ObjectWal(pafs.LocalFileSystem(), self.objects_dir, "file://" + self.objects_dir,
                        self.store, f"b{self.n}", self.executor, window_s=self.window_s)
        return storage, wal

    async def open(self, storage: Storage, wal: ObjectWal, t: TopicName, epoch: int,
                   **cfg) -> ManagedLedger:
        own_key = keys.ownership("c", t)
        value = mpb.Ownership(broker_id=f"b{epoch}", epoch=epoch).SerializeToString()
        await self.store.put(own_key, value)
        return await ManagedLedger.open(t, self.store, storage, own_key, value, epoch,
                                        self.executor, LedgerConfig(**cfg), wal_objects=wal)

    def objects(self) -> list[str]:
        out = []
        for d, _dirs, files in os.walk(self.objects_dir):
            out += [os.path.join(d, f) for f in files if f.endswith(".wal")]
        return sorted(out)

    async def commits(self, t: TopicName) -> list[str]:
        return [kv.key for kv in (await self.store.get_prefix(keys.wal_commits_prefix(t))).items]


async def send(ml: ManagedLedger, values: list[str], name: str = "", seq: int = 0):
    raws = [v.encode() for v in values]
    req = views_pb2.RawProduceRequest(topic=str(ml.topic), producer_name=name, sequence_id=seq,
                                      messages=raws).SerializeToString()
    return await ml.append_batch(raws, req, sum(map(len, raws)), (name, seq) if name else None)


async def payloads(ml: ManagedLedger) -> list[str]:
    out, pos = [], MessageId(0, 0)
    for _ in range(1000):
        got = await ml.read(pos, 1000, 1 << 30)
        if not got:
            return out
        out += [e.raw for e in got]
        pos = MessageId(got[-1].ledger_id, got[-1].entry_id + 1)
    raise AssertionError("read did not end")


def decoded(raws: list[bytes]) -> list[str]:
    return [r.decode() for r in raws]


def test_one_window_is_one_object_and_one_transaction_for_every_topic(tmp_path, arun):
    async def main():
        env = Env(tmp_path, window_s=0.05)
        storage, wal = env.broker()
        mls = [await env.open(storage, wal, topic(i), 1) for i in range(20)]
        before_puts, before_txns = wal.stats.puts, wal.stats.txns
        await asyncio.gather(*(send(ml, [f"t{i}-a", f"t{i}-b"]) for i, ml in enumerate(mls)))
        assert wal.stats.puts - before_puts == 1
        assert wal.stats.txns - before_txns == 1
        for i, ml in enumerate(mls):
            assert decoded(await payloads(ml)) == [f"t{i}-a", f"t{i}-b"]
            assert len(await env.commits(topic(i))) == 1
        for ml in mls:
            await ml.close()
        await wal.close()
    arun(main())


def test_a_ledgers_groups_in_one_window_are_one_section(tmp_path, arun):
    """A writer sends its next group while the last one waits for the window: the groups of
    one ledger that meet in a window join one section (one commit key, one compare), and a
    new owner restores them all."""
    async def main():
        env = Env(tmp_path, window_s=0.2)
        storage, wal = env.broker()
        t = topic()
        ml = await env.open(storage, wal, t, 1)
        before = (wal.stats.puts, wal.stats.txns, wal.stats.sections)
        sends = []
        for i in range(4):  # four groups: each handed to the window before the next
            sends.append(asyncio.ensure_future(send(ml, [f"m{i}"], name="p", seq=i + 1)))
            await asyncio.sleep(0.02)
        await asyncio.gather(*sends)
        after = (wal.stats.puts, wal.stats.txns, wal.stats.sections)
        assert [b - a for a, b in zip(before, after)] == [1, 1, 1]
        assert len(await env.commits(t)) == 1
        assert decoded(await payloads(ml)) == ["m0", "m1", "m2", "m3"]
        shutil.rmtree(storage.wal_base)  # the machine is lost
        storage2, wal2 = env.broker()
        ml2 = await env.open(storage2, wal2, t, 2)
        assert decoded(await payloads(ml2)) == ["m0", "m1", "m2", "m3"]
        assert ml2.dedup.last("p") == 4
        await ml2.close()
        await wal2.close()
    arun(main())


def test_a_new_owner_rebuilds_the_open_ledger_from_the_commits_alone(tmp_path, arun):
    async def main():
        env = Env(tmp_path)
        storage, wal = env.broker()
        t = topic()
        ml = await env.open(storage, wal, t, 1)
        await send(ml, ["a", "b"], name="p", seq=1)
        await ml.roll()  # a sealed ledger: its commits and objects go
        sealed_objects = env.objects()
        await send(ml, ["c"], name="p", seq=3)
        await send(ml, ["d", "e"], name="p", seq=4)
        # the machine is lost: nothing closes, its disk is gone
        shutil.rmtree(storage.wal_base)
        storage2, wal2 = env.broker()
        ml2 = await env.open(storage2, wal2, t, 2)
        assert decoded(await payloads(ml2)) == ["a", "b", "c", "d", "e"]
        assert ml2.dedup.last("p") == 5
        # a resend of the last batch is recognised; the next one follows on
        again = await send(ml2, ["d", "e"], name="p", seq=4)
        assert again[2] is True
        await send(ml2, ["f"], name="p", seq=6)
        assert decoded(await payloads(ml2)) == ["a", "b", "c", "d", "e", "f"]
        # the recovered ledger was sealed: no commit of it stays
        lst = ml2.ledger_list.current
        assert [i.state for i in lst.ledgers][:2] == [mpb.LedgerState.SEALED] * 2
        open_ids = {i.ledger_id for i in lst.ledgers if i.state == mpb.LedgerState.OPEN}
        assert {int(k.split("/")[-2]) for k in await env.commits(t)} <= open_ids
        assert not set(sealed_objects) & set(env.objects())
        await ml2.close()
        await wal2.close()
    arun(main())


def test_a_deposed_owner_gets_nothing_committed_or_acknowledged(tmp_path, arun):
    async def main():
        env = Env(tmp_path)
        storage, wal = env.broker()
        t = topic()
        ml = await env.open(storage, wal, t, 1)
        await send(ml, ["a"])
        # another broker takes the topic (its ownership record replaces this one's)
        await env.store.put(keys.ownership("c", t),
                            mpb.Ownership(broker_id="other", epoch=9).SerializeToString())
        with pytest.raises(errors.Fenced):
            await send(ml, ["late"])
        assert ml.fenced is not None
        assert len(await env.commits(t)) == 1  # only "a"
        storage2, wal2 = env.broker()
        ml2 = await env.open(storage2, wal2, t, 10)
        assert decoded(await payloads(ml2)) == ["a"]
        await ml2.close()
        await wal.close()
        await wal2.close()
    arun(main())


def test_a_commit_of_unknown_outcome_fences_and_the_next_owner_decides(tmp_path, arun):
    async def main():
        env = Env(tmp_path)
        storage, wal = env.broker()
        t = topic()
        ml = await env.open(storage, wal, t, 1)
        await send(ml, ["a"])
        env.store.set_available(False)
        with pytest.raises(errors.MetadataUnavailable):
            await send(ml, ["b"])
        assert ml.fenced is not None
        env.store.set_available(True)
        ml2 = await env.open(*env.broker(), t, 2)
        assert decoded(await payloads(ml2)) == ["a"]
        await ml2.close()
    arun(main())


def test_a_failed_put_acknowledges_nothing_and_the_ids_are_used_again(tmp_path, arun):
    async def main():
        env = Env(tmp_path)
        storage, wal = env.broker()
        t = topic()
        ml = await env.open(storage, wal, t, 1)
        await send(ml, ["a"])
        good = wal.base
        wal.base = str(tmp_path / "file-not-dir")  # a PUT under a file fails
        with open(wal.base, "w") as f:
            f.write("x")
        with pytest.raises(errors.ServiceUnavailable):
            await send(ml, ["lost"])
        assert ml.fenced is None
        wal.base = good
        lid, first, _dup = await send(ml, ["b"])
        assert first == 1  # the failed batch's id is used again
        assert decoded(await payloads(ml)) == ["a", "b"]
        ml2 = await env.open(*env.broker(), t, 2)
        assert decoded(await payloads(ml2)) == ["a", "b"]
        await ml2.close()
        await wal.close()
    arun(main())


def test_the_sweep_deletes_only_old_objects_no_commit_names(tmp_path, arun):
    async def main():
        env = Env(tmp_path)
        storage, wal = env.broker()
        t = topic()
        ml = await env.open(storage, wal, t, 1)
        await send(ml, ["a"])
        named = env.objects()
        assert len(named) == 1
        orphan = os.path.join(env.objects_dir, "dead-broker", "000000000001.wal")
        os.makedirs(os.path.dirname(orphan))
        with open(orphan, "wb") as f:
            f.write(b"STWOBJ01")
        _, other = env.broker()  # another broker's sweep: it holds no reference of its own
        assert await other.sweep(grace_s=60) == 0  # young: kept
        old = time.time() - 120
        for p in (orphan, *named):
            os.utime(p, (old, old))
        assert await other.sweep(grace_s=60) == 1
        assert env.objects() == named
        await ml.close()
        await wal.close()
    arun(main())


def test_transactions_stay_within_etcds_operation_limit():
    loop = asyncio.new_event_loop()
    try:
        def sec(i: int, owner: int) -> Section:
            return Section(topic(i), (f"k{owner}", b"v"), 1, 0, 1, [b""], 0, loop.create_future())
        many = [sec(i, i) for i in range(MAX_TXN_OPS * 2 + 5)]
        groups = chunks(many)
        assert [len(g) for g in groups] == [MAX_TXN_OPS, MAX_TXN_OPS, 5]
        shared = [sec(i, 0) for i in range(MAX_TXN_OPS + 1)]  # one owner, many sections
        assert [len(g) for g in chunks(shared)] == [MAX_TXN_OPS, 1]
        assert chunks([]) == []
    finally:
        loop.close()


def test_a_failed_window_fails_every_later_group_and_the_restore_stops_there(tmp_path, arun):
    """Groups of one ledger are committed while earlier ones are in flight: the first
    window's PUT is held and then fails, the second window commits meanwhile. Neither is
    acknowledged, the ledger is fenced (its ids cannot be used again), and a new owner's
    restore ends before the failed window, though a later commit exists."""
    async def main():
        env = Env(tmp_path)
        storage, wal = env.broker()
        t = topic()
        ml = await env.open(storage, wal, t, 1)
        await send(ml, ["a"])
        release = asyncio.Event()
        put = wal._put
        calls = []

        def held_put(path: str, data: bytes) -> None:
            calls.append(path)
            if len(calls) == 1:  # the first window: held, then refused
                asyncio.run_coroutine_threadsafe(release.wait(), loop).result(10)
                raise OSError(5, "injected PUT failure")
            put(path, data)
        loop = asyncio.get_running_loop()
        wal._put = held_put
        first = asyncio.ensure_future(send(ml, ["b"]))
        for _ in range(200):  # the first window's PUT has started
            if calls:
                break
            await asyncio.sleep(0.01)
        second = asyncio.ensure_future(send(ml, ["c"]))
        for _ in range(200):  # the second window committed while the first is held
            if len(await env.commits(t)) == 2:
                break
            await asyncio.sleep(0.01)
        assert len(await env.commits(t)) == 2  # "a" and "c"
        assert not second.done()  # not acknowledged before the group ahead of it
        release.set()
        with pytest.raises(errors.ServiceUnavailable):
            await first
        with pytest.raises(errors.ServiceUnavailable):
            await second
        assert ml.fenced is not None
        wal._put = put
        ml2 = await env.open(*env.broker(), t, 2)
        assert decoded(await payloads(ml2)) == ["a"]
        await ml2.close()
        await wal.close()
    arun(main())


def test_the_maintenance_pass_drops_commits_of_ledgers_no_longer_open(arun):
    """`drop_stale_everywhere`: commits whose ledger is no longer open in its topic's list
    (sealed; the topic deleted, so no list at all) are deleted, for topics loaded nowhere;
    an open ledger's stay."""
    async def main():
        store = MemoryStore()
        live, gone = topic(1), topic(2)
        lst = mpb.LedgerList(ledgers=[
            mpb.LedgerInfo(ledger_id=3, state=mpb.LedgerState.SEALED),
            mpb.LedgerInfo(ledger_id=5, state=mpb.LedgerState.OPEN)])
        await store.put(keys.ledgers(live), lst.SerializeToString())
        for t, lid in ((live, 3), (live, 5), (gone, 7)):
            for first in (0, 10):
                await store.put(keys.wal_commit(t, lid, first), b"c")
        await store.put(keys.WAL_COMMITS_PREFIX + "junk", b"not a commit key")
        assert await drop_stale_everywhere(store) == 2
        left = [kv.key for kv in (await store.get_prefix(keys.WAL_COMMITS_PREFIX)).items]
        assert left == sorted([keys.wal_commit(live, 5, 0), keys.wal_commit(live, 5, 10),
                               keys.WAL_COMMITS_PREFIX + "junk"])
        assert await drop_stale_everywhere(store) == 0
        await store.close()
    arun(main())
