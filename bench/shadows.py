"""Shadow topics (issue 9), measured through the public client against one real etcd, a source
broker and a shadow broker (`python -m shadowtopic.shadow.broker`) on one shared storage root, as
`make run` runs them. The client always names the SOURCE broker; Lookup routes shadow
topics to the shadow broker. One shadow broker process serves every shadow.

    .venv/bin/python bench/shadows.py --shared ../shared [--rounds 3] [--parts create,...]

- create: a source pre-filled with `--create-messages` (1,000,000) messages of 100 bytes
  (bench/run.py's producer processes); then `--create-reps` times `admin.create_shadow_topic`
  with a fresh shadow name, timed around the call (median, max) [< 50 ms]. The storage root
  and the shadow broker's data dir are listed before and after: a shadow must add no file.
  The source has `replicator_auto_reset_backlog_entries` = `--create-auto-reset` (10,000),
  so a new shadow's replicator starts at the tail instead of replaying 1M ids (which loads
  the source broker during the next creates and has crashed it: bench/NOTES.md).
- latency: a paced producer process sends `--rate` (10,000) msgs/s for `--seconds` (15) per
  case, `--tick` (5 ms) worth of messages every tick with `send_async`, one batch each
  (`batch_max_messages` = messages per tick, so no linger), payload = sequence + send time;
  one reader per shadow "from latest" in one client process (a thread per reader);
  latency = `time.time()` when `read_next` returns - send time, every message of every
  reader after the first second. Cases, alternating within each round: a reader of the
  source itself (baseline), 1 shadow, 4 shadows (each case a source of its own, with that
  many shadows) [p99 < 10 ms].
- catch-up: a source pre-filled with `--catchup-messages` (100,000); each round:
  `create_shadow_topic` of a fresh shadow, poll its last message id until it is the source's
  (`serving`: the shadow serves the whole history), then a reader "from earliest" (this
  process, receiver queue `--catchup-queue`) reads to the last message; total = create ->
  last read. Then the same reader on the source itself (the client's own speed). Alternating
  with nats_jetstream.py `--messages N --subs 0` (`mirror_catch_up_s`: a mirror stream
  created on a stream of N messages, until it holds all N) [total >= 2x faster than NATS].
- cpu: per case a fresh source with 0, 1, 4 or 8 shadows, each with one reader following the
  tail (one client process, a thread per reader); this process produces `--cpu-messages`
  (200,000) at full speed; CPU seconds of the source broker and the shadow broker
  (/proc/<pid>/stat) from the first send until every reader had the last message, minus
  each broker's idle rate measured just before over the same window length; us per produced
  message [the source's grows sub-linearly with shadows].

- latency-remote (issue 21): the latency cases on a cluster of their own where the source
  broker and the shadow broker each have their own data dir and `--wal-dir` (as on two
  machines; sealed ledgers in one storage root): the shadow broker gets the unsealed tail
  over gRPC (shadow/tail.py). Same cases, alternating, and in each shadow case a reader of
  the source itself beside the shadows' (the same client process, the same load): p99 / that
  reader's p99 per round and its median [<= 1.5x for 1 and 4 shadows]; p99 / the lone
  source reader's too.
- catchup-s3 (issue 21): the catch-up (no NATS) on a cluster whose storage root is a bucket
  on moto's S3 server (a process on a loopback port; tests/support/s3_support.py),
  every broker with its own `--wal-dir`; the source's `ledger_max_bytes` is
  `--catchup-ledger-bytes` (2 MiB) so the history is in sealed ledgers in the bucket.
  `--profile PREFIX` profiles these clusters' brokers to PREFIX-remote.* / PREFIX-s3.*.

Fan-out and broadcast over shadows are bench/shadows_scale.py. bench/run.py --only
shadows,shadows-scale puts both in RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import struct
import sys
import tempfile
import threading
import time
import uuid
from array import array

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
if BENCH not in sys.path:  # the sibling bench modules imported below
    sys.path.insert(0, BENCH)

HEAD = struct.Struct("<Qd")  # sequence, send time (time.time())
PARTS = ("create", "latency", "catchup", "cpu", "latency-remote", "catchup-s3")


def topic_name(part: str, local: str) -> str:
    from topics import name  # bench/topics.py (imported here, after BENCH is on sys.path)
    return name(part, local)


def proc_cpu(pid: int) -> float:
    from consume import proc_cpu as cpu  # bench/consume.py
    return cpu(pid)


def pct(values, q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))]


def ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 2)


class Pair:
    """etcd + a source broker + shadow broker(s) on one storage root (a cluster of its own).

    `split_wal`: each broker keeps its open ledgers' WAL under its own data dir (`--wal-dir`),
    as on separate machines: a shadow broker then reads the unsealed tail from the source
    broker over gRPC (shadow/tail.py). `s3`: a started moto server (MotoS3 of
    tests/support/s3_support.py): the storage root is a fresh bucket on it.
    `shadow_brokers`: how many shadow broker processes (shadows are placed among them)."""

    def __init__(self, data_dir: str, tag: str = "shadows", profile: str | None = None,
                 split_wal: bool = False, s3=None, shadow_brokers: int = 1):
        """`profile`: a path prefix; each broker then runs under cProfile and dumps its stats
        to `<profile>.source` / `<profile>.shadow` when it exits."""
        from shadowtopic.broker.server import free_port
        from shadowtopic.metadata.etcd_server import EtcdServer
        from shadowtopic.standalone import BrokerProcess

        self.root = os.path.join(data_dir, f"storage-{tag}")
        env = None
        s3_args: list[str] = []
        if s3 is not None:
            self.root = f"s3://{s3.new_bucket()}/bench-{tag}"
            env, s3_args = s3.env, s3.s3_args()
        self.etcd = EtcdServer(os.path.join(data_dir, f"etcd-{tag}"))
        self.etcd.start()
        args = ["--storage-root", self.root, "--cluster", f"bench-{uuid.uuid4().hex[:8]}",
                *s3_args]

        def own(name: str) -> list[str]:
            wal = ["--wal-dir", os.path.join(data_dir, f"{name}-{tag}", "wal-root")] \
                if split_wal else []
            return wal + (["--profile", f"{profile}.{name}"] if profile else [])

        self.src = BrokerProcess(self.etcd.endpoint, os.path.join(data_dir, f"src-{tag}"),
                                 free_port(), extra_args=args + own("source"), env=env)
        names = ["shadow"] + [f"shadow{i + 1}" for i in range(1, shadow_brokers)]
        self.shs = [BrokerProcess(self.etcd.endpoint, os.path.join(data_dir, f"{n}-{tag}"),
                                  free_port(), extra_args=args + own(n),
                                  module="shadowtopic.shadow.broker", env=env) for n in names]
        self.sh = self.shs[0]
        for b in (self.src, *self.shs):
            b.start(timeout=60)
        self.timeout = 120.0 if profile else 30.0
        self.url = self.src.url
        self.src_pid, self.sh_pid = self.src.proc.pid, self.sh.proc.pid
        self.sh_pids = [b.proc.pid for b in self.shs]

    def close(self) -> None:
        for b in (*self.shs, self.src):
            b.terminate(timeout=self.timeout)
        self.etcd.stop()

    def __enter__(self) -> Pair:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def files(*roots: str) -> dict[str, int]:
    out = {}
    for root in roots:
        for d, _, names in os.walk(root):
            if "/logs" in d:
                continue
            for n in names:
                p = os.path.join(d, n)
                try:
                    out[p] = os.path.getsize(p)
                except OSError:
                    pass
    return out


def idle_rates(pids: list[int], seconds: float = 2.0) -> list[float]:
    c0 = [proc_cpu(p) for p in pids]
    time.sleep(seconds)
    return [(proc_cpu(p) - c) / seconds for p, c in zip(pids, c0)]


# ---- client processes -------------------------------------------------------------------

def _readers(url: str, topics: list[str], expect: int, warm: int, ready, stop, out) -> None:
    """One Client, a reader "from latest" per topic, a thread each: records the latency of
    every message with seq >= warm (its send time is in the payload); a thread stops after
    `expect` messages (0: when `stop` is set)."""
    from shadowtopic.client import Client, errors

    n = len(topics)
    lats = [array("d") for _ in range(n)]
    got = [0] * n
    last = [0.0] * n
    unpack = HEAD.unpack_from
    with Client(url, timeout=60) as client:
        readers = [client.create_reader(t, start="latest") for t in topics]

        def loop(i: int) -> None:
            r, lat = readers[i], lats[i]
            while not stop.is_set() and (not expect or got[i] < expect):
                try:
                    m = r.read_next(timeout=0.2)
                except errors.Timeout:
                    continue
                now = time.time()
                seq, sent = unpack(m.payload)
                got[i] += 1
                last[i] = now
                if seq >= warm:
                    lat.append(now - sent)

        ts = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(n)]
        c0 = time.process_time()
        for t in ts:
            t.start()
        ready.set()
        for t in ts:
            t.join()
        cpu = time.process_time() - c0
    out.put({"got": got, "last": last, "lat": [a.tobytes() for a in lats], "cpu_s": cpu})


def _paced(url: str, topic: str, rate: int, seconds: float, tick: float, payload: int,
           out) -> None:
    """`rate` msgs/s for `seconds`: every `tick` s one batch of rate*tick messages, on a fixed
    schedule (late ticks catch up at once)."""
    from shadowtopic.client import Client

    per = max(1, round(rate * tick))
    pad = b"x" * max(0, payload - HEAD.size)
    with Client(url, timeout=60) as c:
        p = c.create_producer(topic, batch_max_messages=per, linger_ms=1)
        ticks = int(seconds / tick)
        seq = 0
        late = 0
        acks: list[float] = []

        def receipt(sent: float):
            return lambda mid, exc: acks.append(time.time() - sent)
        t0 = time.time() + 0.2
        for k in range(ticks):
            ahead = t0 + k * tick - time.time()
            if ahead > 0:
                time.sleep(ahead)
            elif ahead < -0.005:
                late += 1
            for j in range(per):
                now = time.time()
                p.send_async(HEAD.pack(seq, now) + pad, callback=None if j else receipt(now))
                seq += 1
        t1 = time.time()
        p.flush(timeout=60)
        acked = p.stats()["acked"]
    out.put({"sent": seq, "acked": acked, "seconds": t1 - t0, "late_ticks": late,
             "ack_p50_ms": ms(pct(acks, 0.5)), "ack_p99_ms": ms(pct(acks, 0.99))})


def _spawn(target, *args):
    ctx = mp.get_context("spawn")  # gRPC channels do not survive fork
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q), daemon=True)
    p.start()
    return p, q


def _get(q, p, timeout: float, what: str):
    deadline = time.time() + timeout
    while True:
        try:
            return q.get(timeout=1.0)
        except Exception:
            if p.exitcode not in (None, 0) or time.time() > deadline:
                raise SystemExit(
                    f"bench: shadows: {what} failed (see its traceback above)") from None


def start_readers(url: str, topics: list[str], expect: int = 0, warm: int = 0):
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    p, q = _spawn(_readers, url, topics, expect, warm, ready, stop)
    if not ready.wait(60):
        raise SystemExit("bench: shadows: readers did not attach")
    return p, q, stop


# ---- the parts ----------------------------------------------------------------------------

def run_create(pair: Pair, c, messages: int, reps: int, payload: int,
               auto_reset: int = 10_000) -> dict:
    from run import produce_round  # bench/run.py

    from shadowtopic.client import Policies

    src = topic_name("shadows", "big")
    c.admin.create_topic(src, policies=Policies(replicator_auto_reset_backlog_entries=auto_reset)
                         if auto_reset else None)
    fill = produce_round(pair.url, src, messages, 4, payload, sample=1000)
    print(f"  pre-filled {messages:,} messages ({fill['msgs_per_s']:,} msgs/s)", flush=True)
    time.sleep(2.0)  # let a ledger sealed at the end of the fill settle
    roots = (pair.root, pair.sh.data_dir)
    before = files(*roots)
    times = []
    for i in range(reps):
        t = time.perf_counter()
        c.admin.create_shadow_topic(f"{src}-shadow-{i}", src)
        times.append(time.perf_counter() - t)
    time.sleep(2.0)  # the replicators start, the shadow broker loads the shadows
    after = files(*roots)
    new = sorted(set(after) - set(before))
    return {"messages": messages, "reps": reps, "fill_msgs_per_s": fill["msgs_per_s"],
            "auto_reset": auto_reset,
            "ms": [ms(t) for t in times], "ms_median": ms(statistics.median(times)),
            "ms_max": ms(max(times)), "files_before": len(before), "new_files": new,
            "shadow_files": [f for f in new if "shadow" in os.path.relpath(f, pair.root)],
            "stats_internal_ledgers": len(c.admin.internal_stats(src).get("ledgers", []))}


def latency_case(pair: Pair, src: str, readers: list[str], rate: int, seconds: float,
                 tick: float, payload: int, beside: bool = False) -> dict:
    """One case: `readers` follow the tail while `src` gets `rate` msgs/s. With `beside`, a
    reader of `src` itself runs in the same client process (its figures: `beside_*`), the
    shadows' reference under the same load."""
    if beside:
        readers = [src, *readers]
    pr, qr, stop = start_readers(pair.url, readers, warm=rate)
    cpu0 = [proc_cpu(pair.src_pid), proc_cpu(pair.sh_pid)]
    pp, qp = _spawn(_paced, pair.url, src, rate, seconds, tick, payload)
    prod = _get(qp, pp, seconds + 120, "the paced producer")
    time.sleep(1.0)
    cpu1 = [proc_cpu(pair.src_pid), proc_cpu(pair.sh_pid)]
    stop.set()
    res = _get(qr, pr, 60, "the readers")
    pp.join(10)
    pr.join(10)
    lats = [array("d", b) for b in res["lat"]]
    extra = {}
    if beside:
        ref, lats = lats[0], lats[1:]
        readers = readers[1:]
        extra = {"beside_p50_ms": ms(pct(ref, 0.5)), "beside_p99_ms": ms(pct(ref, 0.99)),
                 "beside_missing": prod["sent"] - res["got"][0]}
        res["got"] = res["got"][1:]
    lat = [x for a in lats for x in a]
    return {**extra, "readers": len(readers), "sent": prod["sent"], "acked": prod["acked"],
            "rate": round(prod["sent"] / prod["seconds"]), "late_ticks": prod["late_ticks"],
            "ack_p50_ms": prod["ack_p50_ms"], "ack_p99_ms": prod["ack_p99_ms"],
            "missing": sum(prod["sent"] - g for g in res["got"]),
            "p50_ms": ms(pct(lat, 0.5)), "p99_ms": ms(pct(lat, 0.99)),
            "p999_ms": ms(pct(lat, 0.999)), "max_ms": ms(max(lat) if lat else None),
            "samples": len(lat), "reader_cpu_s": round(res["cpu_s"], 2),
            "src_cores": round((cpu1[0] - cpu0[0]) / prod["seconds"], 3),
            "sh_cores": round((cpu1[1] - cpu0[1]) / prod["seconds"], 3)}


def run_latency(pair: Pair, c, rate: int, seconds: float, tick: float, rounds: int,
                payload: int, counts=(0, 1, 4), beside: bool = False) -> dict:
    """The cases in `counts` (0: a reader of the source alone), alternating in each round;
    with `beside`, each shadow case also reads the source in the same client process and
    its ratio is to that reader."""
    setups = {}
    for n in counts:
        src = topic_name("shadows", f"lat{n}")
        c.admin.create_topic(src)
        shadows = [f"{src}-shadow-{i}" for i in range(n)]
        for s in shadows:
            c.admin.create_shadow_topic(s, src)
        setups[n] = (src, shadows or [src])
    out: dict = {"rate": rate, "seconds": seconds, "tick_ms": tick * 1000, "rounds": []}
    for r in range(rounds):
        row = {}
        for n in counts:
            src, readers = setups[n]
            row[n] = latency_case(pair, src, readers, rate, seconds, tick, payload,
                                  beside=beside and n > 0)
            print(f"  latency round {r + 1}, {n or 'no'} shadows: {row[n]}", flush=True)
        out["rounds"].append(row)
    for n in counts:
        rs = [row[n] for row in out["rounds"]]
        out[f"median_p50_ms_{n}"] = statistics.median(x["p50_ms"] for x in rs)
        out[f"median_p99_ms_{n}"] = statistics.median(x["p99_ms"] for x in rs)
        if n and beside:
            out[f"median_beside_p50_ms_{n}"] = statistics.median(x["beside_p50_ms"] for x in rs)
            out[f"median_beside_p99_ms_{n}"] = statistics.median(x["beside_p99_ms"] for x in rs)
            out[f"median_p99_over_beside_{n}"] = round(statistics.median(
                x["p99_ms"] / x["beside_p99_ms"] for x in rs), 2)
        if n and 0 in counts:
            out[f"median_p99_over_source_{n}"] = round(statistics.median(
                row[n]["p99_ms"] / row[0]["p99_ms"] for row in out["rounds"]), 2)
    return out


def _read_all(c, topic: str, messages: int, queue: int) -> tuple[float, float, str]:
    """A reader from earliest reads `messages`: (seconds to the first, to the last, last id)."""
    t0 = time.perf_counter()
    with c.create_reader(topic, start="earliest", receiver_queue_size=queue) as reader:
        last = reader.read_next(timeout=60)
        t1 = time.perf_counter()
        for _ in range(messages - 1):
            last = reader.read_next(timeout=60)
    return t1 - t0, time.perf_counter() - t0, str(last.message_id)


def catchup_round(c, src: str, shadow: str, messages: int, queue: int, last_id) -> dict:
    """Create `shadow`, poll its last message id until it is the source's (serving the whole
    history), then read it all from earliest; and read the source itself the same way."""
    t0 = time.perf_counter()
    c.admin.create_shadow_topic(shadow, src)
    t1 = time.perf_counter()
    for _ in range(300_000):  # bounded: 2 ms polls, and 600 s
        if c.admin.last_message_id(shadow) == last_id:
            break
        if time.perf_counter() - t0 > 600:
            raise SystemExit(f"bench: shadows: catch-up: {shadow} not serving after 600 s")
        time.sleep(0.002)
    t2 = time.perf_counter()
    first, read, last = _read_all(c, shadow, messages, queue)
    seconds = t2 - t0 + read
    cpu = time.process_time()
    _, src_read, _ = _read_all(c, src, messages, queue)
    return {"seconds": round(seconds, 3), "create_s": round(t1 - t0, 4),
            "serving_s": round(t2 - t0, 4), "read_s": round(read, 3),
            "first_s": round(t2 - t0 + first, 3), "msgs_per_s": round(messages / seconds),
            "last": last, "source_read_s": round(src_read, 3),
            "client_us_per_msg_source_read": round((time.process_time() - cpu) / messages
                                                   * 1e6, 1),
            "nats_s": None, "nats_ratio": None, "nats_serving_ratio": None}


def run_catchup(pair: Pair, c, messages: int, rounds: int, payload: int, queue: int,
                peers: str | None, ledger_bytes: int = 0) -> dict:
    """`ledger_bytes`: the source's ledger_max_bytes (0: the default policy), so that the
    history is in sealed ledgers of the storage root (catchup-s3)."""
    from run import produce_round, run_peer  # bench/run.py

    from shadowtopic.client import Policies

    src = topic_name("shadows", "history")
    c.admin.create_topic(src, policies=Policies(ledger_max_bytes=ledger_bytes)
                         if ledger_bytes else None)
    produce_round(pair.url, src, messages, 2, payload, sample=1000)
    time.sleep(2.0)  # the last roll-over's seal lands
    out: dict = {"messages": messages, "receiver_queue": queue, "rounds": [],
                 "storage_root": pair.root, "ledger_max_bytes": ledger_bytes or None,
                 "ledgers": len(c.admin.internal_stats(src).get("ledgers", []))}
    last_id = c.admin.last_message_id(src)
    for r in range(rounds):
        row = catchup_round(c, src, f"{src}-shadow-{r}", messages, queue, last_id)
        if peers:
            js = run_peer([sys.executable, os.path.join(peers, "nats_jetstream.py"),
                           "--messages", str(messages), "--payload", str(payload),
                           "--subs", "0"], "nats_jetstream.py (mirror catch-up)")
            row["nats_s"] = (js or {}).get("mirror_catch_up_s")
            if row["nats_s"]:
                row["nats_ratio"] = round(row["nats_s"] / row["seconds"], 2)
                row["nats_serving_ratio"] = round(row["nats_s"] / row["serving_s"], 1)
        out["rounds"].append(row)
        print(f"  catch-up round {r + 1}: {row}", flush=True)
    out["median_s"] = statistics.median(x["seconds"] for x in out["rounds"])
    out["median_serving_s"] = statistics.median(x["serving_s"] for x in out["rounds"])
    for k in ("nats_ratio", "nats_serving_ratio"):
        ratios = [x[k] for x in out["rounds"] if x[k]]
        out[f"median_{k}"] = statistics.median(ratios) if ratios else None
    return out


def cpu_case(pair: Pair, c, tag: str, n: int, messages: int, payload: int) -> dict:
    src = topic_name("shadows", f"cpu-{tag}-{n}")
    c.admin.create_topic(src)
    shadows = [f"{src}-shadow-{i}" for i in range(n)]
    for s in shadows:
        c.admin.create_shadow_topic(s, src)
    pr = None
    if shadows:
        pr, qr, stop = start_readers(pair.url, shadows, expect=messages, warm=messages)
    time.sleep(1.0)
    pids = [pair.src_pid, pair.sh_pid]
    idle = idle_rates(pids, 2.0)
    pad = b"x" * max(0, payload - HEAD.size)
    producer = c.create_producer(src)
    cpu0 = [proc_cpu(p) for p in pids]
    t0 = time.perf_counter()
    for i in range(messages):
        producer.send_async(HEAD.pack(i, 0.0) + pad)
    producer.flush(timeout=300)
    t1 = time.perf_counter()
    got = None
    if pr is not None:
        res = _get(qr, pr, 600, "the tail readers")
        got = res["got"]
        pr.join(10)
    t2 = time.perf_counter()
    cpu1 = [proc_cpu(p) for p in pids]
    producer.close()
    if got is not None and min(got) < messages:
        raise SystemExit(f"bench: shadows: cpu: readers got {got} of {messages}")
    span = t2 - t0
    raw = [b - a for a, b in zip(cpu0, cpu1)]
    net = [max(0.0, x - rate * span) for x, rate in zip(raw, idle)]
    row = {"shadows": n, "messages": messages, "produce_s": round(t1 - t0, 2),
           "window_s": round(span, 2), "src_cpu_s": round(raw[0], 2),
           "sh_cpu_s": round(raw[1], 2), "idle_cores": [round(x, 4) for x in idle],
           "src_us_per_msg": round(net[0] / messages * 1e6, 2),
           "sh_us_per_msg": round(net[1] / messages * 1e6, 2),
           "src_us_per_msg_raw": round(raw[0] / messages * 1e6, 2)}
    for s in shadows:
        c.admin.delete_shadow_topic(s)
    c.admin.delete_topic(src, force=True)
    return row


def run_cpu(pair: Pair, c, messages: int, rounds: int, payload: int,
            counts=(0, 1, 4, 8)) -> dict:
    out: dict = {"messages": messages, "counts": list(counts), "rounds": []}
    for r in range(rounds):
        row = {}
        for n in counts:
            row[n] = cpu_case(pair, c, f"r{r}", n, messages, payload)
            print(f"  cpu round {r + 1}, {n} shadows: {row[n]}", flush=True)
        out["rounds"].append(row)
    for n in counts:
        for k in ("src_us_per_msg", "sh_us_per_msg"):
            out[f"median_{k}_{n}"] = statistics.median(row[n][k] for row in out["rounds"])
        if n:  # the source's extra cost of n shadows over none, paired per round
            out[f"median_src_extra_us_{n}"] = round(statistics.median(
                row[n]["src_us_per_msg"] - row[0]["src_us_per_msg"]
                for row in out["rounds"]), 2)
    return out


def run_shadows(data_dir: str, peers: str | None, a) -> dict:
    """The parts in `a.parts` against one Pair; returns {part: results}."""
    from shadowtopic.client import Client

    parts = a.parts.split(",") if isinstance(a.parts, str) else list(a.parts)
    res: dict = {"parts": parts, "load_start": os.getloadavg()}
    if set(parts) & {"create", "latency", "catchup", "cpu"}:
        with Pair(data_dir, profile=getattr(a, "profile", None)) as pair, \
                Client(pair.url, timeout=120) as c:
            if "latency" in parts:
                print("running shadow latency cases (source / 1 / 4 shadows, alternating)",
                      flush=True)
                res["latency"] = run_latency(pair, c, a.rate, a.seconds, a.tick, a.rounds,
                                             a.payload)
            if "cpu" in parts:
                print("running source broker CPU per message with 0 / 1 / 4 / 8 shadows",
                      flush=True)
                res["cpu"] = run_cpu(pair, c, a.cpu_messages, a.rounds, a.payload)
            if "catchup" in parts:
                print("running shadow catch-up rounds (ours / NATS mirror, alternating)",
                      flush=True)
                res["catchup"] = run_catchup(pair, c, a.catchup_messages, a.rounds, a.payload,
                                             a.catchup_queue, peers)
            if "create" in parts:
                print(f"running create-shadow on a source of {a.create_messages:,} messages",
                      flush=True)
                res["create"] = run_create(pair, c, a.create_messages, a.create_reps, a.payload,
                                           a.create_auto_reset)
    if "latency-remote" in parts:
        print("running shadow latency with the shadow broker on its own WAL dir (the tail "
              "over gRPC): source / 1 / 4 shadows, alternating", flush=True)
        with Pair(data_dir, "remote", profile=_prof(a, "remote"), split_wal=True) as pair, \
                Client(pair.url, timeout=120) as c:
            res["latency_remote"] = run_latency(pair, c, a.rate, a.seconds, a.tick, a.rounds,
                                                a.payload, beside=True)
    if "catchup-s3" in parts:
        print(f"running catch-up of {a.catchup_messages:,} messages from sealed ledgers in "
              "an s3:// root (moto's server)", flush=True)
        with _moto_s3()(data_dir) as moto, \
                Pair(data_dir, "s3", profile=_prof(a, "s3"), split_wal=True, s3=moto) as pair, \
                Client(pair.url, timeout=120) as c:
            res["catchup_s3"] = run_catchup(pair, c, a.catchup_messages, a.rounds, a.payload,
                                            a.catchup_queue, None, a.catchup_ledger_bytes)
    res["load_end"] = os.getloadavg()
    return res


def _moto_s3():
    """The test kit's moto S3 server (tests/support/s3_support.py, imported as `support.*`
    as the tests do; not part of the installed package): tests/ goes at the END of sys.path,
    so nothing there can stand in for the installed `shadowtopic`."""
    kit = os.path.join(ROOT, "tests")
    if kit not in sys.path:
        sys.path.append(kit)
    from support.s3_support import MotoS3
    return MotoS3


def _prof(a, tag: str) -> str | None:
    prof = getattr(a, "profile", None)
    return f"{prof}-{tag}" if prof else None


def add_args(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """The options, also bench/run.py's (there with the prefix `shadows-`)."""
    o = f"--{prefix}"
    p.add_argument(f"{o}parts", default=",".join(PARTS), help="subset of " + ",".join(PARTS))
    p.add_argument(f"{o}create-messages", type=int, default=1_000_000)
    p.add_argument(f"{o}create-reps", type=int, default=10)
    p.add_argument(f"{o}create-auto-reset", type=int, default=10_000,
                   help="create: the source's replicator_auto_reset_backlog_entries (0: the "
                        "default policy; then each new shadow's replicator replays the ids of "
                        "the whole history, and concurrent Parquet reads can crash the source "
                        "broker: see bench/NOTES.md)")
    p.add_argument(f"{o}rate", type=int, default=10_000, help="latency: msgs/s")
    p.add_argument(f"{o}seconds", type=float, default=15.0, help="latency: seconds per case")
    p.add_argument(f"{o}tick", type=float, default=0.005, help="latency: seconds per batch")
    p.add_argument(f"{o}catchup-messages", type=int, default=100_000)
    p.add_argument(f"{o}catchup-queue", type=int, default=1000,
                   help="catch-up: the reader's receiver queue")
    p.add_argument(f"{o}catchup-ledger-bytes", type=int, default=2 << 20,
                   help="catchup-s3: the source's ledger_max_bytes (the history is then in "
                        "sealed ledgers in the bucket; default 2 MiB)")
    p.add_argument(f"{o}cpu-messages", type=int, default=200_000)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--payload", type=int, default=100)
    p.add_argument("--profile", default=None,
                   help="path prefix: both brokers run under cProfile, stats to PREFIX.source "
                        "and PREFIX.shadow (timings are then the profiler's)")
    add_args(p)
    a = p.parse_args()
    if a.profile:
        a.profile = os.path.abspath(a.profile)
    peers = os.path.join(a.shared, "peers")
    peers = None if a.no_peers or not os.path.isdir(peers) else peers
    base = os.path.join(ROOT, "data", "bench")
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as d:
        res = run_shadows(d, peers, a)
    print(json.dumps(res))
    from shadows_report import shadows_lines  # bench/shadows_report.py
    print("\n".join(shadows_lines(res)))


if __name__ == "__main__":
    main()
