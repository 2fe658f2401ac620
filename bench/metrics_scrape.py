"""`/metrics` scrape time and size with `--subs` (100,000) durable subscriptions on one topic
(issue 20), with and without per-subscription series (`--metrics-per-subscription`).

    .venv/bin/python bench/metrics_scrape.py --subs 100000 --scrapes 5

Per case (per-subscription series off, the default, then on) a fresh etcd and broker
process: the subscriptions are made with `Client.subscribe_many` ("earliest"; consumers
attached, in batches of 20,000), then `--messages` (10) are produced, so every subscription
has a backlog to count; then `--scrapes` GETs of /metrics, plain and gzip: wall time
(median, max), the time the broker's event loop was held collecting
(`shadowtopic_scrape_collect_seconds`, read from the next scrape), size (bytes plain and
gzipped) and the number of samples.
A bench, not a test: every wait is bounded.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
if BENCH not in sys.path:  # the sibling bench modules imported below
    sys.path.insert(0, BENCH)

BATCH = 20_000


def _get(url: str, gz: bool) -> tuple[float, bytes, int]:
    """(seconds, plain body, bytes on the wire)."""
    req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gz else {})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        wire = r.read()
    dt = time.perf_counter() - t0
    return dt, gzip.decompress(wire) if gz else wire, len(wire)


def _sample(text: bytes, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name.encode() + b" "):
            return float(line.split()[-1])
    return None


def measure(url: str, scrapes: int) -> dict:
    plain, gz, held = [], [], []
    body, gz_size = b"", 0
    for _i in range(scrapes):
        dt, body, _ = _get(url, False)
        plain.append(dt)
        dt, _, gz_size = _get(url, True)
        gz.append(dt)
    for _ in range(scrapes):  # each scrape says what the one before held the loop
        dt, text, _ = _get(url, False)
        held.append(_sample(text, "shadowtopic_scrape_collect_seconds") or 0.0)
    samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return {"scrape_s_median": round(statistics.median(plain), 3),
            "scrape_s_max": round(max(plain), 3),
            "scrape_gzip_s_median": round(statistics.median(gz), 3),
            "loop_held_s_median": round(statistics.median(held), 3),
            "loop_held_s_max": round(max(held), 3),
            "bytes": len(body), "gzip_bytes": gz_size, "samples": samples}


def run_metrics_scrape(data_dir: str, subs: int = 100_000, scrapes: int = 5,
                       messages: int = 10) -> dict:
    """Per case (per-subscription series off, then on): a fresh etcd and broker, `subs`
    subscriptions attached, `messages` produced, `scrapes` measured."""
    res: dict = {"subscriptions": subs, "scrapes": scrapes, "messages": messages}
    for per_sub in (False, True):
        key = "on" if per_sub else "off"
        res[key] = _case(os.path.join(data_dir, f"metrics-{key}"), subs, scrapes, messages,
                         per_sub)
        print(f"  per-subscription series {key}: {res[key]}", flush=True)
    return res


def _case(data_dir: str, subs: int, scrapes: int, messages: int, per_sub: bool) -> dict:
    import topics  # bench/topics.py

    from shadowtopic.broker.server import free_port
    from shadowtopic.client import Client
    from shadowtopic.metadata.etcd_server import EtcdServer
    from shadowtopic.standalone import BrokerProcess

    topic = topics.name("metrics-scrape", "per-sub-on" if per_sub else "per-sub-off")
    with EtcdServer(os.path.join(data_dir, "etcd")) as etcd:
        etcd.start()
        mport = free_port()
        broker = BrokerProcess(etcd.endpoint, os.path.join(data_dir, "broker"), free_port(),
                               extra_args=["--metrics-port", str(mport)] +
                               (["--metrics-per-subscription"] if per_sub else []))
        broker.start(timeout=120)
        url = f"http://127.0.0.1:{mport}/metrics"
        try:
            with Client(broker.url, timeout=300) as c:
                c.admin.create_topic(topic)
                names = [f"m-{i}" for i in range(subs)]
                t0 = time.monotonic()
                for i in range(0, subs, BATCH):
                    c.subscribe_many(topic, names[i:i + BATCH], initial_position="earliest",
                                     receiver_queue_size=100)
                attach_s = round(time.monotonic() - t0, 1)
                print(f"  attached {subs:,} subscriptions in {attach_s} s", flush=True)
                with c.create_producer(topic) as p:
                    for i in range(messages):
                        p.send(f"m{i}".encode())
                time.sleep(2.0)
                out = measure(url, scrapes)
                out["attach_s"] = attach_s
                return out
        finally:
            broker.terminate(timeout=120)


def scrape_lines(res: dict) -> list[str]:
    """The RESULTS.md lines (a subsection of the broadcast part)."""
    n = res["subscriptions"]
    rows = [("per-subscription series off (the default)", res["off"]),
            ("`--metrics-per-subscription`", res["on"])]
    out = [f"### /metrics scrape with {n:,} subscriptions (bench/metrics_scrape.py)", "",
           f"Per case a fresh etcd and broker, one topic, {n:,} durable subscriptions "
           f"attached (`subscribe_many`, \"earliest\"), {res['messages']} messages produced "
           f"(each subscription's backlog); {res['scrapes']} GETs of /metrics per case, plain "
           "and gzip. Loop held: how long the broker's event loop was busy reading the "
           "numbers (`shadowtopic_scrape_collect_seconds`); the text is formatted and "
           "compressed in a thread.", "",
           "| case | scrape (median / max) | gzip scrape | loop held (median / max) | size "
           "| gzip | samples |", "|---|---:|---:|---:|---:|---:|---:|"]
    for label, m in rows:
        out.append(f"| {label} | {m['scrape_s_median']} / {m['scrape_s_max']} s | "
                   f"{m['scrape_gzip_s_median']} s | {m['loop_held_s_median']} / "
                   f"{m['loop_held_s_max']} s | {m['bytes']:,} B | {m['gzip_bytes']:,} B | "
                   f"{m['samples']:,} |")
    out.append("")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--subs", type=int, default=100_000)
    p.add_argument("--scrapes", type=int, default=5)
    p.add_argument("--messages", type=int, default=10)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="metrics-bench-") as d:
        res = run_metrics_scrape(d, a.subs, a.scrapes, a.messages)
    print(json.dumps(res, indent=1) if a.json else "\n".join(scrape_lines(res)))


if __name__ == "__main__":
    main()
