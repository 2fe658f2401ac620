"""The write-ahead log on object storage (issue 33), against moto's S3 server and a real etcd,
every figure from one run with alternating rounds.

    .venv/bin/python bench/object_wal.py [--rounds 3] [--parts latency,rates,recovery]

- latency: two source brokers of one cluster, one with the local WAL (fsync) and one with
  `--wal s3://...` (one object and one etcd transaction per flush window, `--window-ms`,
  5 by default). A paced
  producer process (as bench/shadows.py's: `--tick` (5 ms) worth of messages every tick,
  one batch each, no linger beyond the tick) sends `--rate` (10,000) msgs/s for `--seconds`
  (10) to a fresh topic on one broker, then on the other (alternating, `--rounds` times);
  EVERY message's ack latency is timed (send -> receipt callback, the first second left
  out). In the same rounds, this process times `--probes` (300) PUTs of the object size the
  broker wrote in that round to the same S3 server, and as many etcd transactions shaped as
  a commit (a compare on a key's value + a put of ~60 bytes) to the same etcd: the floor
  [p99 of the S3 WAL <= PUT p99 + txn p99 + 10 ms].
- rates: the broker with the S3 WAL takes the same 10,000 msgs/s spread over 1, 10 and 100
  topics (one producer each, in one producer process); its PUTs and etcd transactions a
  second, from its /metrics counters (`shadowtopic_wal_object_puts`,
  `shadowtopic_wal_commit_txns`) [flat: bounded by the window, not by the topics].
- recovery: two brokers with the S3 WAL; `--recovery-messages` (100,000) messages of
  `--payload` bytes produced to a topic owned by one of them (all in its open ledger); that
  broker is killed (SIGKILL) and its data dir deleted; this process then produces through
  the other broker until a send is acknowledged (the lease, `--lease-ttl` 2 s, expires;
  the other broker takes the topic, rebuilds the open ledger from the objects and seals it)
  and reads the last of the messages back. Times from the kill; alternating which broker
  is lost.

A bench, not a test: every wait is bounded. Prints one JSON object, then the RESULTS lines.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

from shadows import HEAD, _get, _moto_s3, pct  # noqa: E402 - bench/shadows.py

PARTS = ("latency", "rates", "recovery")


def ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 2)


# ---- the producer process ---------------------------------------------------------------------

def _paced(url: str, topics: list[str], rate: int, seconds: float, tick: float, payload: int,
           warm: float, out) -> None:
    """`rate` msgs/s over `topics` for `seconds`: every `tick`, rate*tick messages spread
    over the topics (one producer each); every message's ack latency is timed."""
    from shadowtopic.client import Client

    per = max(1, round(rate * tick))
    pad = os.urandom(max(0, payload - HEAD.size))
    lat: list[float] = []
    errors: list[str] = []
    with Client(url, timeout=60) as c:
        ps = [c.create_producer(t, batch_max_messages=max(1, per // min(len(topics), max(
            1, per // 10)) + 1), linger_ms=1, max_inflight=1000) for t in topics]
        t0 = time.time() + 0.3
        cut = t0 + warm

        def receipt(sent: float):
            def done(_mid, exc) -> None:
                if exc is not None:
                    errors.append(repr(exc))
                elif sent >= cut:
                    lat.append(time.time() - sent)
            return done
        seq, late = 0, 0
        # each tick's messages go in batches of about 10 to a rotating subset of the topics
        # (at 10,000 msgs/s and 100 topics, one message per topic per tick would be 10,000
        # batches a second, more than one client process sends)
        k_per_tick = min(len(ps), max(1, per // 10))
        turn = 0
        for k in range(int(seconds / tick)):
            ahead = t0 + k * tick - time.time()
            if ahead > 0:
                time.sleep(ahead)
            elif ahead < -0.005:
                late += 1
            for j in range(per):
                now = time.time()
                ps[(turn + j % k_per_tick) % len(ps)].send_async(
                    HEAD.pack(seq + j, now) + pad, callback=receipt(now))
            turn += k_per_tick
            seq += per
        t1 = time.time()
        for p in ps:
            p.flush(timeout=60)
            p.close()
    out.put({"sent": seq, "seconds": t1 - t0, "late_ticks": late, "errors": errors[:3],
             "n_errors": len(errors), "lat": lat})


def paced(url: str, topics: list[str], a) -> dict:
    from shadowtopic.client import Client
    with Client(url, timeout=60) as c:
        for t in topics:
            c.admin.create_topic(t)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_paced, args=(url, topics, a.rate, a.seconds, a.tick, a.payload,
                                         1.0, q), daemon=True)
    p.start()
    try:
        res = _get(q, p, a.seconds + 180, "the paced producer")
        p.join(30)
    finally:
        # every case starts on brokers that serve nothing: 100 loaded idle topics cost a
        # broker about 15% of a core here (a watch thread each, flushers), and the later
        # rounds of the first run of this bench were skewed by the topics of earlier ones
        with Client(url, timeout=60) as c:
            for t in topics:
                try:
                    c.admin.delete_topic(t, force=True)
                except Exception as exc:  # noqa: BLE001 - a leftover skews, never fails
                    print(f"bench: {t} not deleted: {exc}", flush=True)
    lat = res.pop("lat")
    res.update(p50_ms=ms(pct(lat, 0.5)), p99_ms=ms(pct(lat, 0.99)),
               p999_ms=ms(pct(lat, 0.999)), timed=len(lat))
    return res


# ---- the cluster ------------------------------------------------------------------------------

class Cluster:
    """etcd, moto and source brokers of one cluster: `local` (local WAL) and `s3` brokers
    (`--wal s3://bucket/wal`), each with its own data dir."""

    def __init__(self, base: str, moto, local: int, s3: int, lease_ttl: int,
                 window_ms: float = 5.0, flushes: int = 4, profile: str | None = None):
        from shadowtopic.broker.server import free_port
        from shadowtopic.metadata.etcd_server import EtcdServer
        from shadowtopic.standalone import BrokerProcess

        self.base, self.moto = base, moto
        self.bucket = moto.new_bucket()
        self.etcd = EtcdServer(os.path.join(base, "etcd"))
        self.etcd.start()
        cluster = f"bench-{uuid.uuid4().hex[:8]}"
        common = ["--cluster", cluster, "--lease-ttl", str(lease_ttl),
                  "--storage-root", f"s3://{self.bucket}/root", *moto.s3_args()]
        self.metrics: dict[str, str] = {}
        self.brokers = []
        for i in range(local + s3):
            port, mport = free_port(), free_port()
            wal = [] if i < local else ["--wal", f"s3://{self.bucket}/wal",
                                        "--wal-window-ms", str(window_ms),
                                        "--wal-flushes", str(flushes)]
            if profile and i >= local:
                wal += ["--profile", f"{profile}.b{i}"]
            b = BrokerProcess(self.etcd.endpoint, os.path.join(base, f"b{i}"), port,
                              extra_args=[*common, *wal, "--metrics-port", str(mport)],
                              env=moto.env)
            self.metrics[b.url] = f"http://127.0.0.1:{mport}/metrics"
            self.brokers.append(b)
        for b in self.brokers:
            b.start(timeout=60)
        self.local = self.brokers[:local]
        self.s3 = self.brokers[local:]

    def counters(self, broker) -> dict[str, float]:
        from prometheus_client.parser import text_string_to_metric_families
        with urllib.request.urlopen(self.metrics[broker.url], timeout=30) as r:
            text = r.read().decode()
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name.startswith("shadowtopic_wal_"):
                    le = s.labels.get("le")
                    out[s.name if le is None else f"{s.name}:{le}"] = s.value
        return out

    def close(self) -> None:
        for b in self.brokers:
            b.terminate()  # graceful: a --profile broker writes its stats on exit
        self.etcd.stop()


def topic(tag: str) -> str:
    return f"persistent://public/bench-wal/{tag}-{uuid.uuid4().hex[:8]}"


# ---- the floor: PUT and etcd transaction latency --------------------------------------------

def put_latency(moto, bucket: str, size: int, n: int) -> dict:
    """`n` PUTs of `size` bytes, one at a time, through the filesystem the broker opens
    (source/ledger/object_store.py: one PutObject an object)."""
    from shadowtopic.ledger.object_store import S3Options
    env = {k: os.environ.get(k) for k in moto.env}
    os.environ.update(moto.env)  # the credentials, as the broker is given them
    try:
        fs = S3Options(moto.endpoint, "us-east-1").filesystem()
    finally:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    data = os.urandom(max(1, size))
    lat = []
    for i in range(n):
        t = time.perf_counter()
        with fs.open_output_stream(f"{bucket}/probe/{i:06d}") as out:
            out.write(data)
        lat.append(time.perf_counter() - t)
    return {"p50_ms": ms(pct(lat, 0.5)), "p99_ms": ms(pct(lat, 0.99)), "bytes": size}


def txn_latency(endpoint: str, n: int) -> dict:
    from shadowtopic.metadata.base import Compare, Put
    from shadowtopic.metadata.etcd import EtcdStore

    async def run() -> list[float]:
        store = EtcdStore(endpoint)
        try:
            own = f"/bench/own/{uuid.uuid4().hex}"
            await store.put(own, b"broker-1 epoch 7")
            lat = []
            for i in range(n):
                t = time.perf_counter()
                await store.txn([Compare(own, "value", "==", b"broker-1 epoch 7")],
                                [Put(f"/bench/commit/{i:08d}", os.urandom(60))])
                lat.append(time.perf_counter() - t)
            await store.delete("/bench/", prefix=True)
            return lat
        finally:
            await store.close()
    lat = asyncio.run(run())
    return {"p50_ms": ms(pct(lat, 0.5)), "p99_ms": ms(pct(lat, 0.99))}


# ---- the parts --------------------------------------------------------------------------------

def run_latency(cl: Cluster, a) -> dict:
    local, s3 = cl.local[0], cl.s3[0]
    rounds = []
    for r in range(a.rounds):
        print(f"latency round {r + 1}/{a.rounds}", flush=True)
        row = {}
        for name, b in (("local", local), ("s3", s3))[:: 1 if r % 2 == 0 else -1]:
            before = cl.counters(b) if name == "s3" else {}
            row[name] = paced(b.url, [topic(name)], a)
            if name == "s3":
                after = cl.counters(b)
                puts = after["shadowtopic_wal_object_puts_total"] - before.get(
                    "shadowtopic_wal_object_puts_total", 0)
                nbytes = after["shadowtopic_wal_object_put_bytes_total"] - before.get(
                    "shadowtopic_wal_object_put_bytes_total", 0)
                row["object_bytes"] = int(nbytes / max(1, puts))
                row["puts"] = puts
                # what the broker's own PUTs and transactions took under this load
                row["broker_put_p99_ms"] = hist_pct(after, before,
                                                    "shadowtopic_wal_object_put_seconds", 0.99)
                row["broker_txn_p99_ms"] = hist_pct(after, before,
                                                    "shadowtopic_wal_commit_seconds", 0.99)
        row["put"] = put_latency(cl.moto, cl.bucket, row["object_bytes"], a.probes)
        row["txn"] = txn_latency(cl.etcd.endpoint, a.probes)
        row["floor_ms"] = round(row["put"]["p99_ms"] + row["txn"]["p99_ms"] + 10, 2)
        row["loaded_floor_ms"] = round(row["broker_put_p99_ms"] + row["broker_txn_p99_ms"]
                                       + 10, 2)
        print(json.dumps({k: v for k, v in row.items()}), flush=True)
        rounds.append(row)

    def med(path) -> float:
        return round(statistics.median(path(x) for x in rounds), 2)
    return {"rounds": rounds,
            "local_p50_ms": med(lambda x: x["local"]["p50_ms"]),
            "local_p99_ms": med(lambda x: x["local"]["p99_ms"]),
            "s3_p50_ms": med(lambda x: x["s3"]["p50_ms"]),
            "s3_p99_ms": med(lambda x: x["s3"]["p99_ms"]),
            "s3_p999_ms": med(lambda x: x["s3"]["p999_ms"]),
            "put_p99_ms": med(lambda x: x["put"]["p99_ms"]),
            "txn_p99_ms": med(lambda x: x["txn"]["p99_ms"]),
            "floor_ms": med(lambda x: x["floor_ms"]),
            "ratio_p99_to_floor": med(lambda x: x["s3"]["p99_ms"] / x["floor_ms"]),
            "broker_put_p99_ms": med(lambda x: x["broker_put_p99_ms"]),
            "broker_txn_p99_ms": med(lambda x: x["broker_txn_p99_ms"]),
            "loaded_floor_ms": med(lambda x: x["loaded_floor_ms"]),
            "ratio_p99_to_loaded_floor": med(lambda x: x["s3"]["p99_ms"]
                                             / x["loaded_floor_ms"])}


def _delta(after: dict, before: dict, name: str) -> float:
    return after.get(name, 0) - before.get(name, 0)


def hist_pct(after: dict, before: dict, name: str, q: float) -> float | None:
    """The q-quantile, ms, of histogram `name`'s observations between two scrapes
    (`counters`), interpolated linearly inside its bucket as Prometheus's
    histogram_quantile does."""
    bounds = sorted((float(k.split(":", 1)[1]), k) for k in after
                    if k.startswith(f"{name}_bucket:") and not k.endswith("+Inf"))
    total = _delta(after, before, f"{name}_bucket:+Inf")
    if not total:
        return None
    rank, lo, below = q * total, 0.0, 0.0
    for hi, key in bounds:
        n = _delta(after, before, key)
        if n >= rank:
            return round((lo + (hi - lo) * (rank - below) / max(1e-9, n - below)) * 1000, 2)
        lo, below = hi, n
    return round(lo * 1000, 2)  # beyond the last bound: its lower edge


def _wal_row(after: dict, before: dict, secs: float) -> dict:
    """The S3 broker's WAL counters over one case: rates and means."""
    puts = _delta(after, before, "shadowtopic_wal_object_puts_total")
    txns = _delta(after, before, "shadowtopic_wal_commit_txns_total")
    return {
        "puts_per_s": round(puts / secs, 1), "txns_per_s": round(txns / secs, 1),
        "sections_per_s": round(_delta(after, before,
                                       "shadowtopic_wal_commit_sections_total") / secs, 1),
        "put_p99_ms": hist_pct(after, before, "shadowtopic_wal_object_put_seconds", 0.99),
        "txn_p99_ms": hist_pct(after, before, "shadowtopic_wal_commit_seconds", 0.99),
        "kb_per_put": round(_delta(after, before, "shadowtopic_wal_object_put_bytes_total")
                            / puts / 1024, 1) if puts else None}


def run_rates(cl: Cluster, a) -> dict:
    """Each topic count on the S3 broker, then the same on the local-WAL broker (the order
    alternating by round): the S3 broker's PUTs and transactions a second, and both brokers'
    ack latency at the same load (what the local WAL does with it is the context)."""
    counts = [int(x) for x in a.topic_counts.split(",")]
    out: dict[int, list[dict]] = {n: [] for n in counts}
    local: dict[int, list[dict]] = {n: [] for n in counts}
    for r in range(a.rounds):
        for n in (counts if r % 2 == 0 else counts[::-1]):
            for kind in (("s3", "local") if r % 2 == 0 else ("local", "s3")):
                b = cl.s3[0] if kind == "s3" else cl.local[0]
                rows = out[n] if kind == "s3" else local[n]
                print(f"rates round {r + 1}/{a.rounds}: {n} topics, {kind} WAL", flush=True)
                before, t0 = cl.counters(b), time.monotonic()
                try:
                    res = paced(b.url, [topic(f"n{n}") for _ in range(n)], a)
                except SystemExit as exc:  # the broker fell behind: say so, go on
                    rows.append({"failed": str(exc)})
                    print(json.dumps(rows[-1]), flush=True)
                    continue
                after, t1 = cl.counters(b), time.monotonic()
                row = _wal_row(after, before, res["seconds"]) if kind == "s3" else {}
                row.update(p50_ms=res["p50_ms"], p99_ms=res["p99_ms"], sent=res["sent"],
                           n_errors=res["n_errors"], late_ticks=res["late_ticks"],
                           wall_s=round(t1 - t0, 1))
                rows.append(row)
                print(json.dumps(row), flush=True)

    def summary(rows: list[dict], keys: tuple[str, ...]) -> dict:
        ok = [x for x in rows if "failed" not in x]
        if not ok:
            return {"rounds": rows, "failed": True}
        return {"rounds": rows, "failed_rounds": len(rows) - len(ok),
                **{k: statistics.median(x[k] for x in ok) for k in keys}}
    return {str(n): {**summary(rows, ("puts_per_s", "txns_per_s", "sections_per_s",
                                      "put_p99_ms", "txn_p99_ms", "p50_ms", "p99_ms")),
                     "local": summary(local[n], ("p50_ms", "p99_ms"))}
            for n, rows in out.items()}


def run_recovery(cl: Cluster, a) -> dict:
    from shadowtopic.client import Client

    rounds = []
    pad = os.urandom(max(0, a.payload - 8))
    for r in range(a.rounds):
        lost, other = cl.s3[r % 2], cl.s3[1 - r % 2]
        t = topic("recovery")
        print(f"recovery round {r + 1}/{a.rounds}: {a.recovery_messages:,} messages, then "
              f"{lost.url} lost", flush=True)
        with Client(lost.url, timeout=120) as c:
            c.admin.create_topic(t)
        with Client(lost.url, timeout=120) as c, c.create_producer(t) as p:
            for i in range(a.recovery_messages):
                p.send_async(i.to_bytes(8, "big") + pad)
            p.flush(timeout=120)
        t_kill = time.monotonic()
        lost.kill()
        shutil.rmtree(lost.data_dir, ignore_errors=True)
        with Client(other.url, timeout=120) as c:
            with c.create_producer(t) as p:
                p.send(b"after")
            t_produce = time.monotonic() - t_kill
            with c.create_reader(t, "earliest") as rd:
                rd.seek(rd_last(c, t))
                rd.read_next(timeout=120)
            t_read = time.monotonic() - t_kill
        lost.start(timeout=60)  # a new machine in its place
        rounds.append({"produce_s": round(t_produce, 2), "read_s": round(t_read, 2)})
        print(json.dumps(rounds[-1]), flush=True)
    return {"rounds": rounds, "lease_ttl_s": a.lease_ttl,
            "produce_s": statistics.median(x["produce_s"] for x in rounds),
            "read_s": statistics.median(x["read_s"] for x in rounds)}


def rd_last(c, t: str):
    """The id of the message before the last one (the reader then reads the last)."""
    from shadowtopic.client import MessageId
    last = c.admin.last_message_id(t)
    assert last is not None, t
    return MessageId(last.ledger_id, max(0, last.entry_id - 1))


def _p99(v: dict) -> str:
    return "did not finish" if v.get("failed") else f"p99 {v['p99_ms']} ms"


def lines(res: dict) -> list[str]:
    out = ["## The write-ahead log on object storage (bench/object_wal.py)", "",
           f"{res['machine']}; moto's S3 server and one etcd on this machine; "
           f"{res['rounds']} alternating rounds; `{res['command']}`.", ""]
    lat = res.get("latency")
    if lat:
        out += [f"- ack latency at {res['rate']:,} msgs/s (every message timed): local WAL "
                f"p50 {lat['local_p50_ms']} ms, p99 {lat['local_p99_ms']} ms; S3 WAL p50 "
                f"{lat['s3_p50_ms']} ms, p99 {lat['s3_p99_ms']} ms, p99.9 {lat['s3_p999_ms']} ms",
                f"- the floor measured in the same rounds, between them (one PUT or "
                f"transaction at a time): PUT p99 {lat['put_p99_ms']} ms + "
                f"etcd txn p99 {lat['txn_p99_ms']} ms + 10 ms = {lat['floor_ms']} ms; S3 WAL "
                f"p99 / floor = {lat['ratio_p99_to_floor']:.2f} (target <= 1)",
                f"- the same floor from what the broker's own PUTs and transactions took under "
                f"the load (its histograms): PUT p99 {lat['broker_put_p99_ms']} ms + txn p99 "
                f"{lat['broker_txn_p99_ms']} ms + 10 ms = {lat['loaded_floor_ms']} ms; S3 WAL "
                f"p99 / that = {lat['ratio_p99_to_loaded_floor']:.2f}"]
    rates = res.get("rates")
    if rates:
        out.append("- PUTs and etcd transactions a second at the same 10,000 msgs/s over N "
                   "topics: " + "; ".join(
                       f"{n} topics: the producer did not finish (the broker fell behind)"
                       if v.get("failed") else
                       f"{n} topics {v['puts_per_s']:.0f} PUTs/s, {v['txns_per_s']:.0f} txns/s "
                       f"({v['sections_per_s']:.0f} sections/s; PUT p99 {v['put_p99_ms']} "
                       f"ms, txn p99 {v['txn_p99_ms']} ms; ack p99 {v['p99_ms']} ms, "
                       f"local WAL {_p99(v['local'])})"
                       for n, v in rates.items()))
    rec = res.get("recovery")
    if rec:
        out.append(f"- recovery after a source broker is lost with "
                   f"{res['recovery_messages']:,} messages in its open ledger (lease "
                   f"{rec['lease_ttl_s']} s): produce acknowledged by the other broker "
                   f"{rec['produce_s']} s after the kill, the last message read "
                   f"{rec['read_s']} s after it (medians)")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rate", type=int, default=10_000)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--tick", type=float, default=0.005)
    p.add_argument("--payload", type=int, default=100)
    p.add_argument("--probes", type=int, default=300, help="PUTs and txns timed per round")
    p.add_argument("--topic-counts", default="1,10,100")
    p.add_argument("--recovery-messages", type=int, default=100_000)
    p.add_argument("--lease-ttl", type=int, default=2)
    p.add_argument("--window-ms", type=float, default=5.0, help="the brokers' --wal-window-ms")
    p.add_argument("--flushes", type=int, default=1,
                   help="the brokers' --wal-flushes (default 1 here: moto serves one PUT at a "
                        "time on this machine; 4, the brokers' default, queues PUTs in it)")
    p.add_argument("--profile", metavar="PREFIX",
                   help="the S3-WAL brokers run under cProfile, stats to PREFIX.b<i> on exit")
    a = p.parse_args()
    parts = a.parts.split(",")
    import platform
    res: dict = {"rounds": a.rounds, "rate": a.rate, "recovery_messages": a.recovery_messages,
                 "command": "python bench/object_wal.py " + " ".join(sys.argv[1:]),
                 "machine": f"{os.cpu_count()} cores, {platform.processor() or 'x86_64'}, "
                            f"load {os.getloadavg()[0]:.1f} at start"}
    base = os.path.join(ROOT, "data", "bench")
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as d, _moto_s3()(d) as moto:
        if {"latency", "rates"} & set(parts):
            cl = Cluster(os.path.join(d, "lat"), moto, local=1, s3=1, lease_ttl=a.lease_ttl,
                         window_ms=a.window_ms, flushes=a.flushes, profile=a.profile)
            try:
                if "latency" in parts:
                    res["latency"] = run_latency(cl, a)
                if "rates" in parts:
                    res["rates"] = run_rates(cl, a)
            finally:
                cl.close()
        if "recovery" in parts:
            cl = Cluster(os.path.join(d, "rec"), moto, local=0, s3=2, lease_ttl=a.lease_ttl)
            try:
                res["recovery"] = run_recovery(cl, a)
            finally:
                cl.close()
    print(json.dumps(res))
    print("\n".join(lines(res)))


if __name__ == "__main__":
    main()
