"""Idempotent producing: the dedup map's rules (source/ledger/dedup.py), its check in the
managed ledger's writer, and its recovery from WAL frames and the seal snapshot."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import dedup as dedupmod
from shadowtopic.ledger.dedup import UNKNOWN, DedupMap, Duplicate
from shadowtopic.ledger.managed import LedgerConfig, ManagedLedger
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.storage.v1 import views_pb2

TOPIC = TopicName.parse("persistent://t/ns/dedup")


# ---- the map ---------------------------------------------------------------------------------

def _stored(m: DedupMap, name: str, first: int, count: int, lid: int = 1, entry: int = 0,
            ms: int = 1000) -> None:
    assert m.check(name, first, count) is None
    m.stage(name, first, count, lid, entry, ms)
    m.commit()


def test_new_batches_then_a_resend_is_a_duplicate_with_its_original_ids():
    m = DedupMap()
    assert m.last("p") == 0
    _stored(m, "p", 1, 10, lid=3, entry=0)
    _stored(m, "p", 11, 5, lid=3, entry=10)
    assert m.last("p") == 15
    assert m.check("p", 1, 10) == Duplicate(3, 0)
    assert m.check("p", 11, 5) == Duplicate(3, 10)
    assert m.check("p", 16, 1) is None
    assert m.check("q", 1, 10) is None  # per producer


def test_a_gap_is_accepted_overlap_and_never_stored_are_refused():
    m = DedupMap()
    _stored(m, "p", 1, 10, entry=0)
    # a gap: sequences 11..19 were given up (refused before the writer): accepted
    _stored(m, "p", 20, 5, entry=10)
    assert m.last("p") == 24
    with pytest.raises(errors.InvalidArgument, match="overlaps"):
        m.check("p", 22, 5)
    # 11..19 was never stored while a later batch was: neither stored now nor dropped
    with pytest.raises(errors.InvalidArgument, match="never stored"):
        m.check("p", 11, 9)


def test_a_duplicate_within_the_same_group_is_seen_and_rollback_forgets():
    m = DedupMap()
    assert m.check("p", 1, 3) is None
    m.stage("p", 1, 3, 7, 0, 1000)
    assert m.check("p", 1, 3) == Duplicate(7, 0)  # staged counts for the group
    m.rollback()  # the write failed: nothing of it is stored
    assert m.last("p") == 0 and m.check("p", 1, 3) is None


def test_older_than_the_remembered_batches_is_a_duplicate_without_ids():
    m = DedupMap()
    for k in range(dedupmod.RECENT + 5):
        _stored(m, "p", 1 + k, 1, entry=k)
    assert m.check("p", 1, 1) == UNKNOWN
    assert m.check("p", dedupmod.RECENT + 5, 1) == Duplicate(1, dedupmod.RECENT + 4)


def test_snapshot_and_load_merge_by_maximum():
    m = DedupMap()
    _stored(m, "a", 1, 10, ms=5000)
    _stored(m, "b", 1, 3, ms=6000)
    snap = mpb.DedupSnapshot.FromString(m.snapshot(4).SerializeToString())
    assert snap.ledger_id == 4
    assert {p.producer_name: (p.sequence_id, p.last_ms) for p in snap.producers} == {
        "a": (10, 5000), "b": (3, 6000)}
    n = DedupMap()
    n.record("a", 11, 5, 5, 0, 7000)   # a replayed WAL frame newer than the snapshot
    n.load(snap)
    n.record("b", 1, 3, 4, 0, 6000)    # replaying what the snapshot covers changes nothing
    assert (n.last("a"), n.last("b")) == (15, 3)
    assert n.check("b", 1, 3) == UNKNOWN  # a duplicate; where, the snapshot does not say
    assert n.check("a", 11, 5) == Duplicate(5, 0)


def test_idle_producers_expire():
    m = DedupMap(idle_s=60)
    _stored(m, "old", 1, 1, ms=1_000)
    _stored(m, "new", 1, 1, ms=50_000)
    assert m.expire(61_000 + 1) == 1
    assert m.last("old") == 0 and m.last("new") == 1
    assert m.check("old", 1, 1) is None  # forgotten: new again
    assert [p.producer_name for p in m.snapshot(1).producers] == ["new"]


# ---- in the managed ledger -------------------------------------------------------------------

class Env:
    def __init__(self, tmp_path):
        self.store = MemoryStore()
        self.storage = Storage(str(tmp_path / "storage"))
        self.executor = ThreadPoolExecutor(4)
        self.epoch = 0

    async def open(self, **cfg) -> ManagedLedger:
        self.epoch += 1
        own_key = keys.ownership("c", TOPIC)
        value = mpb.Ownership(broker_id="b", epoch=self.epoch).SerializeToString()
        await self.store.put(own_key, value)
        return await ManagedLedger.open(TOPIC, self.store, self.storage, own_key, value,
                                        self.epoch, self.executor, LedgerConfig(**cfg))

    async def ledger_list(self) -> mpb.LedgerList:
        kv = await self.store.get(keys.ledgers(TOPIC))
        return mpb.LedgerList.FromString(kv.value)


async def _send(ml, name: str, seq: int, n: int, tag: str = "m"):
    raws = [f"{tag}{seq + i}".encode() for i in range(n)]
    req = views_pb2.RawProduceRequest(topic=str(TOPIC), producer_name=name, sequence_id=seq,
                                      messages=raws).SerializeToString()
    return await ml.append_batch(raws, req, sum(map(len, raws)), (name, seq))


async def _payloads(ml) -> list[bytes]:
    from shadowtopic.core.message_id import MessageId
    out, pos = [], MessageId(0, 0)
    for _ in range(10_000):
        got = await ml.read(pos, 1000, 1 << 30)
        if not got:
            return out
        out += got
        pos = MessageId(got[-1].ledger_id, got[-1].entry_id + 1)
    raise AssertionError("read did not end")


def test_the_writer_drops_resends_even_in_the_same_group(tmp_path, arun):
    async def main():
        env = Env(tmp_path)
        ml = await env.open()
        a = await _send(ml, "p", 1, 3)
        assert a[2] is False
        # the resend of a stored batch and a resend queued right behind its original
        again, b, b_again = await asyncio.gather(_send(ml, "p", 1, 3), _send(ml, "p", 4, 2),
                                                 _send(ml, "p", 4, 2))
        assert again == (a[0], a[1], True)
        assert b[2] is False and b_again == (b[0], b[1], True)
        assert len(await _payloads(ml)) == 5
        assert ml.number_of_entries() == 5
        await ml.close()
    arun(main())


def test_sequences_survive_a_crash_from_the_wal_and_a_seal_from_the_snapshot(tmp_path, arun):
    async def main():
        env = Env(tmp_path)
        ml = await env.open()
        await _send(ml, "p", 1, 3)
        await ml.roll()                      # ledger sealed: its snapshot is in the list
        lst = await env.ledger_list()
        assert [(p.producer_name, p.sequence_id) for p in lst.dedup.producers] == [("p", 3)]
        first_after = await _send(ml, "p", 4, 2)
        await _send(ml, "q", 1, 1)
        # a crash: the open ledger's WAL stays OPEN for the next owner (no seal, no close)
        ml.fence(errors.Fenced("gone"))
        ml2 = await env.open()
        assert ml2.dedup.last("p") == 5 and ml2.dedup.last("q") == 1
        # the resend after the crash: its original ids, nothing stored twice
        assert await _send(ml2, "p", 4, 2) == (first_after[0], first_after[1], True)
        assert await _send(ml2, "p", 1, 3) == (0, 0, True)  # sealed: ids no longer known
        assert (await _send(ml2, "p", 6, 1))[2] is False
        assert [m.raw for m in await _payloads(ml2)] == [
            b"m1", b"m2", b"m3", b"m4", b"m5", b"m1", b"m6"]
        await ml2.close()
    arun(main())


def test_a_restart_never_rescans_sealed_ledgers(tmp_path, arun, monkeypatch):
    async def main():
        env = Env(tmp_path)
        ml = await env.open()
        await _send(ml, "p", 1, 3)
        await ml.roll()
        await ml.close()
        replayed = []
        real = DedupMap.record

        def spy(self, *args):
            replayed.append(args)
            return real(self, *args)
        monkeypatch.setattr(DedupMap, "record", spy)
        ml2 = await env.open()
        assert ml2.dedup.last("p") == 3
        assert replayed == [], "a sealed ledger's frames were replayed"
        await ml2.close()
    arun(main())


def test_unsequenced_batches_are_never_deduplicated(tmp_path, arun):
    async def main():
        env = Env(tmp_path)
        ml = await env.open()
        raws = [b"x"]
        req = views_pb2.RawProduceRequest(messages=raws).SerializeToString()
        r1 = await ml.append_batch(raws, req, 1)
        r2 = await ml.append_batch(raws, req, 1)
        assert not r1[2] and not r2[2] and r1[1] != r2[1]
        await ml.close()
    arun(main())
