#!/usr/bin/env python3
"""Produce A/B: idempotent producing (deduplication) on vs off, in alternating rounds.

    .venv/bin/python bench/produce_dedup.py [--messages 200000] [--pairs 4] [--producers 2]

One real etcd and one broker process; each pair runs a round with `idempotent=False` and
one with `idempotent=True` (the default), in alternating order (off-on, on-off, ...) so
both meet the same noise of the shared machine, each on a fresh topic with the same load
as bench/run.py's produce figure (`--producers` processes, `send_async`, a callback on
every 10th message, everything must be acked). Prints each round and the median of the
paired ratios on / off of acked msgs/s (1.0 = no cost) and of p50 latency; `--json`
writes them. Nothing else is touched (bench/RESULTS.md is written by hand).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _producer(url: str, topic: str, count: int, payload: int, start_at: float,
              idempotent: bool, out) -> None:
    from source.client import Client

    sends: list[float] = []
    acks: list[float] = []
    now = time.perf_counter

    def done(mid, exc):
        acks.append(now())

    data = b"x" * payload
    keys = [f"k{i}" for i in range(1000)]
    with Client(url, timeout=60) as client:
        producer = client.create_producer(topic, idempotent=idempotent)
        while time.time() < start_at:
            time.sleep(0.001)
        t0 = now()
        for i in range(count):
            if i % 10:
                producer.send_async(data, key=keys[i % 1000])
            else:
                sends.append(now())
                producer.send_async(data, key=keys[i % 1000], callback=done)
        producer.flush(timeout=120)
        t1 = now()
        stats = producer.stats()
        producer.close()
    off = time.time() - time.perf_counter()
    out.put({"acked": stats["acked"], "t0": t0 + off, "t1": t1 + off,
             "lat": [a - s for s, a in zip(sends, acks)]})


def one_round(url: str, messages: int, producers: int, payload: int, idempotent: bool
              ) -> dict:
    from source.client import Client

    topic = f"persistent://public/bench/dedup-{uuid.uuid4().hex[:8]}"
    with Client(url) as c:
        c.admin.create_topic(topic)
    ctx = mp.get_context("spawn")  # gRPC channels do not survive fork
    q = ctx.Queue()
    per = messages // producers
    start_at = time.time() + 3.0
    procs = [ctx.Process(target=_producer,
                         args=(url, topic, per, payload, start_at, idempotent, q))
             for _ in range(producers)]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(30)
    acked = sum(r["acked"] for r in results)
    if acked != per * producers:
        raise SystemExit(f"bench: only {acked} of {per * producers} messages were acked")
    dt = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    lat = sorted(x for r in results for x in r["lat"])
    return {"idempotent": idempotent, "msgs_per_s": round(acked / dt),
            "p50_ms": round(lat[len(lat) // 2] * 1000, 2),
            "p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--payload", type=int, default=100)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    from source.broker.server import free_port
    from source.metadata.etcd_server import EtcdServer
    from source.standalone import BrokerProcess

    pairs = []
    with tempfile.TemporaryDirectory() as data_dir, \
            EtcdServer(os.path.join(data_dir, "etcd")) as etcd:
        etcd.start()
        broker = BrokerProcess(etcd.endpoint, os.path.join(data_dir, "broker"), free_port())
        broker.start(timeout=60)
        try:
            for i in range(a.pairs):
                order = (False, True) if i % 2 == 0 else (True, False)
                got = {}
                for idem in order:
                    got[idem] = one_round(broker.url, a.messages, a.producers, a.payload, idem)
                    print(f"pair {i + 1} {'on ' if idem else 'off'}: {got[idem]}", flush=True)
                pairs.append({"off": got[False], "on": got[True],
                              "rate_ratio": got[True]["msgs_per_s"] / got[False]["msgs_per_s"],
                              "p50_ratio": got[True]["p50_ms"] / got[False]["p50_ms"]})
        finally:
            broker.kill()
    rate = statistics.median(x["rate_ratio"] for x in pairs)
    p50 = statistics.median(x["p50_ratio"] for x in pairs)
    print(f"median paired ratio on/off: msgs/s {rate:.3f}, p50 latency {p50:.3f} "
          f"({a.pairs} pairs, {a.messages:,} messages a round, {a.producers} producers)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"pairs": pairs, "median_rate_ratio": rate, "median_p50_ratio": p50,
                       "args": vars(a)}, f, indent=1)


if __name__ == "__main__":
    main()
