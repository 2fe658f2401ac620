"""Ledger engine: WAL format and recovery, sealed Parquet ledgers, the managed ledger."""
from __future__ import annotations

import asyncio
import errno
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.ledger_env import TOPIC, Env
from support.ledger_env import append as _append
from support.ledger_env import batch as _batch
from support.ledger_env import read_all as _read_all

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import wal
from shadowtopic.ledger.managed import LedgerConfig, ManagedLedger
from shadowtopic.ledger.sealed import SealedLedger, write_sealed
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb


def _write_wal(path: str, batches: list[int]) -> None:
    f = wal.WalFile.create(path, 9)
    first = 0
    for n in batches:
        raws, request, _ = _batch(n, first)
        f.write_sync(wal.encode_batch(first, 1000 + first, request, n))
        first += n
    f.close()


# ---- WAL ---------------------------------------------------------------------------------

def test_wal_round_trip(tmp_path):
    path = str(tmp_path / "w" / "9.wal")
    _write_wal(path, [3, 5])
    rec = wal.recover(path)
    assert rec.ledger_id == 9 and rec.truncated_bytes == 0
    assert rec.entries.raws == [f"m{i}".encode() for i in range(8)]
    assert rec.entries.publish_ms == [1000] * 3 + [1003] * 5


@pytest.mark.parametrize("damage", ["append-garbage", "cut-frame", "flip-crc", "zero-tail"])
def test_wal_recovery_cuts_at_last_valid_frame(tmp_path, damage):
    path = str(tmp_path / "9.wal")
    _write_wal(path, [4, 4])
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        if damage == "append-garbage":
            f.seek(0, 2)
            f.write(b"\x10\x00\x00\x00garbage-garbage-garbage")
        elif damage == "cut-frame":
            f.truncate(size - 3)
        elif damage == "flip-crc":
            f.seek(size - 1)
            last = f.read(1)
            f.seek(size - 1)
            f.write(bytes([last[0] ^ 1]))
        else:
            f.seek(0, 2)
            f.write(b"\x00" * 64)
    rec = wal.recover(path)
    expected = 8 if damage in ("append-garbage", "zero-tail") else 4
    assert len(rec.entries) == expected
    assert os.path.getsize(path) == rec.valid_bytes
    assert wal.recover(path).truncated_bytes == 0  # the cut is durable and idempotent


def test_wal_rejects_foreign_file(tmp_path):
    path = tmp_path / "x.wal"
    path.write_bytes(b"not a wal at all")
    with pytest.raises(ValueError):
        wal.recover(str(path))


def test_failed_write_is_cut_back(tmp_path, monkeypatch):
    path = str(tmp_path / "9.wal")
    f = wal.WalFile.create(path, 9)
    raws, request, _ = _batch(2)
    f.write_sync(wal.encode_batch(0, 1, request, 2))

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", full)
    with pytest.raises(OSError):
        f.write_sync(wal.encode_batch(2, 1, request, 2))
    monkeypatch.undo()
    f.write_sync(wal.encode_batch(2, 1, request, 2))
    f.close()
    assert len(wal.recover(path).entries) == 4


# ---- sealed ledgers ------------------------------------------------------------------------

def _entries(n: int) -> wal.Entries:
    """Real Messages: entry 0 keyless, 1 a tombstone of k1, the rest keyed values."""
    from shadowtopic.pb.v1 import common_pb2
    raws = []
    for i in range(n):
        m = common_pb2.Message(payload=b"" if i == 1 else f"m{i}".encode())
        if i:
            m.key = f"k{i % 3}".encode()
        raws.append(m.SerializeToString())
    e = wal.Entries()
    e.extend(555, raws, sum(map(len, raws)))
    return e


def test_sealed_round_trip_reads_by_entry_id(tmp_path):
    st = Storage(str(tmp_path))
    size, crc = write_sealed(st.fs, st.full("l/1.parquet"), _entries(3000), ledger_id=7)
    led = SealedLedger(st.fs, st.full("l/1.parquet"), crc)
    assert led.num_entries == 3000 and size > 0
    pubs, raws = led.read(2040, 10, 1 << 20)
    assert raws == _entries(3000).raws[2040:2050] and pubs == [555] * 10
    _, raws = led.read(2990, 100, 1 << 20)
    assert len(raws) == 10
    import pyarrow.parquet as pq
    t = pq.read_table(st.full("l/1.parquet"), columns=["entry_id", "key", "is_tombstone"])
    assert t.column("entry_id").to_pylist()[:3] == [0, 1, 2]
    assert t.column("key").to_pylist()[:3] == [None, b"k1", b"k2"]
    assert t.column("is_tombstone").to_pylist()[:3] == [False, True, False]


def test_sealed_corruption_and_absence_are_typed(tmp_path):
    st = Storage(str(tmp_path))
    path = st.full("l/2.parquet")
    _, crc = write_sealed(st.fs, path, _entries(100), ledger_id=7)
    with open(path, "r+b") as f:
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 0x55]))
    with pytest.raises(errors.ChecksumError):
        SealedLedger(st.fs, path, crc)
    with pytest.raises(errors.DataLoss):
        SealedLedger(st.fs, st.full("l/missing.parquet"), crc)


# ---- managed ledger ------------------------------------------------------------------------

def test_appends_group_commit_and_ids_are_contiguous(tmp_path, arun, monkeypatch):
    calls = []
    real = wal.WalFile.write_sync

    def counting(self, data):
        calls.append(len(data))
        return real(self, data)

    monkeypatch.setattr(wal.WalFile, "write_sync", counting)

    async def main():
        env = Env(tmp_path)
        ml = await env.open()
        results = await asyncio.gather(*[_append(ml, 10, i * 10) for i in range(50)])
        firsts = sorted(r[1] for r in results)
        assert firsts == list(range(0, 500, 10))
        assert len({r[0] for r in results}) == 1
        assert len(calls) < 50, "appends were not grouped into fewer fsyncs"
        entries = await _read_all(ml)
        assert [e.entry_id for e in entries] == list(range(500))
        assert ml.last_confirmed() == MessageId(results[0][0], 499)
        await ml.close()

    arun(main())


def test_rollover_seals_to_parquet_and_reads_span_ledgers(tmp_path, arun):
    async def main():
        env = Env(tmp_path)
        ml = await env.open(max_entries=100)
        for i in range(10):
            await _append(ml, 50, i * 50)
        for _ in range(100):
            if len([i for i in ml.ledgers() if i.state == mpb.SEALED]) >= 4:
                break
            await asyncio.sleep(0.05)
        sealed = [i for i in ml.ledgers() if i.state == mpb.SEALED]
        assert len(sealed) >= 4 and all(i.path.endswith(".parquet") for i in sealed)
        assert all(os.path.exists(env.storage.full(i.path)) for i in sealed)
        entries = await _read_all(ml)
        assert [e.raw for e in entries] == [f"m{i}".encode() for i in range(500)]
        ids = [(e.ledger_id, e.entry_id) for e in entries]
        assert ids == sorted(ids)
        stored = mpb.LedgerList.FromString((await env.store.get(keys.ledgers(TOPIC))).value)
        assert [i.ledger_id for i in stored.ledgers] == [i.ledger_id for i in ml.ledgers()]
        await ml.close()

    arun(main())


def test_new_owner_seals_the_dead_owners_open_ledger(tmp_path, arun):
    async def main():
        env = Env(tmp_path)
        ml = await env.open()
        lid, _ = await _append(ml, 30)
        # the owner dies without closing; a new owner (new epoch) opens the topic
        ml2 = await env.open()
        infos = ml2.ledgers()
        assert infos[0].ledger_id == lid and infos[0].state == mpb.SEALED
        assert infos[0].entries == 30 and infos[-1].state == mpb.OPEN
        assert not os.path.exists(env.storage.wal_path(env.storage.wal_rel(TOPIC, lid)))
        assert [e.raw for e in await _read_all(ml2)] == [f"m{i}".encode() for i in range(30)]
        # the old owner is fenced at its next ledger-list write
        with pytest.raises(errors.Fenced):
            await ml.roll()
        with pytest.raises(errors.Fenced):
            await _append(ml, 1)
        await ml2.close()

    arun(main())


def test_expired_lease_acknowledges_nothing(tmp_path, arun, monkeypatch):
    """A broker whose lease may have lapsed stops acking, even for a batch already fsynced."""
    async def main():
        env = Env(tmp_path)
        valid = [True]
        ml = await env.open(lease_ok=lambda: valid[0])
        fenced = []
        ml.on_fenced = fenced.append
        await _append(ml, 2)
        real = wal.WalFile.write_sync

        def slow_write(self, data):
            real(self, data)
            valid[0] = False  # the lease deadline passes during the fsync

        monkeypatch.setattr(wal.WalFile, "write_sync", slow_write)
        with pytest.raises(errors.Fenced):
            await _append(ml, 2, 2)
        with pytest.raises(errors.Fenced):
            await _append(ml, 2, 4)
        assert fenced == [ml] and ml.fenced is not None
        await ml.close()

    arun(main())


def test_storage_full_acknowledges_nothing_then_recovers(tmp_path, arun, monkeypatch):
    """F8 at the ledger: a write that finds the disk full fails with StorageFull and
    acknowledges nothing of its group; once space is back, appends go on."""
    async def main():
        env = Env(tmp_path)
        ml = await env.open()
        await _append(ml, 5)
        real = wal.WalFile.write_sync

        def full(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(wal.WalFile, "write_sync", full)
        with pytest.raises(errors.StorageFull):
            await _append(ml, 5, 5)
        monkeypatch.setattr(wal.WalFile, "write_sync", real)
        lid, first = await _append(ml, 5, 100)
        assert first == 5
        entries = await _read_all(ml)
        assert [e.raw for e in entries] == [f"m{i}".encode() for i in [0, 1, 2, 3, 4,
                                                                      100, 101, 102, 103, 104]]
        await ml.close()

    arun(main())


def test_retention_and_truncate_delete_sealed_ledgers(tmp_path, arun):
    async def main():
        env = Env(tmp_path)
        ml = await env.open()
        for i in range(4):
            await _append(ml, 20, i * 20)
            await ml.roll()
        sealed = [i for i in ml.ledgers() if i.state == mpb.SEALED]
        assert len(sealed) == 4
        n, entries = await ml.apply_retention(-1, sealed[2].size_bytes + sealed[3].size_bytes)
        assert (n, entries) == (2, 40)
        assert not os.path.exists(env.storage.full(sealed[0].path))
        got = await _read_all(ml)
        assert got[0].ledger_id == sealed[2].ledger_id and len(got) == 40
        await _append(ml, 3, 500)
        n, entries = await ml.truncate()
        assert (n, entries) == (3, 43)
        assert await _read_all(ml) == [] and ml.last_confirmed() is None
        assert ml.entries_deleted == 83
        await ml.close()

    arun(main())


def test_order_is_kept_across_ledger_switches(tmp_path, arun):
    async def main():
        env = Env(tmp_path)
        ml = await env.open(max_entries=100)
        tasks = [asyncio.ensure_future(_append(ml, 7, i * 7)) for i in range(300)]
        results = await asyncio.gather(*tasks)
        assert results == sorted(results), "a later batch got an earlier id"
        entries = await _read_all(ml)
        assert [e.raw for e in entries] == [f"m{i}".encode() for i in range(2100)]
        sizes = [i.entries for i in ml.ledgers()]
        assert max(sizes) <= 106 and len(sizes) >= 20
        await ml.close()

    arun(main())


def test_concurrent_retention_and_truncate_count_each_ledger_once(tmp_path, arun):
    async def main():
        env = Env(tmp_path)
        ml = await env.open()
        for i in range(5):
            await _append(ml, 10, i * 10)
            await ml.roll()
        await asyncio.gather(ml.apply_retention(-1, 0), ml.apply_retention(-1, 0),
                             ml.truncate())
        assert ml.entries_deleted == 50
        assert ml.number_of_entries() == 0
        await ml.close()

    arun(main())


def test_quiet_ledger_rolls_by_age(tmp_path, arun):
    async def main():
        env = Env(tmp_path)
        ml = await env.open(max_age_s=0.2)
        assert not await ml.roll_if_aged()          # empty: nothing to roll
        lid, _ = await _append(ml, 3)
        assert not await ml.roll_if_aged()          # too young
        await asyncio.sleep(0.25)
        assert await ml.roll_if_aged()
        infos = ml.ledgers()
        assert infos[0].ledger_id == lid and infos[0].state == mpb.SEALED
        assert infos[-1].state == mpb.OPEN and infos[-1].entries == 0
        await ml.close()

    arun(main())


def test_new_owner_sweeps_orphan_files(tmp_path, arun):
    async def main():
        env = Env(tmp_path)
        ml = await env.open()
        await _append(ml, 4)
        sealed = await ml.roll()
        await ml.close()
        ldir = os.path.dirname(env.storage.full(sealed.path))
        wdir = os.path.dirname(env.storage.wal_path(env.storage.wal_rel(TOPIC, 1)))
        orphans = [os.path.join(ldir, "999.parquet"), os.path.join(ldir, ".5.parquet.tmp"),
                   os.path.join(wdir, "998.wal")]
        for path in orphans:
            with open(path, "wb") as f:
                f.write(b"left by a crash")
        ml2 = await env.open()
        assert not any(os.path.exists(p) for p in orphans)
        assert os.path.exists(env.storage.full(sealed.path))
        assert [e.raw for e in await _read_all(ml2)] == [f"m{i}".encode() for i in range(4)]
        await ml2.close()

    arun(main())


def test_listeners_hear_of_entries_trims_and_closing(tmp_path, arun):
    class Heard:
        def __init__(self):
            self.calls = []

        def on_entries(self):
            self.calls.append("entries")

        def on_trimmed(self, trimmed):
            self.calls.append(("trimmed", [r.ledger_id for r in trimmed.ledgers],
                               trimmed.entries))

        def on_closed(self, reason):
            self.calls.append(("closed", type(reason).__name__))

    async def main():
        env = Env(tmp_path)
        ml = await env.open()
        heard = Heard()
        ml.add_listener(heard)
        lid, _ = await _append(ml, 3)
        assert heard.calls == ["entries"]  # one call for the group commit, not per entry
        await ml.truncate()
        assert heard.calls[-1] == ("trimmed", [lid], 3)
        await ml.close()
        assert heard.calls[-1] == ("closed", "TopicNotOwned")
        assert ml.closed is not None

    arun(main())


@pytest.mark.parametrize("backend", ["memory",
                                     pytest.param("etcd", marks=pytest.mark.integration)])
def test_ledger_list_cas_retry_counts_each_ledger_once(tmp_path, request, backend):
    """A ledger-list write that loses its CAS (the list moved: e.g. a write whose reply was
    lost) re-reads the list and runs the mutation again; truncate of 3 ledgers still reports
    3 ledgers and their entries, and the stored counters count them once."""
    import uuid

    from shadowtopic.metadata.etcd import EtcdStore

    topic = TopicName.parse(f"persistent://t/ns-{uuid.uuid4().hex[:8]}/cas")

    async def main():
        if backend == "memory":
            store = MemoryStore()
        else:
            store = EtcdStore(request.getfixturevalue("etcd_server").endpoint, timeout=5.0)
        executor = ThreadPoolExecutor(4)
        try:
            own_key = keys.ownership("c", topic)
            value = mpb.Ownership(broker_id="b", epoch=1).SerializeToString()
            await store.put(own_key, value)
            ml = await ManagedLedger.open(topic, store, Storage(str(tmp_path / "s")), own_key,
                                          value, 1, executor, LedgerConfig())
            for i in range(3):
                await _append(ml, 10, i * 10)
                await ml.roll()
            list_key = keys.ledgers(topic)
            moved = [False]
            real_txn = store.txn

            async def txn_after_a_concurrent_rewrite(compares, ops):
                if not moved[0] and any(getattr(op, "key", None) == list_key for op in ops):
                    moved[0] = True  # the list changes between our read and our write
                    kv = await store.get(list_key)
                    await store.put(list_key, kv.value)
                return await real_txn(compares, ops)

            store.txn = txn_after_a_concurrent_rewrite
            assert await ml.truncate() == (3, 30)
            assert moved[0]
            stored = mpb.LedgerList.FromString((await store.get(list_key)).value)
            assert stored.entries_deleted == 30
            assert [i.state for i in stored.ledgers] == [mpb.OPEN]
            await ml.close()
        finally:
            await store.close()
            executor.shutdown(wait=True)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_ledger_list_reader_rereads_an_open_ledger_from_its_wal(tmp_path, arun):
    """What a reader without the writer's memory sees (a shadow, an evicted cache): the open
    ledger's entries come from its WAL, never beyond the confirmed count."""
    from shadowtopic.ledger.ledger_reader import LedgerListReader

    async def main():
        env = Env(tmp_path)
        ml = await env.open()
        await _append(ml, 4)
        sealed = await ml.roll()
        lid, _ = await _append(ml, 10, 4)
        confirmed = {lid: 7}
        reader = LedgerListReader(env.storage, env.executor,
                                  lambda: ml.ledger_list.current.ledgers,
                                  confirmed=lambda info: confirmed.get(info.ledger_id, 0))
        got = await reader.read(MessageId(0, 0), 100, 1 << 20)
        assert [e.raw for e in got] == [f"m{i}".encode() for i in range(11)]
        assert [e.ledger_id for e in got] == [sealed.ledger_id] * 4 + [lid] * 7
        assert reader.last_confirmed() == MessageId(lid, 6)
        assert reader.entries_between(MessageId(0, 0), MessageId(lid, 100)) == 11
        confirmed[lid] = 10  # more confirmed: read again from the (cached) WAL
        assert len(await reader.read(MessageId(lid, 7), 100, 1 << 20)) == 3
        assert await reader.position_at_time(0) == MessageId(sealed.ledger_id, 0)
        last_open = got[-1].publish_ms
        assert (await reader.position_at_time(last_open)).ledger_id == lid  # from the WAL
        assert await reader.position_at_time(last_open + 60_000) is None
        assert reader.valid_position(MessageId(sealed.ledger_id, 4), ml.next_position()) \
            == MessageId(lid, 0)
        await ml.close()

    arun(main())
