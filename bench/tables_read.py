#!/usr/bin/env python3
"""Topics as tables (issue 32): what reading a topic as Arrow costs beside reading its files
directly, and what format 2 costs in storage.

    .venv/bin/python bench/tables_read.py [--keys 100000] [--rounds 5] [--payload json|random]

- read: one broker; a topic of `--keys` keys (one message each, JSON-like records of about
  200 bytes with varied values, or random bytes), sealed, and compacted by the real
  compaction job (a Spark worker); then in alternating rounds (A B A B ...):
  A = `client.read_table(topic, compacted=True)` (the broker streams the compacted file's
  columns as Arrow IPC), B = DuckDB reading the same compacted Parquet file(s) directly into
  Arrow (`read_parquet(...).arrow()`, the format's physical limit). Target: A within 2x of B
  (the median of the paired ratios A/B).
- storage: `--keys` messages sealed in format 2 (source/ledger/sealed.py) beside the same
  rows written as format 1 (`raw`, the previous writer's options): bytes per message, for
  JSON records and for random bytes. Target: format 2 at most 10% over format 1.
Prints one JSON document, and Markdown tables on stderr. Bounded by its arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid


def payloads(kind: str, n: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    if kind == "random":
        return [rng.randbytes(200) for _ in range(n)]
    return [json.dumps({"id": i, "user": f"user-{rng.randrange(100000)}",
                        "event": rng.choice(["click", "view", "buy", "cart"]),
                        "price": round(rng.random() * 1000, 2), "ts": 1700000000000 + i * 13,
                        "tags": [rng.choice("abcdefgh") for _ in range(3)],
                        "session": f"{rng.getrandbits(64):016x}"}).encode()
            for i in range(n)]


def storage(n: int) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shadowtopic import columns
    from shadowtopic.ledger.sealed import write_runs
    from shadowtopic.ledger.storage import Storage
    from shadowtopic.pb.v1 import common_pb2
    out = {}
    for kind in ("json", "random"):
        raws = [common_pb2.Message(key=f"k{i % 10000}".encode(), payload=p, producer_name="p-1",
                                   sequence_id=i + 1, event_time=1700000000000 + i,
                                   properties={"src": "bench"} if i % 2 else {}
                                   ).SerializeToString()
                for i, p in enumerate(payloads(kind, n))]
        st = Storage(tempfile.mkdtemp(prefix="shadowtopic-format-"))
        write_runs(st.fs, st.full("v2.parquet"),
                   [(1700000000000 + j, raws[j:j + 1000]) for j in range(0, n, 1000)],
                   ledger_id=1)
        rows = columns.Rows()
        rows.extend(raws)
        a = rows.arrays()
        v1 = pa.table({"ledger_id": pa.array([1] * n, pa.int64()),
                       "entry_id": pa.array(range(n), pa.int64()), "key": a["key"],
                       "is_tombstone": a["is_tombstone"],
                       "publish_time": pa.array([1700000000000 + (j // 1000) * 1000
                                                 for j in range(n)], pa.int64()),
                       "raw": pa.array(raws, pa.binary())}, schema=columns.SCHEMA_V1)
        group = pq.ParquetFile(st.full("v2.parquet")).metadata.row_group(0).num_rows
        pq.write_table(v1, st.full("v1.parquet"), row_group_size=group, compression="zstd",
                       write_page_checksum=True, write_statistics=["entry_id", "publish_time"],
                       use_dictionary=["ledger_id", "key", "publish_time"])
        s1, s2 = (os.path.getsize(st.full(f)) for f in ("v1.parquet", "v2.parquet"))
        out[kind] = {"message_bytes": round(sum(map(len, raws)) / n, 1),
                     "format1_bytes_per_msg": round(s1 / n, 1),
                     "format2_bytes_per_msg": round(s2 / n, 1), "ratio": round(s2 / s1, 3)}
    return out


def reads(a) -> dict:
    import duckdb

    from shadowtopic.client import Client
    from shadowtopic.testing import COMPACTION_WORKER, start_broker, start_etcd
    d = tempfile.mkdtemp(prefix="shadowtopic-tables-bench-")
    etcd = start_etcd(os.path.join(d, "etcd"))
    procs = []
    try:
        broker = start_broker(etcd.endpoint, os.path.join(d, "broker"),
                              args=["--cluster", "bench", "--metrics-port", "-1"])
        procs.append(broker)
        worker = start_broker(etcd.endpoint, os.path.join(d, "worker"),
                              module=COMPACTION_WORKER, timeout=180,
                              args=["--cluster", "bench", "--spark-master", "local[2]"])
        procs.append(worker)
        topic = f"persistent://public/default/tables-{uuid.uuid4().hex[:6]}"
        with Client(broker.url, timeout=120) as c:
            c.admin.create_topic(topic)
            with c.create_producer(topic, batch_max_messages=1000) as p:
                for i, payload in enumerate(payloads(a.payload, a.keys)):
                    p.send_async(payload, key=f"k{i}")
                p.flush(timeout=300)
            c.admin.roll_ledger(topic)
            job = c.admin.compact(topic)
            deadline = time.monotonic() + 600
            while c.admin.compaction_status(topic).phase != "done":
                assert time.monotonic() < deadline, "the compaction did not finish"
                time.sleep(0.5)
            root = os.path.join(d, "broker", "storage", "compacted")
            files = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs
                           if f.endswith(".parquet") and job in dp)
            assert files, "no compacted file found"
            rounds = []
            for _ in range(a.rounds):
                t0 = time.perf_counter()
                table = c.read_table(topic, compacted=True)
                t_a = time.perf_counter() - t0
                t0 = time.perf_counter()
                direct = duckdb.sql(f"select * from read_parquet({files!r})").to_arrow_table()
                t_b = time.perf_counter() - t0
                assert table.num_rows == direct.num_rows == a.keys, (table.num_rows,
                                                                     direct.num_rows)
                rounds.append({"read_table_s": round(t_a, 4), "duckdb_s": round(t_b, 4),
                               "ratio": round(t_a / t_b, 2)})
                print(f"round: {json.dumps(rounds[-1])}", file=sys.stderr, flush=True)
        return {"rounds": rounds, "ratio_median": statistics.median(r["ratio"] for r in rounds),
                "files": len(files)}
    finally:
        for p in procs:
            p.kill()
        etcd.kill()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--payload", choices=["json", "random"], default="json")
    a = p.parse_args(argv)
    out = {"args": vars(a), "storage": storage(a.keys), "read": reads(a)}
    print("| payload | message bytes | format 1 B/msg | format 2 B/msg | ratio |",
          file=sys.stderr)
    print("|---|---:|---:|---:|---:|", file=sys.stderr)
    for kind, s in out["storage"].items():
        print(f"| {kind} | {s['message_bytes']} | {s['format1_bytes_per_msg']} | "
              f"{s['format2_bytes_per_msg']} | {s['ratio']} |", file=sys.stderr)
    print(f"read_table(compacted) / DuckDB direct, median of {a.rounds}: "
          f"{out['read']['ratio_median']}", file=sys.stderr)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
