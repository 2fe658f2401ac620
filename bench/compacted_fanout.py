"""Compacted fan-out over shadows (issue 34): `--subs` (100) read_compacted subscriptions spread
over a source and 4 shadows load the latest state of `--keys` (50,000) keys, beside the
machine's decoded fan-out ceiling (the peers' limits.py `--only fanout`) in alternating rounds.

    .venv/bin/python bench/compacted_fanout.py [--shared ../shared] [--rounds 3]
        [--keys 50000] [--messages 500000] [--subs 100] [--mode frames|receive]
        [--ack each|cumulative] [--profile DIR]

- the cluster: one real etcd, a source broker, a shadow broker serving the 4 shadows, and a
  warm compaction worker (Spark local[*]), on one storage root (bench/compaction_bench.py's).
- data: `--messages` keyed messages over `--keys` keys (uniform, random payloads of
  `--payload` bytes, 0.5% deletes) from 4 producer processes, then one compaction: the
  source and every shadow read its compacted ledger (one job serves them all).
- a round of ours: one client process per topic (source + 4 shadows) attaches
  `--subs`/5 Exclusive read_compacted subscriptions from earliest with `subscribe_many` and
  takes the whole compacted state on each, acknowledging every message; the round's figure is
  deliveries (messages x subscriptions) per second from the start (every client connected,
  told to subscribe at once) to the last subscription loaded, and each broker's CPU seconds.
  `--mode frames` (the default) consumes with `frame_listener`, the way the client takes
  many subscriptions (a frame the broker sends once per stream for the subscriptions at one
  position is decoded once, and `recipients.acknowledge` acknowledges a message for all of
  them in one command; `--ack cumulative`: `recipients.acknowledge_cumulative` of each
  frame's last message instead); `--mode receive` takes each subscription's messages with
  `batch_receive`, one after the other, acknowledging cumulatively (every delivery decoded on
  its own, as the ceiling does).
- a round of the ceiling: limits.py `--only fanout --subs <subs> --payload <payload>`, its
  `grpc_decoded_fanout_msgs_per_s` (one process decoding frames of 500 messages on --subs
  streams). Rounds alternate (ceiling, ours, ceiling, ours ...); the figure is the median of
  the paired ratios ours / ceiling [target 0.5].
- `--profile DIR`: the brokers run under cProfile (their stats written to DIR on exit).
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


def _client(url: str, topic: str, names: list[str], load: int, mode: str, ack: str, go,
            q) -> None:
    import threading

    from shadowtopic.client import Client
    with Client(url, timeout=120) as c:
        c.admin.last_message_id(topic)  # connected, the modules loaded: ready to go
        q.put(("ready",))
        go.wait(120)
        if mode == "frames":
            got = [0]
            done = threading.Event()
            lock = threading.Lock()

            def frame(messages, recipients) -> None:
                if ack == "cumulative":  # one command for the frame, for all of them
                    recipients.acknowledge_cumulative(messages[-1])
                else:
                    for m in messages:  # one command for all the recipients of each message
                        recipients.acknowledge(m)
                with lock:
                    got[0] += len(messages) * len(recipients)
                    if got[0] >= load * len(names):
                        done.set()
            t0 = time.perf_counter()
            consumers = c.subscribe_many(topic, names, initial_position="earliest",
                                         read_compacted=True, receiver_queue_size=5000,
                                         frame_listener=frame)
            if not done.wait(600):
                raise SystemExit(f"bench: {topic}: {got[0]} of {load * len(names)} "
                                 "deliveries after 600 s")
            delivered = got[0]
        else:
            t0 = time.perf_counter()
            consumers = c.subscribe_many(topic, names, initial_position="earliest",
                                         read_compacted=True, receiver_queue_size=5000)
            delivered = 0
            for cons in consumers:
                n = 0
                while n < load:
                    batch = cons.batch_receive(5000, timeout=120)
                    if batch:
                        cons.acknowledge_cumulative(batch[-1])
                    n += len(batch)
                delivered += n
        q.put((time.perf_counter() - t0, delivered))
        for cons in consumers:
            cons.unsubscribe()


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ours(cl, topics: list[str], subs: int, load: int, mode: str, ack: str, rnd: int
         ) -> dict:
    per = subs // len(topics)
    ctx = mp.get_context("spawn")
    q, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_client, args=(
        cl.url, t, [f"r{rnd}-{i}" for i in range(per)], load, mode, ack, go, q))
        for t in topics]
    for p in procs:
        p.start()
    for _ in procs:
        q.get(timeout=120)  # ("ready",)
    cpu0 = proc_cpu(cl.src.proc.pid), proc_cpu(cl.sh.proc.pid)
    t0 = time.perf_counter()
    go.set()
    got = [q.get(timeout=900) for _ in procs]
    wall = time.perf_counter() - t0
    cpu1 = proc_cpu(cl.src.proc.pid), proc_cpu(cl.sh.proc.pid)
    for p in procs:
        p.join(60)
    delivered = sum(n for _, n in got)
    if delivered != load * per * len(topics):
        raise SystemExit(f"bench: delivered {delivered}, expected {load * per * len(topics)}")
    return {"wall_s": round(wall, 2), "load_s": round(max(t for t, _ in got), 2),
            "deliveries": delivered, "deliveries_per_s": round(delivered / wall),
            "source_cpu_s": round(cpu1[0] - cpu0[0], 2),
            "shadow_cpu_s": round(cpu1[1] - cpu0[1], 2)}


def ceiling(peers: str, subs: int, payload: int) -> int:
    out = subprocess.run([sys.executable, os.path.join(peers, "limits.py"), "--only",
                          "fanout", "--subs", str(subs), "--payload", str(payload)],
                         capture_output=True, text=True, timeout=900, check=True)
    return int(json.loads(out.stdout.strip().splitlines()[-1])[
        "grpc_decoded_fanout_msgs_per_s"])


def run(a) -> dict:
    import compaction_bench as cbm
    import topics  # bench/topics.py

    from shadowtopic.client import Client, Policies
    peers = os.path.join(a.shared, "peers")
    data_dir = a.data_dir or tempfile.mkdtemp(prefix="compacted-fanout-")
    cl = cbm.Cluster(data_dir, profile_dir=a.profile)
    topic = topics.name("compacted-fanout", "state")
    out: dict = {"args": vars(a), "rounds": []}
    try:
        with Client(cl.url, timeout=120) as c:
            c.admin.create_topic(topic, policies=Policies(delete_retention_seconds=0))
            out["produce_s"] = round(cbm.produce(cl.url, topic, a.messages, a.keys, a.payload,
                                                 seed=1), 1)
            dt, status, _ = cbm.compact(c, topic)
            out["compaction_s"] = round(dt, 2)
            load = status.entries_written
            out["load_entries"] = load
            shadows = [f"{topic}-shadow-{i}" for i in range(4)]
            for s in shadows:
                c.admin.create_shadow_topic(s, topic)
            print(f"  {a.messages:,} messages, {load:,} after compaction", flush=True)
            for rnd in range(a.rounds):
                ceil = ceiling(peers, a.subs, a.payload) if not a.no_peers else None
                mine = ours(cl, [topic, *shadows], a.subs, load, a.mode, a.ack, rnd)
                mine["ceiling_msgs_per_s"] = ceil
                mine["ratio"] = round(mine["deliveries_per_s"] / ceil, 3) if ceil else None
                out["rounds"].append(mine)
                print(f"  round {rnd + 1}: {mine}", flush=True)
    finally:
        cl.close()
    ratios = [r["ratio"] for r in out["rounds"] if r["ratio"] is not None]
    out["median_ratio"] = statistics.median(ratios) if ratios else None
    out["median_deliveries_per_s"] = statistics.median(
        r["deliveries_per_s"] for r in out["rounds"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    p.add_argument("--no-peers", action="store_true", help="skip limits.py (smoke runs)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--keys", type=int, default=50_000)
    p.add_argument("--messages", type=int, default=500_000)
    p.add_argument("--payload", type=int, default=100)
    p.add_argument("--subs", type=int, default=100)
    p.add_argument("--mode", choices=("frames", "receive"), default="frames")
    p.add_argument("--ack", choices=("each", "cumulative"), default="each",
                   help="--mode frames: acknowledge every message, or each frame's last "
                        "cumulatively")
    p.add_argument("--profile", default=None, metavar="DIR")
    p.add_argument("--data-dir", default=None)
    a = p.parse_args()
    if a.subs % 5:
        p.error("--subs: a multiple of 5 (the source and 4 shadows)")
    r = run(a)
    print(json.dumps(r))
    print(f"\n## Compacted fan-out over shadows\n\n{a.subs} read_compacted subscriptions "
          f"(source + 4 shadows), {r['load_entries']:,} keys each, --mode {a.mode} --ack "
          f"{a.ack}: median "
          f"{r['median_deliveries_per_s']:,} deliveries/s; median of the paired ratios to the "
          f"decoded fan-out ceiling {r['median_ratio']} (target 0.5)")


if __name__ == "__main__":
    main()
