"""Compaction at every size (issue 34): the worker's compute beside DuckDB's best plan writing
the same output from the same files, the fixed part on its own, and recompaction after +10%
beside DuckDB's full run, at 100,000, 1,000,000 and 5,000,000 messages, from one run.

    .venv/bin/python bench/compaction_sizes.py [--sizes 100000,1000000,5000000] [--rounds 3]

One etcd, a source broker and a warm compaction worker (local[*]) on one storage root
(bench/compaction_bench.py's cluster), driven through the public client.

- data, per size: `size` keyed messages over size / 20 keys (at most `--max-keys`, 100,000),
  values JSON-like records of ~100 bytes (a symbol, a price, a time, a random note), 0.5%
  deletes, produced by 4 producer processes into a topic of its own with the default ledger
  size (a ledger rolls at 200,000 entries or 64 MiB) that drops deletes at once (as the
  baselines do); then the open ledger is rolled and every ledger is sealed before the
  rounds.
- rounds (alternating): DuckDB's two-phase semi-join over the sealed files, writing the
  survivors sorted by id to one zstd Parquet file (bench/compaction_baselines.py); then ours:
  the pointer deleted (a full compaction each round), `admin.compact`, until the job record
  says DONE. Reported: the whole wait, the worker's compute (the job record's `compute_ms`:
  the Spark job, both phases, the parts written and described, the manifest) and the rest
  (the fixed part: the request filed, etcd, planning, the commit, the answer). Checks: the
  job read exactly DuckDB's ledgers and wrote as many messages as DuckDB kept.
  Targets: compute at most 1.0x DuckDB at 5,000,000, 1.5x at 1,000,000; the whole job under
  300 ms at 100,000.
- fixed part on its own: a topic of 10 keys; each round 10 more messages (left in the open
  ledger) and `admin.compact`: the seal of those 10, the etcd transactions, the job, the
  manifest's fsync and the answer, all fixed cost. Target: under 100 ms.
- recompaction, per size: 10% more messages (in the open ledger, sealed by the request),
  `admin.compact` (the previous compacted ledger plus the new), against DuckDB's full run
  over every sealed ledger. Target: faster.

Prints one JSON object, then the RESULTS lines.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import compaction_baselines as cb  # noqa: E402 - bench/compaction_baselines.py
from compaction_bench import (  # noqa: E402 - bench/compaction_bench.py
    Cluster,
    compact,
    drop_pointer,
    horizon_ledger,
    sealed_files,
)

SYMBOLS = ["AAPL", "MSFT", "GOOG", "AMZN", "NVDA", "TSLA", "META", "ORCL", "IBM", "INTC"]


def record(rnd: random.Random, i: int) -> bytes:
    """A JSON-like value of ~100 bytes, varied (a real record's compressibility)."""
    return (f'{{"sym":"{rnd.choice(SYMBOLS)}","px":{rnd.uniform(1, 2000):.2f},'
            f'"qty":{rnd.randrange(1, 10_000)},"ts":{1_790_000_000_000 + i},'
            f'"note":"{rnd.randbytes(12).hex()}"}}').encode()


def _producer(url: str, topic: str, seed: int, count: int, keys: int, q) -> None:
    from shadowtopic.client import Client
    rnd = random.Random(seed)
    with Client(url, timeout=60) as c:
        p = c.create_producer(topic, batch_max_messages=1000)
        for i in range(count):
            k = f"key-{rnd.randrange(keys):07d}"
            p.send_async(b"" if rnd.random() < 0.005 else record(rnd, i), key=k)
        p.flush()
        p.close()
    q.put(count)


def produce(url: str, topic: str, messages: int, keys: int, seed: int, procs: int = 4
            ) -> float:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    per = [messages // procs + (1 if i < messages % procs else 0) for i in range(procs)]
    t0 = time.perf_counter()
    ps = [ctx.Process(target=_producer, args=(url, topic, seed * 10 + i, n, keys, q))
          for i, n in enumerate(per) if n]
    for p in ps:
        p.start()
    got = sum(q.get(timeout=900) for _ in ps)
    for p in ps:
        p.join(30)
    if got != messages:
        raise SystemExit(f"bench: compaction sizes: produced {got} of {messages}")
    return time.perf_counter() - t0


def one_size(cl: Cluster, c, size: int, keys: int, rounds: int, scratch: str) -> dict:
    import topics  # bench/topics.py

    from shadowtopic.client import Policies

    topic = topics.name("compaction-sizes", f"n{size}")
    c.admin.create_topic(topic, policies=Policies(delete_retention_seconds=0))
    produced = produce(cl.url, topic, size, keys, seed=size % 1000 + 1)
    rolled = c.admin.roll_ledger(topic)["ledgerId"]
    files = sealed_files(c, cl.root, topic, rolled)
    print(f"  {size:,} messages over {keys:,} keys in {len(files)} ledgers "
          f"({produced:.1f} s to produce)", flush=True)
    out: dict = {"size": size, "keys": keys, "ledgers": len(files),
                 "produce_s": round(produced, 1), "rounds": []}
    status = None
    for rnd in range(rounds):
        duck, rows = cb.run("duckdb-semijoin", files, scratch)
        drop_pointer(cl.etcd.endpoint, topic)
        ours, status, split = compact(c, topic)
        if horizon_ledger(status) != rolled or status.entries_written != rows:
            raise SystemExit(f"bench: compaction sizes: the job read ledgers up to "
                             f"{horizon_ledger(status)} and wrote {status.entries_written}; "
                             f"DuckDB read ledgers up to {rolled} and kept {rows}")
        compute = status.compute_ms / 1000
        out["rounds"].append({"duckdb_s": round(duck, 3), "ours_s": round(ours, 3),
                              "compute_s": round(compute, 3),
                              "fixed_s": round(ours - compute, 3), "split": split,
                              "compute_ratio": round(compute / duck, 2)})
        print(f"  round {rnd + 1}: duckdb {duck:.3f} s, ours {ours:.3f} s (compute "
              f"{compute:.3f} s)", flush=True)
    assert status is not None
    out["survivors"] = status.entries_written
    out["peak_worker_rss_mib"] = round(status.peak_rss_bytes / 2**20)
    # recompaction after +10%: in the open ledger, sealed by the request
    produce(cl.url, topic, max(1, size // 10), keys, seed=size % 1000 + 2)
    inc, inc_status, inc_split = compact(c, topic)
    duck_all, rows_all = cb.run("duckdb-semijoin", sealed_files(
        c, cl.root, topic, horizon_ledger(inc_status)), scratch)
    if inc_status.entries_written != rows_all or not inc_status.previous_job_id:
        raise SystemExit(f"bench: compaction sizes: the recompaction wrote "
                         f"{inc_status.entries_written} (previous job "
                         f"{inc_status.previous_job_id!r}); DuckDB's full run kept {rows_all}")
    out["recompaction"] = {"ours_s": round(inc, 3), "duckdb_full_s": round(duck_all, 3),
                           "compute_s": round(inc_status.compute_ms / 1000, 3),
                           "split": inc_split}
    print(f"  +10%: ours {inc:.3f} s (seal + file {inc_split['seal_and_file_s']} s), DuckDB's "
          f"full run {duck_all:.3f} s", flush=True)
    c.admin.delete_topic(topic, force=True)
    return out


def fixed_part(cl: Cluster, c, rounds: int) -> list[dict]:
    import topics

    from shadowtopic.client import Policies
    topic = topics.name("compaction-sizes", "fixed")
    c.admin.create_topic(topic, policies=Policies(delete_retention_seconds=0))
    out = []
    with c.create_producer(topic) as p:
        for rnd in range(rounds + 1):  # the first is the topic's first job: not counted
            for i in range(10):
                p.send(f"v{rnd}-{i}".encode(), key=f"k{i}")
            total, status, split = compact(c, topic)
            if rnd:
                out.append({"total_s": round(total, 3),
                            "compute_s": round(status.compute_ms / 1000, 3), "split": split})
    c.admin.delete_topic(topic, force=True)
    return out


def median(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


def summary(r: dict) -> dict:
    out = {}
    for s in r["sizes"]:
        rows = s["rounds"]
        out[str(s["size"])] = {
            "duckdb_s": median([x["duckdb_s"] for x in rows]),
            "ours_s": median([x["ours_s"] for x in rows]),
            "compute_s": median([x["compute_s"] for x in rows]),
            "fixed_s": median([x["fixed_s"] for x in rows]),
            "compute_ratio": median([x["compute_ratio"] for x in rows])}
    f = r["fixed"]
    out["fixed"] = {"total_s": median([x["total_s"] for x in f]),
                    "compute_s": median([x["compute_s"] for x in f])}
    return out


def lines(r: dict) -> list[str]:
    sm = r["summary"]
    target = {5_000_000: 1.0, 1_000_000: 1.5}
    rows = ["| messages (keys) | DuckDB s | ours: whole job s | of it compute s | fixed s | "
            "compute / DuckDB (median of rounds) | target |", "|---|---:|---:|---:|---:|---:|---|"]
    for s in r["sizes"]:
        m = sm[str(s["size"])]
        t = target.get(s["size"])
        goal = (f"<= {t}x: {'met' if m['compute_ratio'] <= t else '**missed**'}" if t else
                f"whole job < 0.3 s: {'met' if m['ours_s'] < 0.3 else '**missed**'}"
                if s["size"] <= 100_000 else "")
        rows.append(f"| {s['size']:,} ({s['keys']:,}) | {m['duckdb_s']} | {m['ours_s']} | "
                    f"{m['compute_s']} | {m['fixed_s']} | {m['compute_ratio']}x | {goal} |")
    rec = ["| messages | ours s | of it seal + file s | of it compute s | DuckDB full s | "
           "faster |", "|---|---:|---:|---:|---:|---|"]
    for s in r["sizes"]:
        x = s["recompaction"]
        rec.append(f"| {s['size']:,} + 10% | {x['ours_s']} | {x['split']['seal_and_file_s']} | "
                   f"{x['compute_s']} | {x['duckdb_full_s']} | "
                   f"{'yes' if x['ours_s'] < x['duckdb_full_s'] else '**no**'} |")
    f = sm["fixed"]
    fx = r["fixed"]
    return [
        f"## Compaction at every size (issue 34, bench/compaction_sizes.py, {r['when']})", "",
        f"`.venv/bin/python bench/compaction_sizes.py --sizes {r['args']['sizes']} --rounds "
        f"{r['args']['rounds']}` on {r['machine']}; alternating rounds (DuckDB, ours), medians.",
        "", *rows, "",
        f"Fixed part on its own (10 messages sealed by the request, then the job): median "
        f"{f['total_s']} s, of it compute {f['compute_s']} s (target < 0.1 s: "
        f"{'met' if f['total_s'] < 0.1 else '**missed**'}); rounds: "
        + ", ".join(f"{x['total_s']} ({x['split']['seal_and_file_s']} / "
                    f"{x['split']['worker_s']} / {x['split']['notify_s']})" for x in fx)
        + " (seal + file / worker / notify).", "",
        "Recompaction after +10%:", "", *rec, ""]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100000,1000000,5000000")
    p.add_argument("--max-keys", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--data-dir", default=None)
    a = p.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    data_dir = a.data_dir or tempfile.mkdtemp(prefix="bench-compaction-sizes-")
    cl = Cluster(data_dir)
    r: dict = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
               "args": {"sizes": a.sizes, "rounds": a.rounds}, "sizes": []}
    try:
        from shadowtopic.client import Client
        with Client(cl.url, timeout=120) as c:
            warm = "persistent://public/default/compaction-sizes-warmup"
            c.admin.create_topic(warm)
            produce(cl.url, warm, 1000, 100, seed=7, procs=1)
            compact(c, warm)  # the session is warm from here
            r["fixed"] = fixed_part(cl, c, a.rounds)
            scratch = tempfile.mkdtemp(prefix="duck-", dir=data_dir)
            for size in sizes:
                keys = max(1, min(a.max_keys, size // 20))
                r["sizes"].append(one_size(cl, c, size, keys, a.rounds, scratch))
            shutil.rmtree(scratch, ignore_errors=True)
    finally:
        cl.close()
        if a.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    r["summary"] = summary(r)
    print(json.dumps(r))
    print("\n".join(lines(r)))


if __name__ == "__main__":
    main()
