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
- catchup: a cluster whose storage root is a bucket on moto's S3 server (a process on a
  loopback port), brokers with their own WAL dirs (as on two machines: bench/shadows.py's
  `Pair`); a source of `--catchup-messages` JSON-like records (about 200 bytes), sealed in
  ledgers of at most 2 MiB (`ledger_max_bytes`) and rolled, so the history is in the bucket.
  Then in alternating rounds (A B C A B C ...): A = a new shadow's catch-up through
  `read_batch` (create_shadow_topic -> a reader from earliest has every message as record
  batches of 10,000), B = the S3 server's own GET time of the same bytes (every sealed file
  of the source, fetched whole through boto3 one after another, as the shadow broker reads
  them), C = NATS JetStream's mirror catch-up of as many messages of the same size
  (../shared/peers/nats_jetstream.py `--subs 0`, `mirror_catch_up_s`; skipped without the
  peers). Targets: NATS / A >= 5, or A / B <= 1.5 (medians of the paired ratios).
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


def catchup(a, peers: str | None) -> dict:
    """The `catchup` part (see the module's doc)."""
    bench = os.path.dirname(os.path.abspath(__file__))
    if bench not in sys.path:
        sys.path.insert(0, bench)
    from run import run_peer  # bench/run.py
    from shadows import Pair, _moto_s3  # bench/shadows.py

    from shadowtopic.client import Client, Policies
    from shadowtopic.core.names import TopicName
    from shadowtopic.ledger.storage import Storage
    n = a.catchup_messages
    d = tempfile.mkdtemp(prefix="shadowtopic-tables-catchup-")
    with _moto_s3()(d) as moto, Pair(d, "tables", split_wal=True, s3=moto) as pair, \
            Client(pair.url, timeout=120) as c:
        src = f"persistent://public/default/catchup-{uuid.uuid4().hex[:6]}"
        c.admin.create_topic(src, policies=Policies(ledger_max_bytes=2 << 20))
        with c.create_producer(src, batch_max_messages=1000) as p:
            for i, payload in enumerate(payloads("json", n)):
                p.send_async(payload, key=f"k{i % 1000}")
            p.flush(timeout=300)
        c.admin.roll_ledger(src)  # (returns once the last ledger's file is sealed and listed)
        last_id = c.admin.last_message_id(src)
        bucket, _, prefix = pair.root.removeprefix("s3://").partition("/")
        sealed = f"{prefix}/{Storage.topic_sealed_dir(TopicName.parse(src))}/"
        s3 = moto.client()
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=sealed,
                                                     MaxKeys=1000).get("Contents", [])]
        assert keys, f"no sealed file under s3://{bucket}/{sealed}"
        rounds = []
        for r in range(a.rounds):
            shadow = f"{src}-shadow-{r}"
            t0 = time.perf_counter()
            c.admin.create_shadow_topic(shadow, src)
            rows = 0
            with c.create_reader(shadow, "earliest") as reader:
                deadline = time.monotonic() + 600
                while rows < n:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"bench: catch-up: {rows} of {n} after 600 s")
                    batch = reader.read_batch(10_000, timeout=10)
                    rows += batch.num_rows
                    if rows == n:
                        last = (batch.column("ledger_id")[-1].as_py(),
                                batch.column("entry_id")[-1].as_py())
                        assert last == (last_id.ledger_id, last_id.entry_id), (last, last_id)
            t_a = time.perf_counter() - t0
            t0 = time.perf_counter()
            size = sum(len(s3.get_object(Bucket=bucket, Key=k)["Body"].read()) for k in keys)
            t_b = time.perf_counter() - t0
            row = {"read_batch_s": round(t_a, 3), "s3_get_s": round(t_b, 3),
                   "over_get": round(t_a / t_b, 2), "bytes": size, "files": len(keys),
                   "nats_mirror_s": None, "nats_over_ours": None}
            if peers:
                js = run_peer([sys.executable, os.path.join(peers, "nats_jetstream.py"),
                               "--messages", str(n), "--payload", "200", "--subs", "0"],
                              "nats_jetstream.py (mirror catch-up)")
                row["nats_mirror_s"] = (js or {}).get("mirror_catch_up_s")
                if row["nats_mirror_s"]:
                    row["nats_over_ours"] = round(row["nats_mirror_s"] / t_a, 2)
            rounds.append(row)
            print(f"catch-up round: {json.dumps(row)}", file=sys.stderr, flush=True)
    nats = [r["nats_over_ours"] for r in rounds if r["nats_over_ours"]]
    return {"messages": n, "rounds": rounds,
            "read_batch_s_median": statistics.median(r["read_batch_s"] for r in rounds),
            "over_get_median": statistics.median(r["over_get"] for r in rounds),
            "nats_over_ours_median": statistics.median(nats) if nats else None}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--payload", choices=["json", "random"], default="json")
    p.add_argument("--catchup-messages", type=int, default=100_000)
    p.add_argument("--parts", default="storage,read,catchup")
    p.add_argument("--shared", default=os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "..", "shared"))
    p.add_argument("--no-peers", action="store_true")
    a = p.parse_args(argv)
    parts = a.parts.split(",")
    peers = os.path.join(a.shared, "peers")
    peers = None if a.no_peers or not os.path.isdir(peers) else os.path.abspath(peers)
    out = {"args": vars(a), "storage": storage(a.keys) if "storage" in parts else {},
           "read": reads(a) if "read" in parts else None,
           "catchup": catchup(a, peers) if "catchup" in parts else None}
    print("| payload | message bytes | format 1 B/msg | format 2 B/msg | ratio |",
          file=sys.stderr)
    print("|---|---:|---:|---:|---:|", file=sys.stderr)
    for kind, s in out["storage"].items():
        print(f"| {kind} | {s['message_bytes']} | {s['format1_bytes_per_msg']} | "
              f"{s['format2_bytes_per_msg']} | {s['ratio']} |", file=sys.stderr)
    if out["read"]:
        print(f"read_table(compacted) / DuckDB direct, median of {a.rounds}: "
              f"{out['read']['ratio_median']}", file=sys.stderr)
    if out["catchup"]:
        cu = out["catchup"]
        print(f"catch-up of {cu['messages']:,} through read_batch from S3: median "
              f"{cu['read_batch_s_median']} s; / S3 GET of the same bytes "
              f"{cu['over_get_median']}x; NATS mirror / ours {cu['nats_over_ours_median']}x",
              file=sys.stderr)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
