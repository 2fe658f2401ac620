"""Ack latency under load (issue 34): several producer processes on one topic, every
message timed, beside fdatasync's own latency on the broker's disk, from one run with
alternating rounds.

    .venv/bin/python bench/ack_latency.py [--rounds 3] [--rates 10000,100000] [--producers 4]

One etcd and one source broker (the local WAL: fsync). For each offered rate (msgs/s, the
order alternating by round) `--producers` processes each send rate / producers msgs/s for
`--seconds` (10) to a fresh topic: every `--tick` (5 ms) their share of the tick's messages,
sent with `send_async` through a producer with `linger_ms` 1 (bench/object_wal.py's paced
producer), each message timed from the `send_async` call to its receipt callback, the
first second left out (so the linger is in the latency). In the same round this process
times `--probes` (500) appends of one tick's bytes followed by `os.fdatasync` to a file on
the broker's data disk: the floor a group commit cannot beat. Targets: p99 under 5 ms at
10,000 msgs/s and under 20 ms at 100,000.

A bench, not a test: every wait is bounded; `late_ticks` counts the ticks a producer
process started more than 5 ms late (then it could not offer the rate: the figures are
for less). Prints one JSON object, then the RESULTS lines.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

from object_wal import _paced, ms  # noqa: E402 - bench/object_wal.py's paced producer
from shadows import pct  # noqa: E402 - bench/shadows.py


def _get_any(q, procs, timeout: float) -> dict:
    """The next result on `q`; SystemExit once a producer process failed or time ran out."""
    import queue
    deadline = time.time() + timeout
    while True:
        try:
            return q.get(timeout=1.0)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs) or time.time() > deadline:
                raise SystemExit("bench: ack_latency: a producer process failed (see its "
                                 "traceback above)") from None


def fdatasync_latency(directory: str, size: int, n: int) -> dict:
    """`n` appends of `size` bytes, each followed by fdatasync, to a new file in
    `directory`: their p50 / p99 (what one WAL group commit costs at least)."""
    path = os.path.join(directory, f"fsync-probe-{uuid.uuid4().hex[:8]}")
    data = os.urandom(max(1, size))
    lat = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for _ in range(n):
            t = time.perf_counter()
            os.write(fd, data)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(path)
    return {"p50_ms": ms(pct(lat, 0.5)), "p99_ms": ms(pct(lat, 0.99)), "bytes": size}


def offered(url: str, rate: int, a) -> dict:
    """`a.producers` processes offering `rate` msgs/s together to one new topic."""
    from shadowtopic.client import Client
    topic = f"persistent://public/bench-ack/r{rate}-{uuid.uuid4().hex[:8]}"
    with Client(url, timeout=60) as c:
        c.admin.create_topic(topic)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    share = max(1, rate // a.producers)
    procs = [ctx.Process(target=_paced, args=(url, [topic], share, a.seconds, a.tick,
                                              a.payload, 1.0, q), daemon=True)
             for _ in range(a.producers)]
    for p in procs:
        p.start()
    try:
        res = [_get_any(q, procs, a.seconds + 180) for _ in procs]
        for p in procs:
            p.join(30)
    finally:
        with Client(url, timeout=60) as c:
            c.admin.delete_topic(topic, force=True)
    lat = [x for r in res for x in r["lat"]]
    seconds = max(r["seconds"] for r in res)
    return {"offered": share * a.producers, "sent": sum(r["sent"] for r in res),
            "achieved_per_s": round(sum(r["sent"] for r in res) / seconds),
            "late_ticks": sum(r["late_ticks"] for r in res),
            "n_errors": sum(r["n_errors"] for r in res),
            "errors": [e for r in res for e in r["errors"]][:3], "timed": len(lat),
            "p50_ms": ms(pct(lat, 0.5)), "p99_ms": ms(pct(lat, 0.99)),
            "p999_ms": ms(pct(lat, 0.999))}


def run(a) -> dict:
    from shadowtopic.broker.server import free_port
    from shadowtopic.metadata.etcd_server import EtcdServer
    from shadowtopic.standalone import BrokerProcess

    rates = [int(x) for x in a.rates.split(",")]
    out: dict = {"rounds": a.rounds, "producers": a.producers, "seconds": a.seconds,
                 "command": "python bench/ack_latency.py " + " ".join(sys.argv[1:]),
                 "machine": f"{os.cpu_count()} cores, {platform.processor() or 'x86_64'}, "
                            f"load {os.getloadavg()[0]:.1f} at start",
                 "by_rate": {str(r): [] for r in rates}}
    base = a.data_dir or os.path.join(ROOT, "data", "bench")
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as d:
        etcd = EtcdServer(os.path.join(d, "etcd"))
        etcd.start()
        broker = BrokerProcess(etcd.endpoint, os.path.join(d, "broker"), free_port(),
                               extra_args=["--cluster", f"bench-{uuid.uuid4().hex[:8]}",
                                           *(["--profile", a.profile] if a.profile else [])])
        try:
            broker.start(timeout=60)
            for r in range(a.rounds):
                for rate in (rates if r % 2 == 0 else rates[::-1]):
                    print(f"round {r + 1}/{a.rounds}: {rate:,} msgs/s offered by "
                          f"{a.producers} processes", flush=True)
                    row = offered(broker.url, rate, a)
                    tick_bytes = max(1, int(rate * a.tick * a.payload))
                    row["fdatasync"] = fdatasync_latency(broker.data_dir, tick_bytes,
                                                         a.probes)
                    print(json.dumps(row), flush=True)
                    out["by_rate"][str(rate)].append(row)
        finally:
            broker.terminate()  # graceful: with --profile the broker writes its stats
            etcd.stop()

    def med(rows: list[dict], path) -> float | None:
        vals = [v for v in (path(x) for x in rows) if v is not None]
        return round(statistics.median(vals), 2) if vals else None
    out["summary"] = {rate: {
        "p50_ms": med(rows, lambda x: x["p50_ms"]), "p99_ms": med(rows, lambda x: x["p99_ms"]),
        "p999_ms": med(rows, lambda x: x["p999_ms"]),
        "fdatasync_p99_ms": med(rows, lambda x: x["fdatasync"]["p99_ms"]),
        "achieved_per_s": med(rows, lambda x: x["achieved_per_s"]),
        "late_ticks": med(rows, lambda x: x["late_ticks"])}
        for rate, rows in out["by_rate"].items()}
    return out


def lines(res: dict) -> list[str]:
    out = ["## Ack latency under load (bench/ack_latency.py)", "",
           f"{res['machine']}; one etcd and one source broker (local WAL) on this machine; "
           f"{res['producers']} producer processes, {res['rounds']} alternating rounds; "
           f"`{res['command']}`.", ""]
    for rate, v in res["summary"].items():
        out.append(f"- {int(rate):,} msgs/s offered ({v['achieved_per_s']:,.0f} sent a "
                   f"second): p50 {v['p50_ms']} ms, p99 {v['p99_ms']} ms, p99.9 "
                   f"{v['p999_ms']} ms; fdatasync p99 {v['fdatasync_p99_ms']} ms; "
                   f"late ticks {v['late_ticks']:.0f} (medians)")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rates", default="10000,100000", help="offered msgs/s, comma-separated")
    p.add_argument("--producers", type=int, default=4, help="producer processes")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--tick", type=float, default=0.005)
    p.add_argument("--payload", type=int, default=100)
    p.add_argument("--probes", type=int, default=500, help="fdatasyncs timed per round")
    p.add_argument("--data-dir", default=None, help="where the cluster's dirs go "
                   "(default: data/bench in the checkout)")
    p.add_argument("--profile", metavar="PATH",
                   help="the broker runs under cProfile, its stats to PATH on exit")
    a = p.parse_args()
    res = run(a)
    print(json.dumps(res))
    print("\n".join(lines(res)))


if __name__ == "__main__":
    main()
