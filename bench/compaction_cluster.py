#!/usr/bin/env python3
"""Compaction on a Spark standalone cluster (issue 33): jobs of many topics side by side.

    .venv/bin/python bench/compaction_cluster.py [--topics 20] [--messages 20000] [--rounds 3]

A Spark standalone cluster on this machine (a master and `--spark-workers` workers of one
core each, started by `spark-class` as tests/support/spark_cluster.py does), a storage
root on moto's S3 server, one etcd, one source broker and one compaction worker submitting
to `spark://` with `--max-concurrent-jobs` (4). `--topics` topics; before each compaction
every topic gets `--messages` more JSON-like records (about 180 bytes, `--keys` keys per
topic). Then in alternating rounds (A B A B ...): A = one after another (compact a topic,
wait for its job to be done, the next), B = queued together (compact every topic, wait for
all): the seconds from the first request to the last job done. Target: B under A.
Prints one JSON document, a Markdown table on stderr. Bounded by its arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)


def _kit():
    """The test kit's moto and Spark cluster helpers (tests/support, imported as the tests
    do; tests/ goes at the END of sys.path, so nothing there stands in for the package)."""
    kit = os.path.join(ROOT, "tests")
    if kit not in sys.path:
        sys.path.append(kit)
    from support.s3_support import MotoS3
    from support.spark_cluster import SparkCluster
    return MotoS3, SparkCluster


def produce(c, topics: list[str], messages: int, keys: int, seed: int) -> None:
    from tables_read import payloads  # bench/tables_read.py
    for n, topic in enumerate(topics):
        with c.create_producer(topic, batch_max_messages=1000) as p:
            for i, payload in enumerate(payloads("json", messages, seed * 1000 + n)):
                p.send_async(payload, key=f"k{i % keys}")
            p.flush(timeout=300)


def wait_done(c, topic: str, job: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while True:
        st = c.admin.compaction_status(topic)
        if st.job_id == job and st.phase in ("done", "failed"):
            if st.phase != "done":
                raise SystemExit(f"bench: {topic}: job {job} {st.phase}: {st.error}")
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {topic}: job {job} not done after {timeout} s")
        time.sleep(0.05)


def one_after_another(c, topics: list[str]) -> float:
    t0 = time.perf_counter()
    for t in topics:
        wait_done(c, t, c.admin.compact(t))
    return time.perf_counter() - t0


def together(c, topics: list[str]) -> float:
    t0 = time.perf_counter()
    jobs = {t: c.admin.compact(t) for t in topics}
    for t, job in jobs.items():
        wait_done(c, t, job)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--topics", type=int, default=20)
    p.add_argument("--messages", type=int, default=20_000, help="per topic, per round")
    p.add_argument("--keys", type=int, default=2_000, help="per topic")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--spark-workers", type=int, default=2)
    p.add_argument("--max-concurrent-jobs", type=int, default=4)
    a = p.parse_args(argv)
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    MotoS3, SparkCluster = _kit()
    from shadowtopic.broker.server import free_port
    from shadowtopic.client import Client
    from shadowtopic.standalone import BrokerProcess
    from shadowtopic.testing import start_etcd

    d = tempfile.mkdtemp(prefix="shadowtopic-compaction-cluster-")
    rounds = []
    with MotoS3(d) as moto, SparkCluster(os.path.join(d, "spark"), workers=a.spark_workers,
                                         cores=1, env=moto.env) as spark:
        etcd = start_etcd(os.path.join(d, "etcd"))
        root = f"s3://{moto.new_bucket()}/bench"
        broker = BrokerProcess(etcd.endpoint, os.path.join(d, "broker"), free_port(),
                               extra_args=["--cluster", "bench", "--storage-root", root,
                                           "--metrics-port", "-1", *moto.s3_args()],
                               env=moto.env)
        worker = BrokerProcess(etcd.endpoint, os.path.join(d, "worker"), free_port(),
                               module="shadowtopic.compaction.worker", env=moto.env,
                               extra_args=["--cluster", "bench", "--spark-master",
                                           spark.master_url, "--max-concurrent-jobs",
                                           str(a.max_concurrent_jobs), "--metrics-port", "-1",
                                           "--spark-conf", "spark.executor.memory=1g",
                                           *moto.s3_args()])
        try:
            broker.start(timeout=60)
            worker.start(timeout=180)
            with Client(broker.url, timeout=120) as c:
                topics = [f"persistent://public/cluster-{uuid.uuid4().hex[:6]}/t{i}"
                          for i in range(a.topics)]
                for t in topics:
                    c.admin.create_topic(t)
                for r in range(a.rounds):
                    row = {}
                    for name, run in (("one_after_another_s", one_after_another),
                                      ("together_s", together)):
                        produce(c, topics, a.messages, a.keys, seed=len(rounds) * 2 + len(row))
                        row[name] = round(run(c, topics), 2)
                    row["ratio"] = round(row["together_s"] / row["one_after_another_s"], 3)
                    rounds.append(row)
                    print(f"round {r + 1}: {json.dumps(row)}", file=sys.stderr, flush=True)
        finally:
            worker.kill()
            broker.kill()
            etcd.kill()
    out = {"args": vars(a), "rounds": rounds,
           "ratio_median": statistics.median(r["ratio"] for r in rounds)}
    print("| round | one after another s | queued together s | together / one by one |",
          file=sys.stderr)
    print("|---|---:|---:|---:|", file=sys.stderr)
    for i, r in enumerate(rounds, 1):
        print(f"| {i} | {r['one_after_another_s']} | {r['together_s']} | {r['ratio']} |",
              file=sys.stderr)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
