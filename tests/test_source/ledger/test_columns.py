"""The columns of a ledger file (source/columns.py): every kind of stored entry is cut
into columns and rebuilt byte for byte; the parsed columns hold what the producer set;
format-1 tables upgrade to format 2; a sealed file's payload and properties read from
DuckDB as they were produced."""
from __future__ import annotations

import json
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shadowtopic import columns
from shadowtopic.ledger.sealed import SealedLedger, write_runs
from shadowtopic.ledger.storage import Storage
from shadowtopic.pb.v1 import common_pb2


def message(**kw) -> bytes:
    return common_pb2.Message(**kw).SerializeToString()


KINDS = {
    "keyed": message(key=b"k1", payload=b'{"a": 1}', properties={"trace": "t-1"},
                     event_time=1700000000000, producer_name="p-1", sequence_id=7),
    "keyless": message(payload=b"plain"),
    "tombstone": message(key=b"gone"),
    "compressed": message(key=b"z", payload=b"\x28\xb5\x2f\xfd...", compression=2,
                          uncompressed_size=99),
    "large": message(key=b"big", payload=os.urandom(64 << 10)),  # zero-copy path
    "empty": b"",
    "opaque": b"\xff\xfe not a message",
    # the key's bytes hold the payload's tag, length and bytes: the cut is still exact
    "tricky key": message(key=b"\x12\x05hello", payload=b"hello"),
    # fields out of the usual order (another client's serializer): parsed whole
    "out of order": message(properties={"q": "r"}) + message(key=b"kk", payload=b"after"),
}


def table_of(raws: list[bytes]) -> pa.Table:
    rows = columns.Rows()
    rows.extend([memoryview(r) for r in raws])  # as a seal hands them: views of the WAL
    n = len(raws)
    return pa.table({"ledger_id": [1] * n, "entry_id": list(range(n)),
                     "publish_time": [0] * n, **rows.arrays()}).select(
        columns.SCHEMA.names).cast(columns.SCHEMA)


def test_every_kind_of_entry_is_rebuilt_byte_for_byte():
    raws = list(KINDS.values())
    t = table_of(raws)
    assert columns.raws(t).to_pylist() == raws
    row = dict(zip(KINDS, t.to_pylist(), strict=True))
    assert row["keyed"]["payload"] == b'{"a": 1}' and row["keyed"]["key"] == b"k1"
    assert row["keyed"]["properties"] == [("trace", "t-1")]
    assert (row["keyed"]["event_time"], row["keyed"]["producer_name"],
            row["keyed"]["sequence_id"]) == (1700000000000, "p-1", 7)
    assert row["tombstone"]["is_tombstone"] and row["tombstone"]["payload"] == b""
    assert row["compressed"]["compression"] == "zstd"
    assert row["keyless"]["key"] is None and row["keyless"]["compression"] is None
    assert row["opaque"]["payload"] is None and row["opaque"]["head"] == KINDS["opaque"]
    assert row["tricky key"]["payload"] == b"hello" and row["tricky key"]["key"] == b"\x12\x05hello"
    assert row["out of order"]["payload"] == b"after"
    assert row["out of order"]["properties"] == [("q", "r")]
    assert len(row["large"]["payload"]) == 64 << 10


def test_random_messages_round_trip():
    rng = random.Random(32)
    raws = []
    for i in range(2000):
        kw = {"payload": rng.randbytes(rng.choice([0, 1, 10, 200, 5000]))}
        if rng.random() < 0.8:
            kw["key"] = rng.randbytes(rng.randrange(0, 40))
        if rng.random() < 0.5:
            kw["properties"] = {f"p{j}": str(rng.random()) for j in range(rng.randrange(4))}
        if rng.random() < 0.5:
            kw["event_time"] = rng.randrange(1, 1 << 42)
            kw["sequence_id"] = i + 1
        raws.append(message(**kw))
    t = table_of(raws)
    assert columns.raws(t).to_pylist() == raws
    assert t.column("payload").to_pylist() == [
        common_pb2.Message.FromString(r).payload for r in raws]


def test_a_format_1_table_upgrades_to_the_same_rows():
    raws = list(KINDS.values())
    v2 = table_of(raws)
    v1 = pa.table({"ledger_id": v2["ledger_id"], "entry_id": v2["entry_id"],
                   "key": v2["key"], "is_tombstone": v2["is_tombstone"],
                   "publish_time": v2["publish_time"], "raw": pa.array(raws, pa.binary())},
                  schema=columns.SCHEMA_V1)
    assert columns.version(v1.schema) == 1 and columns.version(v2.schema) == 2
    up = columns.upgrade(v1)
    assert up.equals(v2)
    assert columns.raws(v1).to_pylist() == raws
    assert columns.upgrade(v2) is v2


def test_duckdb_reads_payload_and_properties_of_a_sealed_file(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    records = [json.dumps({"id": i, "user": f"u{i % 7}", "score": i * 1.5}).encode()
               for i in range(500)]
    raws = [message(key=f"k{i}".encode(), payload=r, properties={"n": str(i)},
                    event_time=1000 + i) for i, r in enumerate(records)]
    st = Storage(str(tmp_path))
    path = st.full("l/3.parquet")
    res = write_runs(st.fs, path, [(5, raws[:250]), (6, raws[250:])], ledger_id=3)
    got = duckdb.sql(f"select entry_id, payload, properties['n'] as n, event_time "
                     f"from read_parquet('{path}') order by entry_id").fetchall()
    assert [bytes(r[1]) for r in got] == records
    assert [r[2] for r in got] == [str(i) for i in range(500)]
    assert [r[3] for r in got] == [1000 + i for i in range(500)]
    assert SealedLedger(st.fs, path, res.crc32c).read(0, 1000, 1 << 30) == (
        [5] * 250 + [6] * 250, raws)
    assert columns.version(pq.read_schema(path)) == columns.FORMAT
