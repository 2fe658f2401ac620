"""The ledger files as a data engineer reads them (docs/FORMAT.md): right after `roll-ledger`
the sealed ledger is listed and its file holds every message; DuckDB selects `payload`,
`properties`, `event_time`, the producer and the key as they were produced; the bytes a
consumer gets are the columns put back together."""
from __future__ import annotations

import json
import os
import random

import pyarrow.parquet as pq
import pytest
from support.etcd_support import on_etcd

from shadowtopic import columns
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

duckdb = pytest.importorskip("duckdb")


def test_duckdb_reads_what_was_produced_from_the_ledger_roll_ledger_sealed(
        client, broker, etcd_server, topic):
    rnd = random.Random(7)
    client.admin.create_topic(topic)
    sent = [json.dumps({"id": i, "user": f"u{rnd.randrange(10**6)}",
                        "price": round(rnd.random() * 100, 2)}).encode() for i in range(300)]
    with client.create_producer(topic, producer_name="orders-app") as p:
        ids = [p.send(payload, key=f"k{i % 11}", properties={"n": str(i), "src": "test"},
                      event_time=1_700_000_000_000 + i) for i, payload in enumerate(sent)]
    rolled = client.admin.roll_ledger(topic)
    # listed as sealed by the time the call returns (a query run right after sees it)
    name = TopicName.parse(topic)
    ledgers = mpb.LedgerList.FromString(
        on_etcd(etcd_server, lambda s: s.get(keys.ledgers(name))).value).ledgers
    [info] = [i for i in ledgers if i.ledger_id == ids[0].ledger_id]
    assert info.state == mpb.LedgerState.SEALED and rolled["entries"] == len(sent)
    path = Storage(os.path.join(broker.data_dir, "storage")).full(info.path)
    rows = duckdb.sql(
        f"select entry_id, key, payload, properties['n'], properties['src'], event_time, "
        f"producer_name, sequence_id, is_tombstone from read_parquet('{path}') "
        f"order by entry_id").fetchall()
    assert [bytes(r[2]) for r in rows] == sent
    assert [bytes(r[1]) for r in rows] == [f"k{i % 11}".encode() for i in range(300)]
    assert [(r[3], r[4]) for r in rows] == [(str(i), "test") for i in range(300)]
    assert [r[5] for r in rows] == [1_700_000_000_000 + i for i in range(300)]
    assert {r[6] for r in rows} == {"orders-app"} and not any(r[8] for r in rows)
    assert [r[7] for r in rows] == sorted(r[7] for r in rows)  # the producer's sequence
    table = pq.read_table(path)
    assert columns.version(table.schema) == columns.FORMAT
    with client.create_reader(topic, "earliest") as r:  # consumers get the bytes as sent
        got = [r.read_next(timeout=10) for _ in range(len(sent))]
    assert [m.payload for m in got] == sent
    assert [m.properties["n"] for m in got] == [str(i) for i in range(300)]
