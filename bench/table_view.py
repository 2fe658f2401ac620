#!/usr/bin/env python3
"""A table view loading `--keys` (100,000) keys beside the compacted reader that loads the
same keys by hand (issue 30: the view within 2x of the reader's load time), in alternating
rounds (A B A B ...) against a real etcd and broker process.

    .venv/bin/python bench/table_view.py [--keys 100000] [--rounds 5]

The topic holds one message per key (JSON-like records of about 150 bytes with varied values),
sealed to Parquet by a `roll-ledger`, so both read the same sealed ledger through the same
compacted view (no compaction ran: the view is then the whole topic). Each round:
- A, the reader: `create_reader(topic, "earliest", read_compacted=True)`, then
  `while r.has_message_available(): latest[msg.key] = msg` (the hand-written loop a table
  view replaces);
- B, the view: `client.table_view(topic)` until it returns (it holds every key then).
Each is timed from the call that opens it to the last key held (wall seconds) and by the
client process's CPU over the same span; the report gives each side's median and the median
of the paired ratios B / A. One client per round, closed after it. Bounded by `--keys` and
`--rounds`. `make bench` runs it as its part `table-view` (bench/run.py, `--table-view-keys`).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

TOPIC = "persistent://public/bench-table/view"


def records(n: int, seed: int = 1) -> list[tuple[str, bytes]]:
    rnd = random.Random(seed)
    cities = ["Lyon", "Oslo", "Lima", "Pune", "Kyiv", "Cusco", "Accra"]
    return [(f"user-{i:06d}", json.dumps({
        "id": i, "name": f"u{rnd.randrange(10**9)}", "city": rnd.choice(cities),
        "balance": round(rnd.random() * 1e5, 2), "active": rnd.random() < 0.8,
        "tags": rnd.sample(["a", "b", "c", "d", "e"], rnd.randrange(0, 4))}).encode())
        for i in range(n)]


def load_with_reader(client, keys: int) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    latest = {}
    with client.create_reader(TOPIC, "earliest", read_compacted=True) as r:
        while r.has_message_available():
            msg = r.read_next(timeout=60)
            if msg.key is not None:
                latest[msg.key] = msg
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert len(latest) == keys, len(latest)
    return {"seconds": round(took, 3), "client_cpu_s": round(cpu, 3)}


def load_with_view(client, keys: int) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    view = client.table_view(TOPIC, timeout=300)
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    try:
        assert len(view) == keys, len(view)
    finally:
        view.close()
    return {"seconds": round(took, 3), "client_cpu_s": round(cpu, 3)}


def run_table_view(data_dir: str | None, keys: int, rounds: int) -> dict:
    """The bench (its etcd and broker under `data_dir`); returns its figures."""
    from shadowtopic.client import Client
    from shadowtopic.testing import Standalone

    out = []
    with Standalone(data_dir, shadow=False).start() as sa:
        with Client(sa.url, timeout=60) as c:
            c.admin.create_topic(TOPIC)
            with c.create_producer(TOPIC, linger_ms=20) as p:
                for key, payload in records(keys):
                    p.send_async(payload, key=key)
                p.flush()
            c.admin.roll_ledger(TOPIC)
        for i in range(rounds):
            pair = {}
            for side, load in (("reader", load_with_reader), ("view", load_with_view)):
                with Client(sa.url, timeout=60) as c:
                    pair[side] = load(c, keys)
            pair["ratio"] = round(pair["view"]["seconds"] / pair["reader"]["seconds"], 3)
            out.append(pair)
            print(f"  round {i + 1}: {pair}", flush=True)
    med = statistics.median
    return {
        "keys": keys, "rounds": out,
        "reader_seconds_median": med(r["reader"]["seconds"] for r in out),
        "view_seconds_median": med(r["view"]["seconds"] for r in out),
        "reader_client_cpu_us_per_key": round(
            med(r["reader"]["client_cpu_s"] for r in out) / keys * 1e6, 2),
        "view_client_cpu_us_per_key": round(
            med(r["view"]["client_cpu_s"] for r in out) / keys * 1e6, 2),
        "ratio_median": med(r["ratio"] for r in out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(json.dumps(run_table_view(None, args.keys, args.rounds)))


if __name__ == "__main__":
    main()
