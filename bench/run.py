#!/usr/bin/env python3
"""`make bench`: acked produce throughput and ack latency through the public client, the same
with idempotent producing off beside on (bench/produce_dedup.py), reader
fan-out (bench/fanout.py), consume-and-ack of durable subscriptions (bench/consume.py), the
cursor flush rate with 10,000 subscriptions acking (bench/cursor_flush.py), fan-out to 100
durable subscriptions and broadcast to 100,000 (bench/broadcast.py; with it, the broker's
/metrics scrape time and size with 100,000 subscriptions: bench/metrics_scrape.py), shadow topics
(bench/shadows.py: create on a 1M-message source, produce -> shadow reader latency, catch-up
beside a NATS mirror, source CPU per message with 0-8 shadows) and fan-out / broadcast over
shadows (bench/shadows_scale.py), and compaction (bench/compaction_bench.py: full and
incremental compaction with the warm worker beside DuckDB and Polars over the same Parquet
files, compacted load vs the whole backlog, 100 read_compacted subscriptions over the source
and 4 shadows), each measured in one run next to the machine's ceilings
(the peers' limits.py) and NATS JetStream (the peers' nats_jetstream.py; both in SHARED/peers,
see `make bench`). Writes bench/RESULTS.md and bench/out/<stamp>.json.

    .venv/bin/python bench/run.py --shared ../shared [--messages 400000] [--rounds 3]
                    [--only produce,dedup,fanout,consume,flush,fanout100,broadcast,
                           table-view,shadows,shadows-scale,compaction] [--smoke] [--out F]
                    [--out-dir D]

Each part runs in a data dir of its own (its own etcd and brokers) on topics of its own
(bench/topics.py: namespace `bench/<part>-<run>`). After each part, bench/out/<stamp>.json
(`--out-dir`) and RESULTS.md (`--out`) are rewritten with everything measured so far. A part
that fails (one of its checks, a process that died) is printed with its traceback, its error
goes into the json's `errors` and at the top of its RESULTS.md section, and the next part
runs; the run exits non-zero at the end if any part failed. `--smoke` runs every part at a
tiny size (SMOKE below; tests/test_bench/test_bench_smoke.py runs it part by part).

`--shadows-*`, `--shadows-scale-*` and `--compaction-*` pass bench/shadows.py's,
bench/shadows_scale.py's and bench/compaction_bench.py's options (e.g. `--shadows-parts
latency,cpu`, `--shadows-scale-broadcast-subs 10000`, `--compaction-messages 1000000`).

`--only` runs a subset; RESULTS.md then keeps the other parts' sections from the newest
bench/out/*.json that has them, marked as carried over from that earlier run.

Produce: a real etcd and a real broker process; `--producers` client processes each send
messages/producers messages (`--payload` bytes, keys k0..k999) with `send_async`. Every
`--sample`-th message carries a callback that records its latency (receipt time minus
send_async time; the broker acks after fsync); the rest are checked in bulk through
`Producer.stats()` (every message must be acked). Each round's throughput is acked messages /
(last ack - first send) over all processes; the report gives the median round and all rounds.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
if BENCH not in sys.path:  # the sibling bench modules imported below
    sys.path.insert(0, BENCH)


def _producer(url: str, topic: str, count: int, payload: int, start_at: float, sample: int,
              out, face: str = "sync") -> None:
    if face == "async":
        import asyncio
        out.put(asyncio.run(_async_producer(url, topic, count, payload, start_at, sample)))
        return
    from shadowtopic.client import Client

    sends: list[float] = []
    acks: list[float] = []
    now = time.perf_counter

    def done(mid, exc):
        acks.append(now())

    data = b"x" * payload
    keys = [f"k{i}" for i in range(1000)]
    with Client(url, timeout=60) as client:
        producer = client.create_producer(topic, producer_name=f"bench-{os.getpid()}")
        while time.time() < start_at:
            time.sleep(0.001)
        t0 = now()
        c0 = time.process_time()
        for i in range(count):
            if i % sample:
                producer.send_async(data, key=keys[i % 1000])
            else:
                sends.append(now())
                producer.send_async(data, key=keys[i % 1000], callback=done)
        producer.flush(timeout=120)
        t1 = now()
        cpu = time.process_time() - c0
        stats = producer.stats()
        producer.close()
    lat = [a - s for s, a in zip(sends, acks)]
    out.put({"acked": stats["acked"], "errors": stats["failed"], "cpu_s": cpu,
             "t0": t0 + _offset(), "t1": t1 + _offset(), "lat_sample": lat})


async def _async_producer(url: str, topic: str, count: int, payload: int, start_at: float,
                          sample: int) -> dict:
    """`_producer` through `AsyncClient`: `await producer.send_async(...)` per message (it
    returns once queued), latency from every `sample`th message's Future."""
    import asyncio

    from shadowtopic.client import AsyncClient

    sends: list[float] = []
    acks: list[float] = []
    now = time.perf_counter

    def done(_future) -> None:
        acks.append(now())

    data = b"x" * payload
    keys = [f"k{i}" for i in range(1000)]
    async with AsyncClient(url, timeout=60) as client:
        producer = await client.create_producer(topic, producer_name=f"bench-{os.getpid()}")
        while time.time() < start_at:
            await asyncio.sleep(0.001)
        t0 = now()
        c0 = time.process_time()
        send = producer.send_async
        for i in range(count):
            if i % sample:
                await send(data, key=keys[i % 1000])
            else:
                sends.append(now())
                (await send(data, key=keys[i % 1000])).add_done_callback(done)
        await producer.flush(timeout=120)
        t1 = now()
        cpu = time.process_time() - c0
        stats = producer.stats()
        await producer.close()
    lat = [a - s for s, a in zip(sends, acks)]
    return {"acked": stats["acked"], "errors": stats["failed"], "cpu_s": cpu,
            "t0": t0 + _offset(), "t1": t1 + _offset(), "lat_sample": lat}


def _offset() -> float:
    """perf_counter -> wall clock, so rounds from several processes line up."""
    return time.time() - time.perf_counter()


def produce_round(url: str, topic: str, messages: int, producers: int, payload: int,
                  sample: int = 10, face: str = "sync") -> dict:
    """One round through `Client` (face "sync") or `AsyncClient` ("async")."""
    ctx = mp.get_context("spawn")  # gRPC channels do not survive fork
    q = ctx.Queue()
    start_at = time.time() + 3.0
    per = messages // producers
    procs = [ctx.Process(target=_producer,
                         args=(url, topic, per, payload, start_at, sample, q, face))
             for _ in range(producers)]
    for p in procs:
        p.start()
    results = []
    for _ in procs:
        try:
            results.append(q.get(timeout=300))
        except Exception:
            raise SystemExit(
                "bench: a producer process failed (see its traceback above)") from None
    for p in procs:
        p.join(30)
    acked = sum(r["acked"] for r in results)
    if acked != per * producers:
        raise SystemExit(f"bench: only {acked} of {per * producers} messages were acked")
    dt = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    lat = sorted(x for r in results for x in r["lat_sample"])
    return {"acked": acked, "errors": sum(r["errors"] for r in results),
            "msgs_per_s": round(acked / dt), "seconds": round(dt, 3),
            "client_cpu_us_per_msg": round(sum(r["cpu_s"] for r in results) / acked * 1e6, 2),
            "p50_ms": round(lat[len(lat) // 2] * 1000, 2),
            "p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 2)}


def run_produce(args, data_dir: str, peers: str | None) -> list[dict]:
    """Rounds of (limits.py produce ceiling, ours, NATS JetStream), alternating, each round
    with its paired ratios."""
    import topics  # bench/topics.py

    from shadowtopic.broker.server import free_port
    from shadowtopic.client import Client
    from shadowtopic.metadata.etcd_server import EtcdServer
    from shadowtopic.standalone import BrokerProcess

    with EtcdServer(os.path.join(data_dir, "etcd")) as etcd:
        etcd.start()
        broker = BrokerProcess(etcd.endpoint, os.path.join(data_dir, "broker"), free_port())
        broker.start(timeout=60)
        try:
            rounds = []
            with Client(broker.url) as c:
                for r in range(args.rounds):
                    ceiling = nats = None
                    if peers:
                        lim = run_peer([sys.executable, os.path.join(peers, "limits.py"),
                                        "--only", "produce", "--dir", data_dir],
                                       "limits.py --only produce")
                        ceiling = (lim or {}).get("produce_hot_path_msgs_per_s")
                    topic = topics.name("produce", f"t{r}")
                    c.admin.create_topic(topic)
                    ours = produce_round(broker.url, topic, args.messages, args.producers,
                                         args.payload, args.sample)
                    c.admin.create_topic(f"{topic}-aio")
                    aio = produce_round(broker.url, f"{topic}-aio", args.messages,
                                        args.producers, args.payload, args.sample, "async")
                    if peers:
                        js = run_peer([sys.executable, os.path.join(peers,
                                                                    "nats_jetstream.py")],
                                      "nats_jetstream.py")
                        nats = (js or {}).get("produce_acked_msgs_per_s")
                    ours.update(ceiling=ceiling, nats=nats,
                                ratio=ours["msgs_per_s"] / ceiling if ceiling else None,
                                nats_ratio=ours["msgs_per_s"] / nats if nats else None,
                                aio=aio, aio_ratio=aio["msgs_per_s"] / ceiling if ceiling
                                else None)
                    rounds.append(ours)
                    print(f"  round {r + 1}: {rounds[-1]}", flush=True)
            return rounds
        finally:
            broker.terminate()


def run_peer(cmd: list[str], label: str) -> dict | None:
    print(f"running {label}: {' '.join(cmd)}", flush=True)
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        print(f"  {label} timed out", flush=True)
        return None
    if res.returncode != 0:
        print(f"  {label} failed: {res.stderr.strip()[-400:]}", flush=True)
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])


def machine() -> str:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, {platform.platform()}, "
            f"Python {platform.python_version()}")


def fanout_lines(fan: dict) -> list[str]:
    lines = ["## Reader fan-out (bench/fanout.py)", "",
             f"{fan['readers']} non-durable readers of one topic in one client process (one "
             "Connect stream), attached before the messages are produced; every message "
             f"decoded by the client ({fan['messages']:,} messages of {fan['payload']} bytes a "
             "round). Alternating rounds with limits.py `--only fanout --subs "
             f"{fan['readers']}` (`grpc_decoded_fanout_msgs_per_s`: as many streams of "
             "pre-encoded 500-message frames, each parsed by protobuf in one process).", "",
             "| round | ceiling msgs/s | shadowtopic msgs/s | ratio |", "|---|---:|---:|---:|"]
    for i, r in enumerate(fan["rounds"], 1):
        ratio = f"{r['ratio']:.1%}" if r["ratio"] is not None else "-"
        ceiling = f"{r['ceiling']:,}" if r["ceiling"] else "-"
        lines.append(f"| {i} | {ceiling} | {r['msgs_per_s']:,} | {ratio} |")
    if fan["median_ratio"] is not None:
        lines.append("")
        lines.append(f"- median of the paired ratios: **{fan['median_ratio']:.1%}** of the "
                     f"decoded fan-out ceiling ({fan['median_msgs_per_s']:,.0f} msgs/s "
                     "delivered, median round)")
    return lines + [""]


def table_view_lines(tv: dict) -> list[str]:
    lines = ["## Table view (bench/table_view.py)", "",
             f"`client.table_view(topic)` loading {tv['keys']:,} keys (one JSON-like record "
             "each, sealed) beside a `read_compacted` reader loading them by hand, in "
             "alternating rounds against one etcd and broker process.", "",
             "| round | reader s | view s | view / reader | reader / view client CPU s |",
             "|---|---:|---:|---:|---:|"]
    for i, r in enumerate(tv["rounds"], 1):
        lines.append(f"| {i} | {r['reader']['seconds']} | {r['view']['seconds']} | "
                     f"{r['ratio']} | {r['reader']['client_cpu_s']} / "
                     f"{r['view']['client_cpu_s']} |")
    lines += ["", f"- median of the paired ratios view / reader: **{tv['ratio_median']}** "
              f"(target: within 2x); client CPU per key: reader "
              f"{tv['reader_client_cpu_us_per_key']} us, view "
              f"{tv['view_client_cpu_us_per_key']} us"]
    return lines + [""]


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def produce_lines(args, rounds: list[dict]) -> list[str]:
    med = sorted(rounds, key=lambda r: r["msgs_per_s"])[len(rounds) // 2]
    lines = [
        "## Produce (acked after fsync, through the public client)", "",
        f"{args.producers} producer processes, {args.payload}-byte payloads with keys, "
        f"{args.messages:,} messages a round, real etcd + broker process; every message "
        f"acked (checked with `Producer.stats()`), latency from every {args.sample}th "
        "message's callback. Each round runs limits.py `--only produce` (the bare "
        "parse-frame-fsync-ack ceiling), then ours through `Client`, then through "
        "`AsyncClient`, then nats_jetstream.py: paired ratios.", "",
        "| round | ceiling msgs/s | Client msgs/s | p50 ack ms | p99 ack ms | "
        "of ceiling | AsyncClient msgs/s | of ceiling | NATS msgs/s | x NATS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(rounds, 1):
        ceiling = f"{r['ceiling']:,}" if r.get("ceiling") else "-"
        ratio = f"{r['ratio']:.1%}" if r.get("ratio") else "-"
        nats = f"{r['nats']:,}" if r.get("nats") else "-"
        nratio = f"{r['nats_ratio']:.1f}x" if r.get("nats_ratio") else "-"
        aio = f"{r['aio']['msgs_per_s']:,}" if r.get("aio") else "-"
        aratio = f"{r['aio_ratio']:.1%}" if r.get("aio_ratio") else "-"
        lines.append(f"| {i} | {ceiling} | {r['msgs_per_s']:,} | {r['p50_ms']} | "
                     f"{r['p99_ms']} | {ratio} | {aio} | {aratio} | {nats} | {nratio} |")
    lines.append("")
    aratio = _median([r.get("aio_ratio") for r in rounds])
    ratio = _median([r.get("ratio") for r in rounds])
    nratio = _median([r.get("nats_ratio") for r in rounds])
    lines.append(f"- median round: {med['msgs_per_s']:,} msgs/s, p50 {med['p50_ms']} ms, "
                 f"p99 {med['p99_ms']} ms")
    if ratio is not None:
        lines.append(f"- median of the paired ratios to the hot-path ceiling: **{ratio:.1%}** "
                     "(target 90%)")
    if aratio is not None:
        cpu = _median([r["aio"]["client_cpu_us_per_msg"] for r in rounds if r.get("aio")])
        sync_cpu = _median([r["client_cpu_us_per_msg"] for r in rounds])
        lines.append(f"- through `AsyncClient` (`await producer.send_async(...)` per message, "
                     f"the same runs): **{aratio:.1%}** of the ceiling (target 90%); client "
                     f"CPU {cpu} us per message, `Client` {sync_cpu} us")
    if nratio is not None:
        lines.append(f"- median of the paired ratios to NATS JetStream: **{nratio:.1f}x**")
    return lines + [""]


PARTS = ("produce", "dedup", "fanout", "consume", "flush", "fanout100", "broadcast",
         "table-view", "shadows", "shadows-scale", "compaction")
#: the key of each part's results in bench/out/*.json (produce: "rounds")
KEYS = {"produce": "rounds", "shadows-scale": "shadows_scale", "table-view": "table_view"}


STAMPED = re.compile(r"\d{8}-\d{6}\.json")


def carried_over(parts: set[str], out_dir: str) -> dict:
    """For each part not run now: its results from the newest bench/out/*.json holding them
    ({part: (file name, results)}; produce carries its limits and nats along)."""
    found: dict = {}
    try:  # (this script's own files, <stamp>.json: other benches write theirs there too)
        names = sorted((n for n in os.listdir(out_dir) if STAMPED.fullmatch(n)), reverse=True)
    except OSError:
        return found
    for name in names:
        try:
            with open(os.path.join(out_dir, name)) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            continue
        for part in PARTS:
            key = KEYS.get(part, part)
            if part not in parts and part not in found and doc.get(key):
                found[part] = (name, doc)
    return found


# the headings of RESULTS.md's own sections (NOTES.md, appended below them, has others)
HEADINGS = {"produce": "## Produce (",
            "dedup": "## Idempotent producing: deduplication on vs off (bench/",
            "fanout": "## Reader fan-out (bench/",
            "consume": "## Consume and acknowledge (bench/", "flush": "## Cursor flush with",
            "fanout100": "## Fan-out to ", "broadcast": "## Broadcast: ",
            "table-view": "## Table view (bench/",
            "shadows": "## Shadow topics (bench/",
            "shadows-scale": "## Fan-out and broadcast over shadow topics (bench/",
            "compaction": "## Compaction (bench/",
            "limits": "## Machine ceilings (", "nats": "## NATS JetStream ("}


def previous_sections(path: str, only: str) -> dict[str, list[str]]:
    """The sections of the RESULTS.md at `path`, by part, for parts that no bench/out/*.json
    holds (a fresh clone has none): carried over as text, marked as such."""
    try:
        with open(path) as f:
            text = f.read().splitlines()
    except OSError:
        return {}
    when = next((l.split(" on ", 1)[0][len("Measured "):] for l in text
                 if l.startswith("Measured ")), "an earlier run")
    found: dict[str, list[str]] = {}
    part = None
    for line in text:
        if line.startswith("## "):
            part = next((k for k, h in HEADINGS.items() if line.startswith(h)
                         and (k in ("produce", "limits", "nats") or "(bench/" in line)), None)
            if part in found:
                part = None
            if part is not None:
                found[part] = [line]
            continue
        if part is not None:
            found[part].append(line)
    mark = (f"*Carried over from the previous bench/RESULTS.md (measured {when}); this run "
            f"measured only `{only}`.*")
    for part, body in found.items():
        while body and not body[-1].strip():
            body.pop()
        old = next((i for i, l in enumerate(body) if l.startswith("*Carried over from")), None)
        if old is not None:  # keep where it came from, say what this run measured
            body[old] = body[old].split("; this run measured only")[0] + \
                f"; this run measured only `{only}`.*"
        elif part not in ("limits", "nats"):
            body[1:1] = ["", mark]
        body.append("")
    return found


#: each part's RESULTS.md heading when it failed and no earlier figures are at hand
TITLES = {"produce": "## Produce (acked after fsync, through the public client)",
          "dedup": "## Idempotent producing: deduplication on vs off (bench/produce_dedup.py)",
          "fanout": "## Reader fan-out (bench/fanout.py)",
          "consume": "## Consume and acknowledge (bench/consume.py)",
          "flush": "## Cursor flush with subscriptions acking (bench/cursor_flush.py)",
          "fanout100": "## Fan-out to durable subscriptions (bench/consume.py, exclusive case)",
          "broadcast": "## Broadcast: durable subscriptions on one topic (bench/broadcast.py)",
          "table-view": "## Table view (bench/table_view.py)",
          "shadows": "## Shadow topics (bench/shadows.py)",
          "shadows-scale": "## Fan-out and broadcast over shadow topics (bench/shadows_scale.py)",
          "compaction": "## Compaction (bench/compaction_bench.py)"}


def write_results(path: str, args, results: dict, errors: dict, old: dict | None = None,
                  load: tuple | None = None, text: dict | None = None) -> None:
    """RESULTS.md from this run's `results` ({part: figures}; produce's are {rounds, limits,
    nats}) and `errors` ({part: message}). A part not run keeps its section from the newest
    bench/out/*.json holding it (`old`: carried_over's) or else from the RESULTS.md at `path`,
    marked as carried over; a part that failed says so, with its error, above those earlier
    figures (or under its bare heading when there are none). `text`: previous_sections of
    that RESULTS.md as it was before this run's first write (read here when not given)."""
    from broadcast import broadcast_lines, fanout100_lines  # bench/broadcast.py
    from compaction_bench import (
        report_lines as compaction_lines,  # bench/compaction_bench.py
    )
    from consume import consume_lines  # bench/consume.py, beside this script
    from cursor_flush import flush_lines  # bench/cursor_flush.py
    from metrics_scrape import scrape_lines  # bench/metrics_scrape.py
    from produce_dedup import dedup_lines  # bench/produce_dedup.py
    from shadows_report import scale_lines, shadows_lines  # bench/shadows_report.py

    def broadcast_all(res: dict) -> list[str]:
        more = scrape_lines(res["metrics_scrape"]) if res.get("metrics_scrape") else []
        return broadcast_lines(res) + more

    old = old or {}
    text = previous_sections(path, args.only) if text is None else text
    measured = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    lines = [
        "# Benchmark results", "",
        f"Measured {measured} on {machine()}.",
        "A shared, noisy machine: each figure is set beside its ceiling or peer measured in",
        "alternating rounds of the same run (A B A B ...), and the medians of the paired",
        "ratios are quoted. Reproduce with `make bench` (= `.venv/bin/python bench/run.py",
        f"--shared ../shared`); this run: `--messages {args.messages} --producers "
        f"{args.producers} --payload {args.payload} --rounds {args.rounds} "
        f"--consume-messages {args.consume_messages} --flush-subs {args.flush_subs} "
        f"--fanout100-messages {args.fanout100_messages} --fanout100-procs "
        f"{args.fanout100_procs} --broadcast-subs {args.broadcast_subs} --broadcast-procs "
        f"{args.broadcast_procs} --broadcast-duration {args.broadcast_duration:g} "
        f"--only {args.only}`" + (" with bench/shadows.py's defaults" + "".join(
            f" `--{k.replace('_', '-')} {v}`" for k, v in sorted(vars(args).items())
            if k.startswith("shadows_") and v != DEFAULTS.get(k))
            if {"shadows", "shadows-scale"} & set(args.only.split(",")) else "") + ".",
        "A part that fails shows its error at the top of its section (the next parts still "
        "run, and `make bench` exits non-zero)."
        + (f" **Failed in this run: {', '.join(sorted(errors))}.**" if errors else ""),
        ""]
    if load:
        lines[-1:-1] = ["Load average (1 / 5 / 15 min, 2 cores) when this run started: " +
                        " / ".join(f"{x:.2f}" for x in load[0]) + "; when it ended: " +
                        " / ".join(f"{x:.2f}" for x in load[1]) + "."]

    def produce_all(res: dict) -> list[str]:
        return produce_lines(res.get("args") or args, res["rounds"])

    renders = {"produce": produce_all, "dedup": dedup_lines, "fanout": fanout_lines,
               "consume": consume_lines, "flush": flush_lines, "fanout100": fanout100_lines,
               "broadcast": broadcast_all, "table-view": table_view_lines,
               "shadows": shadows_lines, "shadows-scale": scale_lines,
               "compaction": compaction_lines}
    produce = results.get("produce") or {}
    limits, nats = produce.get("limits"), produce.get("nats")
    when = "the same run"
    for part in PARTS:
        if part in results:
            lines += renders[part](results[part])
            continue
        body = None
        if part in old:
            name, doc = old[part]
            if part == "produce":
                res = {"rounds": doc["rounds"], "args": argparse.Namespace(
                    **{**vars(args), **doc.get("args", {})})}
                if not limits and not nats:
                    limits, nats = doc.get("limits"), doc.get("nats")
                    when = f"the run of bench/out/{name}"
            else:
                res = doc[KEYS.get(part, part)]
            body = renders[part](res)
            body[2:2] = [f"*Carried over from an earlier run (bench/out/{name})" + (
                "" if part in errors else f"; this run measured only `{args.only}`") + ".*", ""]
        elif part in text:
            body = [line.split("; this run measured only")[0] + ".*"
                    if part in errors and line.startswith("*Carried over from") else line
                    for line in text[part]]
        if part in errors:
            failed = [f"**Failed in the run of {measured}:** `{errors[part]}`" + (
                " The figures below are from an earlier run." if body else ""), ""]
            body = (body or [TITLES[part], ""])
            body[2:2] = failed
        lines += body or []
    if not limits and not nats and "produce" not in results and "produce" not in old:
        lines += text.get("limits", []) + text.get("nats", [])
    if limits:
        lines += [f"## Machine ceilings (limits.py, once in {when})", "", "```",
                  json.dumps(limits, indent=1), "```", ""]
    if nats:
        lines += [f"## NATS JetStream (nats_jetstream.py, once in {when})", "", "```",
                  json.dumps(nats, indent=1), "```", ""]
    notes = os.path.join(os.path.dirname(path), "NOTES.md")
    if os.path.exists(notes):
        with open(notes) as f:
            lines += [f.read()]
    with open(path, "w") as f:
        f.write("\n".join(lines))


DEFAULTS: dict = {}


def sub_args(args, prefix: str, extra: dict) -> argparse.Namespace:
    """bench/shadows*.py's options from run.py's `--<prefix>*` ones."""
    return argparse.Namespace(**extra, **{k[len(prefix):]: v for k, v in vars(args).items()
                                          if k.startswith(prefix)})


#: `--smoke`: every part at a tiny size (seconds each; tests/test_bench/test_bench_smoke.py)
SMOKE = {"messages": 2000, "producers": 1, "rounds": 1, "dedup_messages": 1000,
         "dedup_pairs": 1, "dedup_producers": 1, "readers": 2, "fanout_messages": 200,
         "consume_messages": 1000, "shared_consumers": 2, "shared_procs": 1,
         "exclusive_subs": 2, "nats_consume_messages": 500, "flush_subs": 50,
         "flush_seconds": 2.5, "flush_ceiling_seconds": 0.5, "fanout100_subs": 4,
         "fanout100_messages": 500, "fanout100_procs": 1, "nats_fanout100_messages": 200,
         "table_view_keys": 500,
         "broadcast_subs": 40, "broadcast_procs": 1, "broadcast_duration": 2.0,
         "broadcast_settle": 0.5, "metrics_scrapes": 1, "shadows_create_messages": 2000,
         "shadows_create_reps": 2, "shadows_rate": 500, "shadows_seconds": 1.5,
         "shadows_catchup_messages": 1000, "shadows_catchup_ledger_bytes": 32 << 10,
         "shadows_cpu_messages": 1000, "shadows_scale_shadows": 2,
         "shadows_scale_fanout_messages": 500, "shadows_scale_subs": 4,
         "shadows_scale_procs": 1, "shadows_scale_broadcast_subs": 30,
         "shadows_scale_broadcast_duration": 2.0, "compaction_messages": 20_000,
         "compaction_keys": 1000, "compaction_ledger_entries": 6000, "compaction_subs": 5,
         "compaction_tail": 200}


def run_part(part: str, args, data_dir: str, peers: str | None) -> dict:
    """Run one part of the bench in `data_dir` (its own); returns its figures."""
    if part == "produce":
        limits = nats = None
        if peers:
            limits = run_peer([sys.executable, os.path.join(peers, "limits.py"), "--dir",
                               data_dir], "limits.py")
            nats = run_peer([sys.executable, os.path.join(peers, "nats_jetstream.py")],
                            "nats_jetstream.py")
        print("running shadowtopic produce rounds", flush=True)
        return {"rounds": run_produce(args, data_dir, peers), "limits": limits, "nats": nats}
    if part == "dedup":
        from produce_dedup import run_dedup  # bench/produce_dedup.py

        print(f"running produce with deduplication on beside off ({args.dedup_pairs} "
              "pairs of rounds)", flush=True)
        return run_dedup(data_dir, args.dedup_messages, args.dedup_pairs,
                         args.dedup_producers, args.payload)
    if part == "fanout":
        from fanout import run_fanout  # bench/fanout.py, beside this script

        print("running fan-out rounds (limits.py fanout / shadowtopic, alternating)",
              flush=True)
        return run_fanout(peers, data_dir, args.readers, args.fanout_messages, args.payload,
                          args.rounds)
    if part == "consume":
        from consume import run_consume  # bench/consume.py

        print("running consume-and-ack rounds (limits.py fanout / shadowtopic / NATS, "
              "alternating)", flush=True)
        return run_consume(
            peers, data_dir, args.consume_messages, args.payload, args.rounds,
            args.shared_consumers, args.shared_procs, args.exclusive_subs,
            args.exclusive_procs, args.exclusive_ack, args.nats_consume_messages,
            profile=os.path.abspath(args.consume_profile) if args.consume_profile else None)
    if part == "flush":
        from cursor_flush import run_flush  # bench/cursor_flush.py

        print(f"running the cursor flush bench ({args.flush_subs:,} subscriptions, "
              f"{args.flush_seconds:g}s)", flush=True)
        return run_flush(data_dir, args.flush_subs, args.flush_seconds,
                         ceiling_seconds=args.flush_ceiling_seconds, rate=args.flush_rate)
    if part == "table-view":
        from table_view import run_table_view  # bench/table_view.py

        print(f"running table view rounds ({args.table_view_keys:,} keys)", flush=True)
        return run_table_view(data_dir, args.table_view_keys, args.rounds)
    if part == "fanout100":
        from broadcast import run_fanout100  # bench/broadcast.py

        print(f"running fan-out to {args.fanout100_subs} durable subscriptions (limits.py "
              "fanout / shadowtopic / NATS, alternating)", flush=True)
        return run_fanout100(peers, data_dir, args.fanout100_messages, args.payload,
                             args.rounds, args.fanout100_procs, args.nats_fanout100_messages,
                             args.fanout100_subs)
    if part == "broadcast":
        from broadcast import run_broadcast  # bench/broadcast.py
        from metrics_scrape import run_metrics_scrape  # bench/metrics_scrape.py

        print(f"running broadcast ({args.broadcast_subs:,} subscriptions, "
              f"{args.broadcast_duration:g} s at 1 msg/s)", flush=True)
        bcast = run_broadcast(data_dir, args.broadcast_subs, args.broadcast_procs,
                              args.broadcast_duration, settle=args.broadcast_settle)
        print(f"running the /metrics scrape ({args.broadcast_subs:,} subscriptions, with "
              "and without per-subscription series)", flush=True)
        bcast["metrics_scrape"] = run_metrics_scrape(data_dir, args.broadcast_subs,
                                                     args.metrics_scrapes)
        return bcast
    common = dict(rounds=args.rounds, payload=args.payload, profile=None)
    if part == "shadows":
        from shadows import run_shadows  # bench/shadows.py

        return run_shadows(data_dir, peers, sub_args(args, "shadows_", common))
    if part == "shadows-scale":
        from shadows_scale import run_scale  # bench/shadows_scale.py

        return run_scale(data_dir, peers, sub_args(args, "shadows_scale_", common))
    if part == "compaction":
        from compaction_bench import run_compaction  # bench/compaction_bench.py

        print("running compaction", flush=True)
        return run_compaction(data_dir, sub_args(args, "compaction_", common))
    raise ValueError(f"unknown part {part!r}")


def failure(exc: BaseException) -> str:
    """One line for a part's error: the bench's own checks raise SystemExit with a message."""
    text = str(exc.code) if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split()).replace("`", "'")
    return text if len(text) <= 400 else text[:400] + " ..."


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    p.add_argument("--messages", type=int, default=400_000)
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--payload", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sample", type=int, default=10,
                   help="every N-th message records its ack latency through a callback")
    p.add_argument("--no-peers", action="store_true", help="skip limits.py and NATS")
    p.add_argument("--only", default=",".join(PARTS),
                   help="comma-separated subset of " + ",".join(PARTS))
    p.add_argument("--smoke", action="store_true",
                   help="every part at a tiny size (the defaults of SMOKE; options given "
                        "still win): does each part run, not how fast")
    p.add_argument("--dedup-messages", type=int, default=200_000,
                   help="dedup: messages a round (bench/produce_dedup.py)")
    p.add_argument("--dedup-pairs", type=int, default=6, help="dedup: pairs of rounds")
    p.add_argument("--dedup-producers", type=int, default=2, help="dedup: producer processes")
    p.add_argument("--readers", type=int, default=100, help="fan-out: readers of one topic")
    p.add_argument("--fanout-messages", type=int, default=20_000)
    p.add_argument("--consume-messages", type=int, default=200_000,
                   help="consume: messages the topic is pre-filled with")
    p.add_argument("--shared-consumers", type=int, default=4,
                   help="consume (a): consumers of the one Shared subscription")
    p.add_argument("--shared-procs", type=int, default=2,
                   help="consume (a): client processes they are spread over")
    p.add_argument("--exclusive-subs", type=int, default=10,
                   help="consume (b): Exclusive subscriptions, one consumer each")
    p.add_argument("--exclusive-procs", type=int, default=1,
                   help="consume (b): client processes they are spread over")
    p.add_argument("--exclusive-ack", choices=["cumulative", "individual"],
                   default="cumulative")
    p.add_argument("--nats-consume-messages", type=int, default=10_000,
                   help="consume: nats_jetstream.py --messages (its consumers are slow)")
    p.add_argument("--consume-profile", default=None,
                   help="consume: run its broker under cProfile, stats to this path")
    p.add_argument("--flush-subs", type=int, default=10_000)
    p.add_argument("--flush-seconds", type=float, default=20.0)
    p.add_argument("--flush-ceiling-seconds", type=float, default=5.0,
                   help="flush: then save back to back for this long (0: skip)")
    p.add_argument("--flush-rate", type=float, default=5.0,
                   help="flush: ack rounds per second (every subscription acks per round)")
    p.add_argument("--fanout100-subs", type=int, default=100,
                   help="fanout100: Exclusive subscriptions of the pre-filled topic")
    p.add_argument("--fanout100-messages", type=int, default=100_000,
                   help="fanout100: messages the topic is pre-filled with")
    p.add_argument("--fanout100-procs", type=int, default=2,
                   help="fanout100: client processes the subscriptions are spread over")
    p.add_argument("--nats-fanout100-messages", type=int, default=2_000,
                   help="fanout100: nats_jetstream.py --messages (x 100 deliveries)")
    p.add_argument("--table-view-keys", type=int, default=100_000,
                   help="table-view: keys the view loads")
    p.add_argument("--broadcast-subs", type=int, default=100_000)
    p.add_argument("--broadcast-procs", type=int, default=4,
                   help="broadcast: client processes the subscriptions are spread over")
    p.add_argument("--broadcast-duration", type=float, default=60.0,
                   help="broadcast: seconds of 1 msg/s after attaching")
    p.add_argument("--broadcast-settle", type=float, default=5.0,
                   help="broadcast: seconds idle after attaching before reading the RSS")
    p.add_argument("--metrics-scrapes", type=int, default=5,
                   help="broadcast: GETs of /metrics per case (bench/metrics_scrape.py)")
    from compaction_bench import (
        add_args as compaction_args,  # bench/compaction_bench.py
    )
    from shadows import add_args as shadows_args  # bench/shadows.py
    from shadows_scale import add_args as scale_args  # bench/shadows_scale.py

    shadows_args(p, "shadows-")
    scale_args(p, "shadows-scale-")
    compaction_args(p, "compaction-")
    DEFAULTS.update((k, p.get_default(k)) for k in vars(p.parse_args([])))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "RESULTS.md"),
                   help="the RESULTS.md to write (rewritten after each part)")
    p.add_argument("--out-dir", default=os.path.join(ROOT, "bench", "out"),
                   help="where this run's <stamp>.json goes (rewritten after each part) and "
                        "earlier runs' figures are carried over from")
    p.add_argument("--data-dir", default=os.path.join(ROOT, "data", "bench"),
                   help="the parts' etcd and broker data go in a temporary directory here")
    if p.parse_known_args()[0].smoke:
        p.set_defaults(**SMOKE)
    args = p.parse_args()
    load0 = os.getloadavg()
    peers = os.path.join(args.shared, "peers")
    if not args.no_peers and not os.path.isdir(peers):
        sys.exit(f"bench: {peers} not found (../shared sits beside a developer's clone); "
                 "pass --shared DIR or --no-peers")
    parts = set(args.only.split(","))
    if parts - set(PARTS):
        sys.exit(f"bench: --only: unknown parts {sorted(parts - set(PARTS))}")
    os.makedirs(args.data_dir, exist_ok=True)
    os.makedirs(args.out_dir, exist_ok=True)
    old = carried_over(set(), args.out_dir)  # before this run's own file exists
    text = previous_sections(args.out, args.only)  # before this run rewrites it
    stamp = time.strftime("%Y%m%d-%H%M%S")
    doc: dict = {"args": {k: getattr(args, k) for k in ("messages", "producers", "payload",
                                                        "rounds", "sample", "only")},
                 "rounds": None, "limits": None, "nats": None,
                 **{KEYS.get(part, part): None for part in PARTS if part != "produce"},
                 "errors": {}, "seconds": {}, "load": [load0, None]}
    results: dict = {}
    with tempfile.TemporaryDirectory(dir=args.data_dir) as data_dir:
        for part in PARTS:
            if part not in parts:
                continue
            part_dir = os.path.join(data_dir, part)  # its own etcd, brokers and files
            os.makedirs(part_dir)
            t0 = time.monotonic()
            try:
                results[part] = run_part(part, args, part_dir, None if args.no_peers else peers)
            except (Exception, SystemExit) as exc:
                traceback.print_exc()
                doc["errors"][part] = failure(exc)
                print(f"bench: part {part} FAILED: {doc['errors'][part]}", flush=True)
            doc["seconds"][part] = round(time.monotonic() - t0, 1)
            if part in results:
                if part == "produce":
                    doc.update(results[part])
                else:
                    doc[KEYS.get(part, part)] = results[part]
            # saved part by part: a later part that fails or hangs loses nothing measured
            doc["load"][1] = os.getloadavg()
            with open(os.path.join(args.out_dir, stamp + ".json"), "w") as f:
                json.dump(doc, f, indent=1)
            write_results(args.out, args, results, doc["errors"],
                          {k: v for k, v in old.items() if k not in results},
                          (load0, os.getloadavg()), text)
            print(f"bench: part {part} {'failed' if part in doc['errors'] else 'done'} in "
                  f"{doc['seconds'][part]} s; figures so far in "
                  f"{os.path.join(args.out_dir, stamp + '.json')} and {args.out}", flush=True)
    print(open(args.out).read())
    if doc["errors"]:
        sys.exit(f"bench: {len(doc['errors'])} part(s) failed: " + "; ".join(
            f"{k}: {v}" for k, v in doc["errors"].items()))


if __name__ == "__main__":
    main()
