#!/usr/bin/env python3
"""Produce A/B: idempotent producing (deduplication) on vs off, in alternating rounds.

    .venv/bin/python bench/produce_dedup.py [--messages 200000] [--pairs 4] [--producers 2]

`make bench` runs it as its `dedup` part (bench/run.py). One real etcd and one broker
process; each pair runs a round with `idempotent=False` and
one with `idempotent=True` (the default), in alternating order (off-on, on-off, ...) so
both meet the same noise of the shared machine, each on a fresh topic with the same load
as bench/run.py's produce figure (`--producers` processes, `send_async`, a callback on
every 10th message, everything must be acked). Prints each round and the median of the
paired ratios on / off of acked msgs/s (1.0 = no cost), of p50 latency and of the CPU
time per message of the broker and of the producer processes (less noisy than the rate on
a shared machine: it does not count time spent waiting for a core); `--json`
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

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
if BENCH not in sys.path:  # the sibling bench modules imported below
    sys.path.insert(0, BENCH)


def _producer(url: str, topic: str, count: int, payload: int, start_at: float,
              idempotent: bool, out) -> None:
    from shadowtopic.client import Client

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
        cpu0 = time.process_time()
        t0 = now()
        for i in range(count):
            if i % 10:
                producer.send_async(data, key=keys[i % 1000])
            else:
                sends.append(now())
                producer.send_async(data, key=keys[i % 1000], callback=done)
        producer.flush(timeout=120)
        t1 = now()
        cpu = time.process_time() - cpu0
        stats = producer.stats()
        producer.close()
    off = time.time() - time.perf_counter()
    out.put({"acked": stats["acked"], "t0": t0 + off, "t1": t1 + off, "cpu": cpu,
             "lat": [a - s for s, a in zip(sends, acks)]})


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(url: str, messages: int, producers: int, payload: int, idempotent: bool,
              broker_pid: int) -> dict:
    import topics  # bench/topics.py

    from shadowtopic.client import Client

    topic = topics.name("dedup", f"t-{uuid.uuid4().hex[:8]}")
    with Client(url) as c:
        c.admin.create_topic(topic)
    ctx = mp.get_context("spawn")  # gRPC channels do not survive fork
    q = ctx.Queue()
    per = messages // producers
    start_at = time.time() + 3.0
    procs = [ctx.Process(target=_producer,
                         args=(url, topic, per, payload, start_at, idempotent, q))
             for _ in range(producers)]
    broker_cpu = _cpu_seconds(broker_pid)
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    broker_cpu = _cpu_seconds(broker_pid) - broker_cpu
    for p in procs:
        p.join(30)
    acked = sum(r["acked"] for r in results)
    if acked != per * producers:
        raise SystemExit(f"bench: only {acked} of {per * producers} messages were acked")
    dt = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    lat = sorted(x for r in results for x in r["lat"])
    return {"idempotent": idempotent, "msgs_per_s": round(acked / dt),
            "p50_ms": round(lat[len(lat) // 2] * 1000, 2),
            "p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 2),
            "broker_cpu_us_per_msg": round(broker_cpu / acked * 1e6, 3),
            "client_cpu_us_per_msg": round(sum(r["cpu"] for r in results) / acked * 1e6, 3)}


def run_dedup(data_dir: str, messages: int = 200_000, pairs: int = 6, producers: int = 2,
              payload: int = 100) -> dict:
    """`pairs` pairs of rounds (off-on, on-off, ...) against one etcd and one broker under
    `data_dir`; returns every round and the medians of the paired ratios."""
    from shadowtopic.broker.server import free_port
    from shadowtopic.metadata.etcd_server import EtcdServer
    from shadowtopic.standalone import BrokerProcess

    out = []
    with EtcdServer(os.path.join(data_dir, "dedup-etcd")) as etcd:
        etcd.start()
        broker = BrokerProcess(etcd.endpoint, os.path.join(data_dir, "dedup-broker"),
                               free_port())
        broker.start(timeout=60)
        try:
            for i in range(pairs):
                order = (False, True) if i % 2 == 0 else (True, False)
                got = {}
                for idem in order:
                    got[idem] = one_round(broker.url, messages, producers, payload, idem,
                                          broker.proc.pid)
                    print(f"pair {i + 1} {'on ' if idem else 'off'}: {got[idem]}", flush=True)
                out.append({"off": got[False], "on": got[True],
                            "rate_ratio": got[True]["msgs_per_s"] / got[False]["msgs_per_s"],
                            "p50_ratio": got[True]["p50_ms"] / got[False]["p50_ms"],
                            "broker_cpu_ratio": got[True]["broker_cpu_us_per_msg"]
                            / got[False]["broker_cpu_us_per_msg"],
                            "client_cpu_ratio": got[True]["client_cpu_us_per_msg"]
                            / got[False]["client_cpu_us_per_msg"]})
        finally:
            broker.kill()
    return {"pairs": out,
            "median_rate_ratio": statistics.median(x["rate_ratio"] for x in out),
            "median_p50_ratio": statistics.median(x["p50_ratio"] for x in out),
            "median_broker_cpu_ratio": statistics.median(x["broker_cpu_ratio"] for x in out),
            "median_client_cpu_ratio": statistics.median(x["client_cpu_ratio"] for x in out),
            "args": {"messages": messages, "pairs": pairs, "producers": producers,
                     "payload": payload}}


def dedup_lines(res: dict) -> list[str]:
    """bench/RESULTS.md's section for `run_dedup`'s results."""
    a = res["args"]
    lines = ["## Idempotent producing: deduplication on vs off (bench/produce_dedup.py)", "",
             f"{a['pairs']} pairs of rounds, alternating (off-on, on-off, ...), each on a fresh "
             f"topic: {a['producers']} producer processes send {a['messages']:,} messages of "
             f"{a['payload']} bytes with `send_async`, `idempotent=False` beside the default "
             "`idempotent=True`. CPU per message is the broker's and the producers' CPU time "
             "over the round divided by the messages (it does not count waiting for a core, "
             "so it is steadier than the rate on a shared machine).", "",
             "| pair | off msgs/s | on msgs/s | on/off | broker CPU on/off "
             "| producers CPU on/off |",
             "|---|---|---|---|---|---|"]
    for i, x in enumerate(res["pairs"], 1):
        lines.append(f"| {i} | {x['off']['msgs_per_s']:,} | {x['on']['msgs_per_s']:,} | "
                     f"{x['rate_ratio']:.2f} | {x['broker_cpu_ratio']:.2f} | "
                     f"{x['client_cpu_ratio']:.2f} |")
    lines += ["", "Medians of the paired ratios on/off: "
              f"msgs/s **{res['median_rate_ratio']:.3f}**, "
              f"p50 ack latency {res['median_p50_ratio']:.3f}, CPU per message: broker "
              f"**{res['median_broker_cpu_ratio']:.3f}**, producers "
              f"**{res['median_client_cpu_ratio']:.3f}** (1.0: no cost; the target is a cost "
              "under 10%).", ""]
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--payload", type=int, default=100)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        res = run_dedup(data_dir, a.messages, a.pairs, a.producers, a.payload)
    print("\n".join(dedup_lines(res)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
