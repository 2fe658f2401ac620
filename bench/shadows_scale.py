"""The broadcast issue's figures repeated over shadow topics (issue 9, item 5), against one
real etcd + source broker + shadow broker on one storage root (bench/shadows.py's `Pair`;
every shadow lives in the one shadow broker process, as in `make run`).

    .venv/bin/python bench/shadows_scale.py --shared ../shared [--rounds 3] \
        [--parts fanout,broadcast]

- fanout: a source pre-filled with `--fanout-messages` (100,000) messages of 100 bytes and
  `--shadows` (4) shadows; each round `--subs` (100) fresh Exclusive subscriptions at
  "earliest", `--subs / --shadows` on each shadow, over `--procs` (2) client processes (one
  Client each; a process serves whole shadows), each consumer taking `batch_receive(500)` and
  acknowledging the last cumulatively (bench/consume.py's exclusive case); only messages
  received decoded and acknowledged count, and the shadows' stats must then show no backlog.
  Alternating rounds: limits.py `--only fanout --subs 100` (`grpc_decoded_fanout_msgs_per_s`),
  ours over shadows, and the same 100 subscriptions on the source itself (the fanout100
  layout) as the in-run reference. [half the decoded ceiling, as fanout100]
- broadcast: `--broadcast-subs` (100,000) Exclusive subscriptions spread evenly over the
  source and its `--shadows` shadows (20,000 each), one client process per topic
  (bench/broadcast.py's `_subscriber`: `subscribe_many` with the grouped
  `message_listener(message, recipients)` and `recipients.acknowledge(message)`), attached at
  one barrier time; then one message a second for `--broadcast-duration` (60) s to the
  source. Attach time [< 60 s], broker memory per idle subscription on each broker (VmRSS
  after attach + settle - before) [< 2 KB], latency of every delivery (listener time - send
  time) p50/p99 on the source and on the shadows [p99 < 1 s], and each broker's CPU per
  message during the traffic (the source's must not grow with subscriptions on shadows).
- fanout-brokers (issue 21): the fan-out of `fanout` (`--shadows` x `--subs / --shadows`,
  no ceiling, no source reference) on two clusters side by side, every broker with its own
  data dir and `--wal-dir`: one with 1 shadow broker, one with 2 (the cluster's placement
  puts the shadows; the result lists which broker serves each); alternating each round.
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

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
if BENCH not in sys.path:  # the sibling bench modules imported below
    sys.path.insert(0, BENCH)

PARTS = ("fanout", "broadcast", "fanout-brokers")


def topic_name(part: str, local: str) -> str:
    from topics import name  # bench/topics.py (imported here, after BENCH is on sys.path)
    return name(part, local)


def _consume_many(url: str, subs: list[tuple[str, str]], total: int, start_at: float,
                  queue_size: int, out) -> None:
    """One client process: an Exclusive consumer per (topic, subscription) at "earliest";
    each takes `batch_receive(500)`, counts the decoded messages and acknowledges the last
    cumulatively, until it has `total`."""
    from shadowtopic.client import Client
    from shadowtopic.core import errors

    now = time.perf_counter
    with Client(url, timeout=60) as client:
        while time.time() < start_at:
            time.sleep(0.001)
        cons = [client.subscribe(t, s, initial_position="earliest",
                                 receiver_queue_size=queue_size) for t, s in subs]
        c0 = time.process_time()
        got, decoded = [0] * len(cons), 0
        t_first = t_last = None
        open_ = list(range(len(cons)))
        while open_:
            progressed = False
            for i in list(open_):
                try:
                    msgs = cons[i].batch_receive(500, timeout=0.05 if i == open_[0] else 0.0)
                except errors.Timeout:
                    msgs = []
                if not msgs:
                    continue
                t_first = t_first or now()
                progressed = True
                for m in msgs:
                    decoded += len(m.payload) > 0
                cons[i].acknowledge_cumulative(msgs[-1])
                t_last = now()
                got[i] += len(msgs)
                if got[i] >= total:
                    open_.remove(i)
            if not progressed and now() - (t_last or c0) > 120:
                break
        cpu = time.process_time() - c0
        off = time.time() - time.perf_counter()
        for c in cons:
            c.close()
    out.put({"received": sum(got), "decoded": decoded, "cpu_s": cpu,
             "t_first": (t_first or 0) + off, "t_last": (t_last or 0) + off})


def fanout_round(pair, c, topics: list[str], tag: str, subs: int, procs: int, messages: int,
                 queue_size: int) -> dict:
    from consume import _drained, proc_cpu  # bench/consume.py

    per = subs // len(topics)
    names = {t: [f"f-{tag}-{i}" for i in range(per)] for t in topics}
    # a process serves whole topics when it can (its consumers share decodes per topic)
    groups = [[(t, s) for t in topics[i::procs] for s in names[t]] for i in range(procs)] \
        if len(topics) >= procs else \
        [[(t, s) for t in topics for s in names[t]][i::procs] for i in range(procs)]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start_at = time.time() + 2.0
    ps = [ctx.Process(target=_consume_many, args=(pair.url, g, messages, start_at,
                                                  queue_size, q)) for g in groups]
    for p in ps:
        p.start()
    sh_pids = pair.sh_pids
    cpu0 = [proc_cpu(pair.src_pid), sum(proc_cpu(p) for p in sh_pids)]
    res = []
    for _ in ps:
        try:
            res.append(q.get(timeout=900))
        except Exception:
            raise SystemExit("bench: shadow fan-out: a consumer process failed") from None
    cpu = [proc_cpu(pair.src_pid) - cpu0[0], sum(proc_cpu(p) for p in sh_pids) - cpu0[1]]
    for p in ps:
        p.join(30)
    drain = max(_drained(c.admin, t, names[t]) for t in topics)
    want = messages * per * len(topics)
    received = sum(r["received"] for r in res)
    if received < want or sum(r["decoded"] for r in res) != received:
        raise SystemExit(f"bench: shadow fan-out: {received} of {want} received")
    dt = max(r["t_last"] for r in res) - min(r["t_first"] for r in res if r["t_first"])
    return {"msgs_per_s": round(received / dt), "seconds": round(dt, 2), "acked": received,
            "drain_s": round(drain, 3),
            "client_cpu_us_per_msg": round(sum(r["cpu_s"] for r in res) / received * 1e6, 2),
            "src_cpu_us_per_msg": round(cpu[0] / received * 1e6, 2),
            "sh_cpu_us_per_msg": round(cpu[1] / received * 1e6, 2)}


def run_fanout(pair, c, peers: str | None, messages: int, shadows: int, subs: int, procs: int,
               rounds: int, payload: int, queue_size: int = 1000) -> dict:
    from consume import _median, _peer, prefill  # bench/consume.py

    src = topic_name("shadows-scale", "fan")
    c.admin.create_topic(src)
    topics = [f"{src}-shadow-{i}" for i in range(shadows)]
    for t in topics:
        c.admin.create_shadow_topic(t, src)
    fill = prefill(pair.url, src, messages, payload)
    print(f"  pre-filled {messages:,} messages in {fill:.1f}s", flush=True)
    rows = []
    for r in range(rounds):
        ceiling = _peer([sys.executable, os.path.join(peers, "limits.py"), "--only", "fanout",
                         "--subs", str(subs), "--payload", str(payload)],
                        "grpc_decoded_fanout_msgs_per_s") if peers else None
        ours = fanout_round(pair, c, topics, f"r{r}", subs, procs, messages, queue_size)
        ref = fanout_round(pair, c, [src], f"r{r}", subs, procs, messages, queue_size)
        ours.update(ceiling=ceiling, source_msgs_per_s=ref["msgs_per_s"],
                    source_src_cpu_us_per_msg=ref["src_cpu_us_per_msg"],
                    ratio=round(ours["msgs_per_s"] / ceiling, 4) if ceiling else None,
                    source_ratio=round(ours["msgs_per_s"] / ref["msgs_per_s"], 3))
        rows.append(ours)
        print(f"  shadow fan-out round {r + 1}: {ours}", flush=True)
    return {"messages": messages, "payload": payload, "shadows": shadows, "subs": subs,
            "procs": procs, "receiver_queue_size": queue_size, "rounds": rows,
            "median_msgs_per_s": statistics.median(x["msgs_per_s"] for x in rows),
            "median_ratio": _median([x["ratio"] for x in rows]),
            "median_source_ratio": _median([x["source_ratio"] for x in rows])}


def run_fanout_brokers(pairs: dict, messages: int, shadows: int, subs: int, procs: int,
                       rounds: int, payload: int, queue_size: int = 1000) -> dict:
    """`pairs`: {shadow brokers: (Pair, Client)}, each a cluster of its own with `shadows`
    shadows of one pre-filled source; each round the same fan-out on each, alternating."""
    from consume import prefill  # bench/consume.py

    src = topic_name("shadows-scale", "fanb")
    topics = [f"{src}-shadow-{i}" for i in range(shadows)]
    out: dict = {"messages": messages, "shadows": shadows, "subs": subs, "procs": procs,
                 "placement": {}, "rounds": []}
    for n, (pair, c) in pairs.items():
        c.admin.create_topic(src)
        for t in topics:
            c.admin.create_shadow_topic(t, src)
        fill = prefill(pair.url, src, messages, payload)
        # which shadow broker serves each shadow (placement is the cluster's, not ours)
        out["placement"][n] = sorted(str(c.admin.lookup(t)["brokerUrl"]) for t in topics)
        print(f"  {n} shadow broker(s): pre-filled {messages:,} in {fill:.1f}s; shadows on "
              f"{out['placement'][n]}", flush=True)
    for r in range(rounds):
        row = {}
        for n, (pair, c) in pairs.items():
            row[n] = fanout_round(pair, c, topics, f"r{r}", subs, procs, messages, queue_size)
            print(f"  fan-out round {r + 1}, {n} shadow broker(s): {row[n]}", flush=True)
        out["rounds"].append(row)
    for n in pairs:
        out[f"median_msgs_per_s_{n}"] = statistics.median(
            row[n]["msgs_per_s"] for row in out["rounds"])
    return out


def run_broadcast(pair, c, subs: int, shadows: int, duration: float, rate: float = 1.0,
                  queue_size: int = 1000, settle: float = 5.0, grace: float = 60.0) -> dict:
    """bench/broadcast.py's run over the source + its shadows (one client process a topic)."""
    from broadcast import PAYLOAD, _collect, _deliveries, _merge, _subscriber, rss_bytes
    from consume import proc_cpu

    src = topic_name("shadows-scale", "cast")
    c.admin.create_topic(src)
    topics = [src] + [f"{src}-shadow-{i}" for i in range(shadows)]
    for t in topics[1:]:
        c.admin.create_shadow_topic(t, src)
    per = subs // len(topics)
    messages = max(1, int(duration * rate))
    pids = {"source": pair.src_pid, "shadow": pair.sh_pid, "etcd": pair.etcd.proc.pid}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    go, stop = ctx.Event(), ctx.Event()
    start_at = ctx.Value("d", 0.0)
    progress = ctx.Array("q", len(topics))
    ps = [ctx.Process(target=_subscriber, args=(i, pair.url, t, [f"b-{j}" for j in range(per)],
                                                messages, queue_size, go, start_at, stop,
                                                progress, q), daemon=True)
          for i, t in enumerate(topics)]
    res: dict = {"subscriptions": per * len(topics), "per_topic": per, "shadows": shadows,
                 "processes": len(topics), "messages": messages, "rate_per_s": rate,
                 "settle_s": settle, "receiver_queue_size": queue_size}
    producer = c.create_producer(src, producer_name="shadow-broadcast", batch_max_messages=1)
    try:
        for p in ps:
            p.start()
        _collect(q, "ready", len(ps), 300, ps)
        time.sleep(1.0)
        rss0 = {k: rss_bytes(pids[k]) for k in ("source", "shadow")}
        cpu0 = {k: proc_cpu(v) for k, v in pids.items()}
        start_at.value = time.time() + 0.5
        go.set()
        attached = _collect(q, "attached", len(ps), 600, ps)
        t_att = max(a["t1"] for a in attached)
        cpu1 = {k: proc_cpu(v) for k, v in pids.items()}
        res.update(attach_s=round(t_att - start_at.value, 2),
                   attach_s_per_topic=[round(a["t1"] - a["t0"], 2) for a in attached],
                   attach_cpu_s={k: round(cpu1[k] - cpu0[k], 2) for k in pids})
        print(f"  attached {res['subscriptions']:,} subscriptions in {res['attach_s']} s",
              flush=True)
        time.sleep(settle)
        rss1 = {k: rss_bytes(pids[k]) for k in ("source", "shadow")}
        cpu2 = {k: proc_cpu(v) for k, v in pids.items()}
        res.update(rss_before_mb={k: round(v / 2**20, 1) for k, v in rss0.items()},
                   rss_idle_mb={k: round(v / 2**20, 1) for k, v in rss1.items()},
                   bytes_per_idle_sub={"source": round((rss1["source"] - rss0["source"]) / per),
                                       "shadow": round((rss1["shadow"] - rss0["shadow"])
                                                       / (per * shadows))},
                   idle_cores={k: round((cpu2[k] - cpu1[k]) / (time.time() - t_att), 3)
                               for k in pids})
        t0 = time.time()
        send_at, acked_at = [], [0.0] * messages

        def receipt(i: int):
            return lambda mid, exc: acked_at.__setitem__(i, time.time())

        for i in range(messages):
            ahead = t0 + i / rate - time.time()
            if ahead > 0:
                time.sleep(ahead)
            send_at.append(time.time())
            producer.send_async(PAYLOAD.pack(i, send_at[-1]), callback=receipt(i))
        t1 = time.time()
        producer.flush(timeout=120)
        want, seen, t_prog = per * len(topics) * messages, 0, time.time()
        while time.time() - t_prog < grace and seen < want:
            if sum(progress) != seen:
                seen, t_prog = sum(progress), time.time()
            time.sleep(0.1)
        t_done = time.time()
        cpu3 = {k: proc_cpu(v) for k, v in pids.items()}
        stop.set()
        done = _collect(q, "done", len(ps), 600, ps)
    finally:
        stop.set()
        producer.close()
        for p in ps:
            p.join(30)
            if p.is_alive():
                p.terminate()
    span = t_done - t0
    res.update(_deliveries(done, send_at))
    res.update(expected=want, sent=messages,
               source=_deliveries(done[:1], send_at), on_shadows=_deliveries(done[1:], send_at),
               send_ack_ms_p50=round(statistics.median(
                   a - s for a, s in zip(acked_at, send_at)) * 1000, 1),
               all_delivered_after_s=round(t_done - t1, 2) if seen >= want else None,
               traffic_cpu_s={k: round(cpu3[k] - cpu2[k], 2) for k in pids},
               traffic_cores={k: round((cpu3[k] - cpu2[k]) / span, 3) for k in pids},
               cpu_ms_per_msg={k: round((cpu3[k] - cpu2[k]) / messages * 1000, 1)
                               for k in pids},
               client_traffic_cpu_s=round(sum(d["cpu_s"] for d in done), 2),
               client_thread_cpu_s=_merge([d["threads"] for d in done]))
    return res


def run_scale(data_dir: str, peers: str | None, a) -> dict:
    from shadows import Pair  # bench/shadows.py

    from shadowtopic.client import Client

    parts = a.parts.split(",") if isinstance(a.parts, str) else list(a.parts)
    res: dict = {"parts": parts, "load_start": os.getloadavg()}
    if "fanout" in parts:
        print(f"running fan-out to {a.subs} subscriptions over {a.shadows} shadows (limits.py "
              "fanout / shadows / the source, alternating)", flush=True)
        with Pair(data_dir, "fan") as pair, Client(pair.url, timeout=120) as c:
            res["fanout"] = run_fanout(pair, c, peers, a.fanout_messages, a.shadows, a.subs,
                                       a.procs, a.rounds, a.payload)
    if "broadcast" in parts:
        print(f"running broadcast to {a.broadcast_subs:,} subscriptions over the source and "
              f"{a.shadows} shadows", flush=True)
        with Pair(data_dir, "cast", profile=a.profile) as pair, \
                Client(pair.url, timeout=120) as c:
            res["broadcast"] = run_broadcast(pair, c, a.broadcast_subs, a.shadows,
                                             a.broadcast_duration)
    if "fanout-brokers" in parts:
        print(f"running fan-out to {a.subs} subscriptions over {a.shadows} shadows on 1 "
              "shadow broker / 2 shadow brokers (own WAL dirs), alternating", flush=True)
        with Pair(data_dir, "fan1", split_wal=True) as p1, Client(p1.url, timeout=120) as c1, \
                Pair(data_dir, "fan2", split_wal=True, shadow_brokers=2) as p2, \
                Client(p2.url, timeout=120) as c2:
            res["fanout_brokers"] = run_fanout_brokers({1: (p1, c1), 2: (p2, c2)},
                                                       a.fanout_messages, a.shadows, a.subs,
                                                       a.procs, a.rounds, a.payload)
    res["load_end"] = os.getloadavg()
    return res


def add_args(p: argparse.ArgumentParser, prefix: str = "") -> None:
    o = f"--{prefix}"
    p.add_argument(f"{o}parts", default=",".join(PARTS), help="subset of " + ",".join(PARTS))
    p.add_argument(f"{o}shadows", type=int, default=4)
    p.add_argument(f"{o}fanout-messages", type=int, default=100_000)
    p.add_argument(f"{o}subs", type=int, default=100, help="fanout: subscriptions in all")
    p.add_argument(f"{o}procs", type=int, default=2, help="fanout: client processes")
    p.add_argument(f"{o}broadcast-subs", type=int, default=100_000)
    p.add_argument(f"{o}broadcast-duration", type=float, default=60.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--payload", type=int, default=100)
    p.add_argument("--profile", default=None,
                   help="broadcast: path prefix for both brokers' cProfile stats")
    add_args(p)
    a = p.parse_args()
    if a.profile:
        a.profile = os.path.abspath(a.profile)
    peers = os.path.join(a.shared, "peers")
    peers = None if a.no_peers or not os.path.isdir(peers) else peers
    base = os.path.join(ROOT, "data", "bench")
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as d:
        res = run_scale(d, peers, a)
    print(json.dumps(res))
    from shadows_report import scale_lines  # bench/shadows_report.py
    print("\n".join(scale_lines(res)))


if __name__ == "__main__":
    main()
