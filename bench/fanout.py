"""Reader fan-out: `--readers` non-durable readers of one topic in one client process, every
message decoded by the client (`Message` objects built from `raw`, payload touched), beside
`grpc_decoded_fanout_msgs_per_s` of the peers' limits.py (SHARED/peers, see `make bench`):
the same number of streams, each frame parsed by protobuf in one client process, in
alternating rounds (A B A B ...).

    .venv/bin/python bench/fanout.py --shared ../shared [--readers 100] [--rounds 3]

Each round attaches the readers at the topic's end, then produces `--messages` messages
(`--payload` bytes); delivered msgs/s = readers x messages / (time from the first message a
reader got to the last message read). Prints one JSON document; bench/run.py calls
`run_fanout` for RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
if BENCH not in sys.path:  # the sibling bench modules imported below
    sys.path.insert(0, BENCH)


def _read_all(url: str, topic: str, readers: int, messages: int, ready, out) -> None:
    from shadowtopic.client import Client

    with Client(url, timeout=60) as client:
        rs = [client.create_reader(topic, start="latest", receiver_queue_size=2000)
              for _ in range(readers)]
        ready.set()
        first = rs[0].read_next(timeout=120)
        t0 = time.perf_counter()
        got = [1] + [0] * (readers - 1)
        decoded = len(first.payload) > 0
        while min(got) < messages:
            for i, r in enumerate(rs):
                for _ in range(min(500, messages - got[i])):
                    decoded += len(r.read_next(timeout=60).payload) > 0
                    got[i] += 1
        dt = time.perf_counter() - t0
        for r in rs:
            r.close()
    out.put({"delivered": sum(got), "decoded": decoded, "seconds": dt})


def _produce(url: str, topic: str, messages: int, payload: int) -> None:
    from shadowtopic.client import Client

    with Client(url) as c, c.create_producer(topic) as p:
        data = b"x" * payload
        for i in range(messages):
            p.send_async(data, key=f"k{i % 1000}")
        p.flush(timeout=120)


def fanout_round(url: str, topic: str, readers: int, messages: int, payload: int) -> dict:
    """Readers attach first (at the topic's end), then `messages` are produced; the rate is
    taken from the first message a reader gets to the last one any reader reads."""
    ctx = mp.get_context("spawn")
    q, ready = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_read_all, args=(url, topic, readers, messages, ready, q))
    p.start()
    try:
        if not ready.wait(300):
            raise SystemExit("bench: readers did not attach")
        _produce(url, topic, messages, payload)
        res = q.get(timeout=600)
    finally:
        p.join(30)
    if res["decoded"] != readers * messages:
        raise SystemExit(f"bench: {res['decoded']} of {readers * messages} messages decoded")
    return {"msgs_per_s": round(res["delivered"] / res["seconds"]),
            "seconds": round(res["seconds"], 3)}


def ceiling_round(peers: str, readers: int) -> int | None:
    cmd = [sys.executable, os.path.join(peers, "limits.py"), "--only", "fanout",
           "--subs", str(readers)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        print(f"  limits.py failed: {res.stderr.strip()[-300:]}", flush=True)
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])["grpc_decoded_fanout_msgs_per_s"]


def run_fanout(peers: str | None, data_dir: str, readers: int = 100, messages: int = 20_000,
               payload: int = 100, rounds: int = 3) -> dict:
    """Alternating rounds of the ceiling and ours against one broker; paired ratios."""
    import topics  # bench/topics.py

    from shadowtopic.broker.server import free_port
    from shadowtopic.client import Client
    from shadowtopic.metadata.etcd_server import EtcdServer
    from shadowtopic.standalone import BrokerProcess

    topic = topics.name("fanout")
    with EtcdServer(os.path.join(data_dir, "etcd-fanout")) as etcd:
        broker = BrokerProcess(etcd.endpoint, os.path.join(data_dir, "broker-fanout"),
                               free_port())
        broker.start(timeout=60)
        try:
            with Client(broker.url) as c:
                c.admin.create_topic(topic)
            pairs = []
            for r in range(rounds):
                ceiling = ceiling_round(peers, readers) if peers else None
                ours = fanout_round(broker.url, topic, readers, messages, payload)
                pairs.append({"ceiling": ceiling, **ours,
                              "ratio": round(ours["msgs_per_s"] / ceiling, 4)
                              if ceiling else None})
                print(f"  fan-out round {r + 1}: {pairs[-1]}", flush=True)
        finally:
            broker.terminate()
    ratios = [p["ratio"] for p in pairs if p["ratio"] is not None]
    return {"readers": readers, "messages": messages, "payload": payload, "rounds": pairs,
            "median_msgs_per_s": statistics.median(p["msgs_per_s"] for p in pairs),
            "median_ratio": statistics.median(ratios) if ratios else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    p.add_argument("--readers", type=int, default=100)
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--payload", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    peers = os.path.join(a.shared, "peers")
    base = os.path.join(ROOT, "data", "bench")
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as d:
        res = run_fanout(peers if os.path.isdir(peers) else None, d, a.readers, a.messages,
                         a.payload, a.rounds)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
