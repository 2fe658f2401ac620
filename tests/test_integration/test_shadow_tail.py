"""The live tail without a shared disk: `Storage.ReadEntries` (source/broker/storage_service.py)
and a shadow broker that reads its source's unsealed entries from the source's owner
(shadow/tail.py).

One source broker and one shadow broker (a cluster of their own) with DIFFERENT data dirs
and WAL dirs (`--wal-dir`) and one storage root for sealed ledgers: the shadow broker's WAL
root does not hold the source's WAL files, so an unsealed entry can reach a reader of the
shadow only through `ReadEntries` on the source broker.
"""
from __future__ import annotations

import os
import signal
import uuid

import grpc
import pytest
from support.waiting import drain, wait_for

from shadowtopic.broker.server import free_port
from shadowtopic.broker.storage_service import FRAME_BYTES
from shadowtopic.client import Client, Policies
from shadowtopic.core.errors import REASON_KEY
from shadowtopic.core.names import canonical
from shadowtopic.pb.v1 import common_pb2, storage_pb2
from shadowtopic.standalone import BrokerProcess


@pytest.fixture(scope="module")
def pair(etcd_server, tmp_path_factory):
    """(source broker, shadow broker): own data dirs, own WAL dirs, one storage root."""
    base = tmp_path_factory.mktemp("shadow-tail")
    shared = str(base / "shared-storage")
    common = ["--lease-ttl", "3", "--storage-root", shared,
              "--cluster", f"c-{uuid.uuid4().hex[:8]}"]
    src = BrokerProcess(etcd_server.endpoint, str(base / "src"), free_port(),
                        extra_args=[*common, "--wal-dir", str(base / "src-wal")])
    sh = BrokerProcess(etcd_server.endpoint, str(base / "sh"), free_port(),
                       extra_args=[*common, "--wal-dir", str(base / "sh-wal")],
                       module="shadowtopic.shadow.broker")
    src.start(timeout=60)
    sh.start(timeout=60)
    src.wal_dir, sh.wal_dir = str(base / "src-wal"), str(base / "sh-wal")
    try:
        yield src, sh
    finally:
        for b in (src, sh):
            if b.proc is not None and b.proc.poll() is None:
                os.kill(b.proc.pid, signal.SIGCONT)
            b.kill()


@pytest.fixture
def topic():
    return f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"


def read_entries(url: str, topic: str, ledger_id: int, from_entry: int = 0,
                 max_entries: int = 0, max_bytes: int = 0) -> list[storage_pb2.ReadEntriesResponse]:
    with grpc.insecure_channel(url, options=[("grpc.max_receive_message_length",
                                              80 << 20)]) as ch:
        call = ch.unary_stream("/shadowtopic.v1.Storage/ReadEntries",
                               request_serializer=storage_pb2.ReadEntriesRequest.SerializeToString,
                               response_deserializer=storage_pb2.ReadEntriesResponse.FromString)
        return list(call(storage_pb2.ReadEntriesRequest(
            topic=topic, ledger_id=ledger_id, from_entry=from_entry, max_entries=max_entries,
            max_bytes=max_bytes), timeout=30))


def entries(url: str, *args, **kw) -> list[common_pb2.EncodedEntry]:
    return [e for r in read_entries(url, *args, **kw) for e in r.entries]


def refused(url: str, *args, **kw) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.RpcError) as info:
        read_entries(url, *args, **kw)
    exc = info.value
    reason = dict(exc.trailing_metadata() or ()).get(REASON_KEY, "")
    return exc.code(), reason, exc.details()


def payloads(got: list[common_pb2.EncodedEntry]) -> list[bytes]:
    return [common_pb2.Message.FromString(e.raw).payload for e in got]


def ledgers(c: Client, topic: str) -> list[dict]:
    return c.admin.internal_stats(topic)["ledgers"]


def files_under(root: str) -> list[str]:
    return [os.path.join(d, n) for d, _, names in os.walk(root) for n in names
            if n.endswith(".wal")]


# ---- Storage.ReadEntries ------------------------------------------------------------------

def test_read_entries_gives_what_the_producer_stored_open_and_sealed(pair, topic):
    src, _ = pair
    with Client(src.url) as c:
        c.admin.create_topic(topic, policies=Policies(ledger_max_entries=100_000))
        with c.create_producer(topic) as p:
            ids = [p.send(f"m{i}".encode(), key=f"k{i % 3}") for i in range(30)]
        lid = ids[0].ledger_id
        assert {i.ledger_id for i in ids} == {lid}
        assert [l["state"] for l in ledgers(c, topic) if int(l["ledgerId"]) == lid] == ["OPEN"]
        name = canonical(topic)
        got = entries(src.url, name, lid)  # the open ledger: memory / WAL
        assert [(e.ledger_id, e.entry_id) for e in got] == \
            [(i.ledger_id, i.entry_id) for i in ids]
        assert payloads(got) == [f"m{i}".encode() for i in range(30)]
        assert all(e.publish_time > 0 for e in got)
        # bounds: entries, a start, bytes (the entry passing max_bytes is the last one)
        assert [e.entry_id for e in entries(src.url, name, lid, max_entries=7)] == \
            list(range(7))
        assert [e.entry_id for e in entries(src.url, name, lid, from_entry=25)] == \
            list(range(25, 30))
        assert [e.entry_id for e in entries(src.url, name, lid, from_entry=3, max_bytes=1)] \
            == [3]
        two = len(got[0].raw) + 1
        assert len(entries(src.url, name, lid, max_bytes=two)) == 2
        assert read_entries(src.url, name, lid, from_entry=30) == []  # past the end
        # sealed: the same bytes from Parquet
        c.admin.roll_ledger(topic)
        wait_for(lambda: [l["state"] for l in ledgers(c, topic)
                          if int(l["ledgerId"]) == lid] == ["SEALED"], what="the seal")
        assert entries(src.url, name, lid) == got
        with c.create_producer(topic) as p:
            later = p.send(b"after the roll")
        assert later.ledger_id != lid  # one read never crosses into the next ledger
        assert entries(src.url, name, lid, from_entry=28) == got[28:]


def test_read_entries_cuts_big_reads_into_frames(pair, topic):
    src, _ = pair
    size = 400 << 10
    with Client(src.url) as c:
        c.admin.create_topic(topic)
        with c.create_producer(topic) as p:
            ids = [p.send(bytes([i]) * size) for i in range(5)]
    frames = read_entries(src.url, canonical(topic), ids[0].ledger_id)
    assert len(frames) >= 2
    for f in frames:
        assert len(f.entries) == 1 or sum(len(e.raw) for e in f.entries) <= FRAME_BYTES
    got = [e for f in frames for e in f.entries]
    assert [e.entry_id for e in got] == [i.entry_id for i in ids]
    assert payloads(got) == [bytes([i]) * size for i in range(5)]


def test_read_entries_refuses_what_it_does_not_serve_with_a_reason(pair, topic):
    src, sh = pair
    with Client(src.url) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(f"{topic}-shadow", topic)
        with c.create_producer(topic) as p:
            mid = p.send(b"x")
        with c.create_reader(f"{topic}-shadow", start="earliest") as r:
            r.read_next(timeout=20)  # the shadow is loaded on the shadow broker
    name = canonical(topic)
    code, reason, details = refused(src.url, name + "-missing", 1)
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "TopicNotFound"), details
    code, reason, details = refused(src.url, "persistent://a/b/c/d/e", 1)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "InvalidTopicName"), details
    code, reason, details = refused(src.url, name, mid.ledger_id + 1000)
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "LedgerNotFound"), details
    code, reason, details = refused(sh.url, name, mid.ledger_id)  # not the owner
    assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "TopicNotOwned"), details
    assert src.url in details
    code, reason, details = refused(sh.url, canonical(f"{topic}-shadow"), mid.ledger_id)
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "NotAllowed"), details


# ---- a shadow broker with a WAL root of its own ---------------------------------------------

def test_a_shadow_without_the_sources_wal_serves_the_unsealed_tail(pair, topic):
    src, sh = pair
    shadow = f"{topic}-shadow"
    with Client(src.url) as c:
        c.admin.create_topic(topic, policies=Policies(ledger_max_entries=100_000))
        with c.create_producer(topic) as p:
            before = [p.send(f"b{i}".encode()) for i in range(20)]  # before the shadow
        c.admin.create_shadow_topic(shadow, topic)
        with c.subscribe(shadow, "s", initial_position="earliest") as cons:
            got = drain(cons, 20)
            tail = c.create_reader(shadow, start="latest")  # after what the shadow has
            with c.create_producer(topic) as p:
                live = [p.send(f"l{i}".encode()) for i in range(30)]
            want = before + live
            got += drain(cons, 30)
            assert [(m.message_id.ledger_id, m.message_id.entry_id) for m in got] == \
                [(i.ledger_id, i.entry_id) for i in want]
            assert [m.payload for m in got] == \
                [f"b{i}".encode() for i in range(20)] + [f"l{i}".encode() for i in range(30)]
            seen = [tail.read_next(timeout=20) for _ in range(30)]
            tail.close()
            assert [(m.message_id.ledger_id, m.message_id.entry_id) for m in seen] == \
                [(i.ledger_id, i.entry_id) for i in live]
        # every message came from an unsealed ledger: the source's WAL, which is not under
        # the shadow broker's WAL root (nor in the shared root), and no Parquet file of it
        lid = want[0].ledger_id
        assert {i.ledger_id for i in want} == {lid}
        assert [l["state"] for l in ledgers(c, topic) if int(l["ledgerId"]) == lid] == ["OPEN"]
        src_wals = files_under(src.wal_dir)
        assert any(w.endswith(f"/{lid}.wal") for w in src_wals)
        assert files_under(sh.wal_dir) == []
        shared = os.path.dirname(src.data_dir) + "/shared-storage"
        assert files_under(shared) == []
        assert not [f for _, _, names in os.walk(shared) for f in names
                    if f.startswith(f"{lid}-") and f.endswith(".parquet")]
        with open(sh.log_path, encoding="utf-8", errors="replace") as f:
            assert "reading unsealed entries from the source's owner" in f.read()


def test_a_shadow_follows_rolls_without_the_sources_wal(pair, topic):
    src, _ = pair
    shadow = f"{topic}-shadow"
    with Client(src.url) as c:
        c.admin.create_topic(topic, policies=Policies(ledger_max_entries=15))
        c.admin.create_shadow_topic(shadow, topic)
        with c.subscribe(shadow, "s", initial_position="earliest") as cons:
            with c.create_producer(topic) as p:
                ids = [p.send(f"m{i}".encode()) for i in range(40)]  # rolls twice
            assert len({i.ledger_id for i in ids}) == 3
            got = drain(cons, 40)
            assert [(m.message_id.ledger_id, m.message_id.entry_id) for m in got] == \
                [(i.ledger_id, i.entry_id) for i in ids]
