"""Consume-and-ack throughput of durable subscriptions, through the public client, beside
NATS JetStream durable consumers (the peers' nats_jetstream.py) and the decoded fan-out
ceiling (`grpc_decoded_fanout_msgs_per_s` of the peers' limits.py; both in SHARED/peers, see
`make bench`), in alternating rounds (A B A B ...) against one real etcd + broker process.

    .venv/bin/python bench/consume.py --shared ../shared [--messages 200000] [--rounds 3]

One topic is pre-filled with `--messages` messages (`--payload` bytes, keys k0..k999). Each
round then runs two cases, each with fresh subscriptions at "earliest":

- shared: ONE Shared subscription with `--shared-consumers` consumers (4) spread over
  `--shared-procs` client processes (2: one per core here; 4 processes were slower on 2
  cores), one Client per process (its consumers share its Connect stream); every message is
  acknowledged individually (`acknowledge(msg)`). The broker delivers each message once:
  delivered = `--messages`.
- exclusive: `--exclusive-subs` (10) Exclusive subscriptions, each with its own consumer,
  in `--exclusive-procs` client processes (1, like the ceiling's one process; 2 and 5 were
  slower on 2 cores), one Client per process: its consumers share its stream and the
  client's decode cache (an entry is rarely decoded twice); each consumer acknowledges
  cumulatively the last message of every `batch_receive` (`--exclusive-ack individual` acks
  each message instead). Delivered = subscriptions x `--messages`.

Only messages the client received as decoded `Message` objects (payload touched) AND
acknowledged count: rate = messages acked / (first message received by any consumer -> last
ack sent by any consumer). Acks are fire-and-forget, so after each case the broker's stats
must show every subscription of the case with no backlog and no unacked message (within 30
s, else the bench fails); `drain_s` is how long after the last ack that took.

Peers, in the same round: `limits.py --only fanout --subs S` (S = 4 or 10: as many streams of
pre-encoded 500-message frames, each parsed by protobuf in one process, no acks) and
`nats_jetstream.py --subs S --messages M` (`fanout_delivered_msgs_per_s`: S durable pull
consumers on one stream, each reading every message, fetch 1000 and ack the last of each
fetch (AckPolicy.ALL); NATS has no Shared subscription, so the shared case is compared with
4 durable consumers per delivered message). M (`--nats-messages`, 10,000) is smaller than
ours because nats-py consumes at ~10-20K msgs/s and the script also produces and reads a
last-value stream; its figure is a rate either way.

`--profile PATH` runs the broker under cProfile (its own `--profile` flag) and leaves its
stats at PATH when it exits; use it with `--no-peers --rounds 1 --cases shared` (or
exclusive), as the timing it gives is the profiler's, not the broker's.
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


def _consume(url: str, topic: str, subs: list[str], ctype: str, ack: str, total: int,
             shared_count, start_at: float, queue_size: int, out, face: str = "sync") -> None:
    """One client process: one Client, a consumer per name in `subs`. Exclusive consumers
    stop after `total` messages each; Shared ones once the processes together (shared_count)
    received and acked `total`. `face` "async": the same through `AsyncClient`."""
    if face == "async":
        import asyncio
        out.put(asyncio.run(_consume_async(url, topic, subs, ctype, ack, total, shared_count,
                                           start_at, queue_size)))
        return
    from shadowtopic.client import Client
    from shadowtopic.core import errors

    now = time.perf_counter
    with Client(url, timeout=60) as client:
        while time.time() < start_at:
            time.sleep(0.001)
        consumers = [client.subscribe(topic, name, consumer_type=ctype,
                                      initial_position="earliest",
                                      receiver_queue_size=queue_size) for name in subs]
        c0 = time.process_time()
        t_start = now()
        got = [0] * len(consumers)
        decoded = 0
        t_first = t_last = None
        shared = ctype == "shared"
        open_ = list(range(len(consumers)))
        while open_:
            progressed = False
            for i in list(open_):
                cons = consumers[i]
                try:
                    # block briefly on the first open consumer, poll the others
                    msgs = cons.batch_receive(max_messages=500,
                                              timeout=0.05 if i == open_[0] else 0.0)
                except errors.Timeout:
                    msgs = []
                if not msgs:
                    continue
                if t_first is None:
                    t_first = now()
                progressed = True
                for m in msgs:
                    decoded += len(m.payload) > 0
                if ack == "cumulative":
                    cons.acknowledge_cumulative(msgs[-1])
                else:
                    for m in msgs:
                        cons.acknowledge(m)
                t_last = now()
                got[i] += len(msgs)
                if shared:
                    with shared_count.get_lock():
                        shared_count.value += len(msgs)
                elif got[i] >= total:
                    open_.remove(i)
            if shared and shared_count.value >= total:
                break
            if not progressed and now() - (t_last or t_start) > 120:
                break  # nothing for two minutes: report what came (the caller fails)
        cpu = time.process_time() - c0
        off = time.time() - time.perf_counter()
        for cons in consumers:
            cons.close()
    out.put({"received": sum(got), "decoded": decoded, "cpu_s": cpu,
             "t_first": (t_first or 0) + off, "t_last": (t_last or 0) + off})


def _produce(url: str, topic: str, messages: int, payload: int) -> None:
    from shadowtopic.client import Client

    with Client(url, timeout=60) as c, c.create_producer(topic) as p:
        data = b"x" * payload
        keys = [f"k{i}" for i in range(1000)]
        for i in range(messages):
            p.send_async(data, key=keys[i % 1000])
        p.flush(timeout=300)
        if p.stats()["acked"] != messages:
            raise SystemExit("bench: pre-fill not fully acked")


def prefill(url: str, topic: str, messages: int, payload: int) -> float:
    ctx = mp.get_context("spawn")  # gRPC channels do not survive fork
    t = time.perf_counter()
    p = ctx.Process(target=_produce, args=(url, topic, messages, payload))
    p.start()
    p.join()
    if p.exitcode != 0:
        raise SystemExit("bench: pre-fill failed")
    return time.perf_counter() - t


def _drained(admin, topic: str, subs: list[str], timeout: float = 30.0) -> float:
    """Seconds until every subscription in `subs` shows no backlog and nothing unacked."""
    t = time.perf_counter()
    while True:
        stats = admin.stats(topic)["subscriptions"]
        left = [s for s in subs if s not in stats or stats[s]["msgBacklog"]
                or stats[s]["unackedMessages"]]
        if not left:
            return time.perf_counter() - t
        if time.perf_counter() - t > timeout:
            s = stats.get(left[0], {})
            raise SystemExit(f"bench: {len(left)} subscriptions still have a backlog "
                             f"{timeout:.0f}s after the last ack (e.g. {left[0]}: "
                             f"backlog {s.get('msgBacklog')}, unacked "
                             f"{s.get('unackedMessages')})")
        time.sleep(0.05)


def proc_cpu(pid: int | None) -> float:
    """User + system CPU seconds of process `pid` so far (0 when unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, TypeError):
        return 0.0


async def _consume_async(url: str, topic: str, subs: list[str], ctype: str, ack: str,
                         total: int, shared_count, start_at: float, queue_size: int) -> dict:
    """`_consume` through `AsyncClient`: `await batch_receive(...)`, then
    `await acknowledge(msg)` per message (or cumulatively)."""
    import asyncio

    from shadowtopic.client import AsyncClient

    now = time.perf_counter
    async with AsyncClient(url, timeout=60) as client:
        while time.time() < start_at:
            await asyncio.sleep(0.001)
        consumers = [await client.subscribe(topic, name, consumer_type=ctype,
                                            initial_position="earliest",
                                            receiver_queue_size=queue_size) for name in subs]
        c0 = time.process_time()
        t_start = now()
        got = [0] * len(consumers)
        decoded = 0
        t_first = t_last = None
        shared = ctype == "shared"
        open_ = list(range(len(consumers)))
        while open_:
            progressed = False
            for i in list(open_):
                cons = consumers[i]
                msgs = await cons.batch_receive(max_messages=500,
                                                timeout=0.05 if i == open_[0] else 0.0)
                if not msgs:
                    continue
                if t_first is None:
                    t_first = now()
                progressed = True
                for m in msgs:
                    decoded += len(m.payload) > 0
                if ack == "cumulative":
                    await cons.acknowledge_cumulative(msgs[-1])
                else:
                    for m in msgs:
                        await cons.acknowledge(m)
                t_last = now()
                got[i] += len(msgs)
                if shared:
                    with shared_count.get_lock():
                        shared_count.value += len(msgs)
                elif got[i] >= total:
                    open_.remove(i)
            if shared and shared_count.value >= total:
                break
            if not progressed and now() - (t_last or t_start) > 120:
                break
        cpu = time.process_time() - c0
        off = time.time() - time.perf_counter()
        for cons in consumers:
            await cons.close()
    return {"received": sum(got), "decoded": decoded, "cpu_s": cpu,
            "t_first": (t_first or 0) + off, "t_last": (t_last or 0) + off}


def consume_round(url: str, admin, topic: str, case: str, tag: str, messages: int,
                  consumers: int, procs: int, ack: str, queue_size: int,
                  broker_pid: int | None = None, face: str = "sync") -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    count = ctx.Value("q", 0)
    if case == "shared":
        ctype, names = "shared", [f"shared-{tag}"] * consumers
        subs = [names[0]]
    else:
        ctype = "exclusive"
        subs = names = [f"excl-{tag}-{i}" for i in range(consumers)]
    groups = [names[i::procs] for i in range(procs)]
    start_at = time.time() + 2.0
    ps = [ctx.Process(target=_consume, args=(url, topic, g, ctype, ack, messages, count,
                                             start_at, queue_size, q, face)) for g in groups]
    for p in ps:
        p.start()
    cpu0 = proc_cpu(broker_pid)
    res = []
    for _ in ps:
        try:
            res.append(q.get(timeout=600))
        except Exception:  # noqa: BLE001 - a consumer died: say so
            raise SystemExit(
                "bench: a consumer process failed (see its traceback above)") from None
    broker_cpu = proc_cpu(broker_pid) - cpu0  # includes subscribe/close: a slight overcount
    for p in ps:
        p.join(30)
    drain = _drained(admin, topic, subs)
    want = messages * (1 if case == "shared" else consumers)
    received = sum(r["received"] for r in res)
    decoded = sum(r["decoded"] for r in res)
    if received < want or decoded != received:
        raise SystemExit(f"bench: {case}: {received} of {want} messages received, "
                         f"{decoded} decoded")
    dt = max(r["t_last"] for r in res) - min(r["t_first"] for r in res if r["t_first"])
    return {"msgs_per_s": round(received / dt), "seconds": round(dt, 3),
            "acked": received, "drain_s": round(drain, 3),
            "client_cpu_us_per_msg": round(sum(r["cpu_s"] for r in res) / received * 1e6, 2),
            "broker_cpu_us_per_msg": round(broker_cpu / received * 1e6, 2),
            "broker_cores": round(broker_cpu / dt, 2)}


def _peer(cmd: list[str], key: str) -> int | None:
    print(f"  running {' '.join(os.path.basename(c) if i == 1 else c for i, c in enumerate(cmd))}",
          flush=True)
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        print("  (timed out)", flush=True)
        return None
    if res.returncode != 0:
        print(f"  failed: {res.stderr.strip()[-300:]}", flush=True)
        return None
    return json.loads(res.stdout.strip().splitlines()[-1]).get(key)


def run_consume(peers: str | None, data_dir: str, messages: int = 200_000, payload: int = 100,
                rounds: int = 3, shared_consumers: int = 4, shared_procs: int = 2,
                exclusive_subs: int = 10,
                exclusive_procs: int = 1, exclusive_ack: str = "cumulative",
                nats_messages: int = 10_000, queue_size: int = 1000,
                cases: tuple[str, ...] = ("shared", "exclusive"),
                profile: str | None = None, part: str = "consume") -> dict:
    """Pre-fill one topic, then per round and case: ceiling, ours, NATS (paired ratios).
    `profile`: a path; the broker then runs under cProfile and dumps its stats there.
    `part`: the bench part it runs for (its topic's namespace and its dirs under
    `data_dir`: bench/run.py's fanout100 runs this too)."""
    import topics  # bench/topics.py

    from shadowtopic.broker.server import free_port
    from shadowtopic.client import Client
    from shadowtopic.metadata.etcd_server import EtcdServer
    from shadowtopic.standalone import BrokerProcess

    topic = topics.name(part)
    with EtcdServer(os.path.join(data_dir, f"etcd-{part}")) as etcd:
        broker = BrokerProcess(etcd.endpoint, os.path.join(data_dir, f"broker-{part}"),
                               free_port(), extra_args=["--profile", profile] if profile else [])
        broker.start(timeout=60)
        try:
            with Client(broker.url, timeout=60) as c:
                c.admin.create_topic(topic)
                fill_s = prefill(broker.url, topic, messages, payload)
                print(f"  pre-filled {messages:,} messages in {fill_s:.1f}s", flush=True)
                out: dict = {}
                for case in cases:
                    out[case] = {"rounds": []}
                for r in range(rounds):
                    for case in cases:
                        n = shared_consumers if case == "shared" else exclusive_subs
                        ceiling = nats = None
                        if peers:
                            ceiling = _peer([sys.executable, os.path.join(peers, "limits.py"),
                                             "--only", "fanout", "--subs", str(n),
                                             "--payload", str(payload)],
                                            "grpc_decoded_fanout_msgs_per_s")
                        ours = consume_round(
                            broker.url, c.admin, topic, case, f"r{r}", messages, n,
                            shared_procs if case == "shared" else exclusive_procs,
                            "individual" if case == "shared" else exclusive_ack, queue_size,
                            broker.proc.pid)
                        if case == "shared":  # the same through AsyncClient, same round
                            ours["aio"] = consume_round(
                                broker.url, c.admin, topic, case, f"r{r}-aio", messages, n,
                                shared_procs, "individual", queue_size, broker.proc.pid,
                                face="async")
                        if peers:
                            nats = _peer([sys.executable,
                                          os.path.join(peers, "nats_jetstream.py"),
                                          "--subs", str(n), "--messages", str(nats_messages),
                                          "--payload", str(payload)],
                                         "fanout_delivered_msgs_per_s")
                        ours.update(ceiling=ceiling, nats=nats,
                                    ratio=round(ours["msgs_per_s"] / ceiling, 4)
                                    if ceiling else None,
                                    nats_ratio=round(ours["msgs_per_s"] / nats, 2)
                                    if nats else None)
                        out[case]["rounds"].append(ours)
                        print(f"  {case} round {r + 1}: {ours}", flush=True)
        finally:
            broker.terminate(timeout=120 if profile else 30)
    for case in cases:
        rs = out[case]["rounds"]
        out[case].update(
            median_msgs_per_s=statistics.median(x["msgs_per_s"] for x in rs),
            median_ratio=_median([x["ratio"] for x in rs]),
            median_nats_ratio=_median([x["nats_ratio"] for x in rs]))
    out["shared"] = {**out.get("shared", {}), "consumers": shared_consumers,
                     "processes": shared_procs, "ack": "individual"} \
        if "shared" in cases else None
    out["exclusive"] = {**out.get("exclusive", {}), "subscriptions": exclusive_subs,
                        "processes": exclusive_procs, "ack": exclusive_ack} \
        if "exclusive" in cases else None
    out.update(messages=messages, payload=payload, nats_messages=nats_messages,
               receiver_queue_size=queue_size, prefill_s=round(fill_s, 2))
    return out


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def consume_lines(res: dict) -> list[str]:
    """The RESULTS.md section."""
    lines = ["## Consume and acknowledge (bench/consume.py)", "",
             f"One topic pre-filled with {res['messages']:,} messages of {res['payload']} bytes "
             "(real etcd + broker process); each round subscribes fresh subscriptions at "
             "\"earliest\" and counts only messages the client received as decoded `Message`s "
             "and acknowledged (rate = acked / first receive -> last ack; after each case the "
             "broker's stats must show no backlog and nothing unacked, `drain` is how long "
             "after the last ack that took; CPU per message from the client processes' "
             "`process_time` and the broker's /proc stat). Receiver queue "
             f"{res['receiver_queue_size']}. Alternating rounds: limits.py `--only fanout "
             "--subs S` (`grpc_decoded_fanout_msgs_per_s`: S streams of pre-encoded "
             "500-message frames parsed by protobuf in one process, nothing acked), ours, then "
             f"nats_jetstream.py `--subs S --messages {res['nats_messages']:,}` "
             "(`fanout_delivered_msgs_per_s`: S durable pull consumers of one stream, each "
             "reading every message, fetch 1000, ack the last of each fetch, one nats-py "
             "process).", ""]
    for case in ("shared", "exclusive"):
        c = res.get(case)
        if not c:
            continue
        if case == "shared":
            lines += [f"### (a) one Shared subscription, {c['consumers']} consumers", "",
                      f"{c['consumers']} consumers over {_procs(c['processes'])} (one "
                      "Client per process: the consumers of a process share its stream), every "
                      "message "
                      "acknowledged **individually** (`acknowledge(msg)`); each message is "
                      "delivered once. NATS has no Shared subscription: its figure is "
                      f"{c['consumers']} durable consumers (each reading every message, acking "
                      "cumulatively), compared per delivered message.", ""]
        else:
            lines += [f"### (b) {c['subscriptions']} Exclusive subscriptions, one consumer each",
                      "", f"{c['subscriptions']} consumers over {_procs(c['processes'])} "
                      "(one Client per process: the consumers of a process share its stream), "
                      f"acknowledging **{c['ack']}ly**"
                      + (" (the last message of each `batch_receive`)"
                         if c["ack"] == "cumulative" else " (every message)")
                      + f"; delivered = {c['subscriptions']} x messages. NATS: "
                      f"{c['subscriptions']} durable consumers, the same pattern.", ""]
        lines += ["| round | ceiling msgs/s | shadowtopic msgs/s | of ceiling | NATS msgs/s "
                  "| x NATS | drain s | CPU us/msg client | CPU us/msg broker |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for i, r in enumerate(c["rounds"], 1):
            lines.append(
                f"| {i} | {_fmt(r['ceiling'])} | "
                f"{r['msgs_per_s']:,} | {_pct(r['ratio'])} | {_fmt(r['nats'])} | "
                f"{_x(r['nats_ratio'])} | {r['drain_s']} | {r['client_cpu_us_per_msg']} | "
                f"{r['broker_cpu_us_per_msg']} |")
            a = r.get("aio")
            if a:
                nx = a["msgs_per_s"] / r["nats"] if r.get("nats") else None
                ra = a["msgs_per_s"] / r["ceiling"] if r.get("ceiling") else None
                lines.append(
                    f"| {i}, AsyncClient | {_fmt(r['ceiling'])} | {a['msgs_per_s']:,} | "
                    f"{_pct(ra)} | {_fmt(r['nats'])} | {_x(nx)} | {a['drain_s']} | "
                    f"{a['client_cpu_us_per_msg']} | {a['broker_cpu_us_per_msg']} |")
        lines.append("")
        lines.append(f"- median round: {c['median_msgs_per_s']:,.0f} msgs/s acked")
        if c["median_ratio"] is not None:
            lines.append(f"- median of the paired ratios to the decoded fan-out ceiling: "
                         f"**{c['median_ratio']:.1%}**")
        if c["median_nats_ratio"] is not None:
            lines.append(f"- median of the paired ratios to NATS JetStream: "
                         f"**{c['median_nats_ratio']:.1f}x**")
        aio = [r["aio"] for r in c["rounds"] if r.get("aio")]
        if aio:
            nx = _median([r["aio"]["msgs_per_s"] / r["nats"] for r in c["rounds"]
                          if r.get("aio") and r.get("nats")])
            lines.append(
                f"- through `AsyncClient` (`await batch_receive`, `await acknowledge` each), "
                f"the same rounds: median {statistics.median(a['msgs_per_s'] for a in aio):,.0f}"
                f" msgs/s, client CPU "
                f"{statistics.median(a['client_cpu_us_per_msg'] for a in aio)} us/msg"
                + (f", **{nx:.1f}x** NATS" if nx is not None else ""))
        lines.append("")
    return lines


def _procs(n: int) -> str:
    return "one client process" if n == 1 else f"{n} client processes"


def _fmt(v) -> str:
    return f"{v:,}" if v else "-"


def _pct(v) -> str:
    return f"{v:.1%}" if v is not None else "-"


def _x(v) -> str:
    return f"{v:.1f}x" if v is not None else "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--payload", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shared-consumers", type=int, default=4)
    p.add_argument("--shared-procs", type=int, default=2,
                   help="client processes the Shared consumers are spread over")
    p.add_argument("--exclusive-subs", type=int, default=10)
    p.add_argument("--exclusive-procs", type=int, default=1)
    p.add_argument("--exclusive-ack", choices=["cumulative", "individual"],
                   default="cumulative")
    p.add_argument("--nats-messages", type=int, default=10_000)
    p.add_argument("--receiver-queue", type=int, default=1000)
    p.add_argument("--cases", default="shared,exclusive")
    p.add_argument("--profile", default=None,
                   help="run the broker under cProfile and dump its stats to this path")
    a = p.parse_args()
    peers = os.path.join(a.shared, "peers")
    base = os.path.join(ROOT, "data", "bench")
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as d:
        res = run_consume(None if a.no_peers or not os.path.isdir(peers) else peers, d,
                          a.messages, a.payload, a.rounds, a.shared_consumers,
                          a.shared_procs, a.exclusive_subs, a.exclusive_procs, a.exclusive_ack,
                          a.nats_messages, a.receiver_queue, tuple(a.cases.split(",")),
                          os.path.abspath(a.profile) if a.profile else None)
    print(json.dumps(res))
    print("\n".join(consume_lines(res)))


if __name__ == "__main__":
    main()
