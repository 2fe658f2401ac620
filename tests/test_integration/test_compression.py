"""Producer compression against a real broker: readers and consumers get every payload as
produced, tombstones stay tombstones, and the sealed ledger keeps the message as the producer
sent it (compressed), so the broker never spends CPU on it."""
from __future__ import annotations

import json
import os
import random

import pyarrow.parquet as pq
import pytest
from support.etcd_support import on_etcd

from shadowtopic import columns
from shadowtopic.client import compression, errors
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import common_pb2


def record(rnd: random.Random, i: int) -> dict:
    return {"id": i, "user": f"u{rnd.randrange(10**6)}", "score": round(rnd.random(), 4),
            "city": rnd.choice(["Lyon", "Oslo", "Lima", "Pune"]), "tags": ["a", "b"][: i % 3]}


def payloads(n: int) -> list[bytes]:
    """Mostly JSON documents of 20 records (~1.7 KB, varied values), one in ten random bytes
    (which do not compress: sent as they are), one in ten a single short record (which a
    codec's framing would make longer: sent as it is too)."""
    rnd = random.Random(5)
    out = []
    for i in range(n):
        if i % 10 == 9:
            out.append(os.urandom(rnd.randrange(50, 400)))
        elif i % 10 == 8:
            out.append(json.dumps(record(rnd, i)).encode())
        else:
            out.append(json.dumps([record(rnd, i * 20 + j) for j in range(20)]).encode())
    return out


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_compressed_messages_read_back_as_produced_and_are_stored_as_sent(
        client, broker, etcd_server, topic, codec):
    client.admin.create_topic(topic)
    sent = payloads(200)
    with client.create_producer(topic, compression_type=codec) as p:
        ids = [p.send(payload, key=f"k{i % 7}") for i, payload in enumerate(sent)]
        ids.append(p.send(b"", key="k0"))              # a delete stays a delete
    with client.create_reader(topic, "earliest") as r:
        got = [r.read_next(timeout=20) for _ in ids]
    assert [m.payload for m in got] == [*sent, b""]
    assert got[-1].is_tombstone and got[-1].key == b"k0"
    with client.subscribe(topic, "s", initial_position="earliest") as c:
        assert c.receive(timeout=20).payload == sent[0]

    client.admin.roll_ledger(topic)
    name = TopicName.parse(topic)
    ledgers = mpb.LedgerList.FromString(
        on_etcd(etcd_server, lambda s: s.get(keys.ledgers(name))).value)
    sealed = [info for info in ledgers.ledgers if info.state == mpb.LedgerState.SEALED]
    assert sealed
    st = Storage(os.path.join(broker.data_dir, "storage"))
    tables = [pq.read_table(st.full(info.path)) for info in sealed]
    raws = [raw for t in tables for raw in columns.raws(t).to_pylist()]
    stored = [common_pb2.Message.FromString(raw) for raw in raws]
    kind = compression.codec(codec)
    none = common_pb2.COMPRESSION_NONE
    assert [m.compression for m in stored] == [
        none if i % 10 >= 8 else kind for i in range(len(sent))] + [none]
    assert [compression.decompress(kind, m.payload, m.uncompressed_size) if m.compression
            else m.payload for m in stored[:-1]] == sent
    assert stored[-1].payload == b""
    documents = [(m, s) for i, (m, s) in enumerate(zip(stored, sent)) if i % 10 < 8]
    assert sum(len(m.payload) for m, _ in documents) < 0.6 * sum(len(s) for _, s in documents)


def test_an_unknown_compression_type_is_refused_before_anything_is_sent(client, topic):
    client.admin.create_topic(topic)
    with pytest.raises(errors.InvalidArgument, match="compression_type"):
        client.create_producer(topic, compression_type="snappy")


def test_the_cli_produces_compressed_and_reads_back_as_produced(cli, client, topic):
    client.admin.create_topic(topic)
    res = cli("produce", topic, "-m", '{"temp": 21.5}', "-k", "s1", "-z", "zstd", check=True)
    assert res.returncode == 0
    out = cli("read", topic, "-n", "1", check=True).stdout
    assert out.split("\t")[1:3] == ["s1", '{"temp": 21.5}\n'] or '{"temp": 21.5}' in out
    with client.create_reader(topic, "earliest") as r:
        assert r.read_next(timeout=20).payload == b'{"temp": 21.5}'
