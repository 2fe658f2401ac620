#!/usr/bin/env python3
"""The cost of security (issue 31): acked produce and fan-out to 100 durable subscriptions
against a broker serving plaintext with no authentication (A) and one serving TLS with token
authentication (B), in alternating rounds (A B A B ...) on one etcd. Target: B within 15% of
A (the median of the paired ratios).

    .venv/bin/python bench/security_cost.py [--rounds 3] [--messages 200000]
                                            [--fanout-messages 50000] [--subs 100]

- produce: `--producers` (2) client processes each `send_async` their share of `--messages`
  messages of `--payload` (100) random bytes (a pool of distinct payloads, never one
  repeated byte) with keys, then `flush`; rate = acked / (first send -> last ack).
- fan-out: one topic pre-filled with `--fanout-messages`; `--subs` fresh Exclusive
  subscriptions at "earliest" in `--fanout-procs` (2) client processes read every message
  (`batch_receive`, payload touched, the last of each batch acknowledged cumulatively);
  rate = delivered / (first receive -> last ack).
B's clients dial `shadowtopic+ssl://` with the test CA and present a token (HS256) of role
`bench`; its broker verifies every call's token (cached per token: a stream is
authenticated once) and authorizes it (`--authorization`: `bench` holds produce and consume
on public/default by a namespace grant, checked per topic as a stream names it).
Prints one JSON document, and a Markdown table on stderr. Bounded by its arguments.
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
import uuid


def _client(target: dict, role: str = "client"):
    """A client of `target` as the bench role ("client") or the admin ("admin")."""
    from shadowtopic.client import Client
    return Client(target["url"], timeout=60, **target[role])


def _produce(target: dict, topic: str, count: int, payload: int, start_at: float, out) -> None:
    rnd = os.urandom(payload * 64)
    pool = [rnd[i:i + payload] for i in range(0, payload * 63, payload)]
    with _client(target) as c:
        p = c.create_producer(topic)
        while time.time() < start_at:
            time.sleep(0.001)
        t0, c0 = time.time(), time.process_time()
        for i in range(count):
            p.send_async(pool[i % len(pool)], key=f"k{i % 1000}")
        p.flush(timeout=300)
        out.put({"t0": t0, "t1": time.time(), "cpu_s": time.process_time() - c0,
                 "acked": p.stats()["acked"]})
        p.close()


def _fanout(target: dict, topic: str, subs: list[str], messages: int, start_at: float,
            out) -> None:
    with _client(target) as c:
        consumers = [c.subscribe(topic, s, initial_position="earliest",
                                 receiver_queue_size=1000) for s in subs]
        while time.time() < start_at:
            time.sleep(0.001)
        t0, c0 = None, time.process_time()
        left = {id(x): messages for x in consumers}
        got = 0
        while any(left.values()):
            for x in consumers:
                if not left[id(x)]:
                    continue
                batch = x.batch_receive(1000, timeout=0.05)
                if batch:
                    t0 = t0 or time.time()
                    for m in batch:
                        _ = m.payload
                    x.acknowledge_cumulative(batch[-1])
                    left[id(x)] -= len(batch)
                    got += len(batch)
        out.put({"t0": t0, "t1": time.time(), "cpu_s": time.process_time() - c0,
                 "delivered": got})
        for x in consumers:
            x.close()


def _run(fn, jobs: list[tuple]) -> list[dict]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=fn, args=(*job, q)) for job in jobs]
    for p in procs:
        p.start()
    results = [q.get(timeout=900) for _ in procs]
    for p in procs:
        p.join(60)
    return results


def produce_round(target: dict, topic: str, a) -> dict:
    start = time.time() + 2.0
    share = a.messages // a.producers
    res = _run(_produce, [(target, topic, share, a.payload, start)
                          for _ in range(a.producers)])
    t0, t1 = min(r["t0"] for r in res), max(r["t1"] for r in res)
    acked = sum(r["acked"] for r in res)
    assert acked == share * a.producers, (acked, share * a.producers)
    return {"msgs_per_s": round(acked / (t1 - t0)),
            "client_cpu_us_per_msg": round(sum(r["cpu_s"] for r in res) / acked * 1e6, 2)}


def fanout_round(target: dict, topic: str, a) -> dict:
    names = [f"s-{uuid.uuid4().hex[:8]}-{i}" for i in range(a.subs)]
    per = (len(names) + a.fanout_procs - 1) // a.fanout_procs
    start = time.time() + 3.0
    res = _run(_fanout, [(target, topic, names[i:i + per], a.fanout_messages, start)
                         for i in range(0, len(names), per)])
    t0 = min(r["t0"] for r in res if r["t0"])
    t1 = max(r["t1"] for r in res)
    got = sum(r["delivered"] for r in res)
    assert got == a.subs * a.fanout_messages, (got, a.subs * a.fanout_messages)
    return {"msgs_per_s": round(got / (t1 - t0)),
            "client_cpu_us_per_msg": round(sum(r["cpu_s"] for r in res) / got * 1e6, 2)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--payload", type=int, default=100)
    p.add_argument("--fanout-messages", type=int, default=50_000)
    p.add_argument("--subs", type=int, default=100)
    p.add_argument("--fanout-procs", type=int, default=2)
    a = p.parse_args(argv)

    from shadowtopic.security import certs, tokens
    from shadowtopic.security.authentication import AuthOptions
    from shadowtopic.security.tls import TlsOptions
    from shadowtopic.testing import start_broker, start_etcd

    d = tempfile.mkdtemp(prefix="shadowtopic-security-bench-")
    ca = certs.make_ca()
    ca_file = certs.write(ca, d, "ca")[0]
    cert, key = certs.write(certs.issue(ca, "broker", ["127.0.0.1", "localhost"]), d, "broker")
    secret = tokens.create_secret_key()
    with open(os.path.join(d, "secret.key"), "wb") as f:
        f.write(secret)
    with open(os.path.join(d, "broker.token"), "w") as f:
        f.write(tokens.create_token("broker", secret))
    tls = TlsOptions(cert, key, ca_file)
    auth = AuthOptions(token_secret_key=os.path.join(d, "secret.key"),
                       client_token_file=os.path.join(d, "broker.token"), authorization=True,
                       superuser_roles=("broker", "admin"), proxy_roles=("broker",))
    etcd = start_etcd(os.path.join(d, "etcd"))
    brokers = []
    try:
        plain = start_broker(etcd.endpoint, os.path.join(d, "plain"),
                             args=["--cluster", "plain", "--metrics-port", "-1"])
        brokers.append(plain)
        secure = start_broker(etcd.endpoint, os.path.join(d, "secure"), tls=tls,
                              args=[*auth.flags(), "--cluster", "secure",
                                    "--metrics-port", "-1"])
        brokers.append(secure)
        targets = {"plain": {"url": plain.url, "client": {}, "admin": {}},
                   "secure": {"url": f"shadowtopic+ssl://{secure.url}",
                              "client": {"tls_trust_certs_file": ca_file,
                                         "auth_token": tokens.create_token("bench", secret)},
                              "admin": {"tls_trust_certs_file": ca_file,
                                        "auth_token": tokens.create_token("admin", secret)}}}
        with _client(targets["secure"], "admin") as c:
            c.admin.grant_permission("public/default", "bench", ["produce", "consume"])
        time.sleep(1.0)  # the broker hears of the grant through its watch
        fill = {}
        for name, target in targets.items():
            with _client(target, "admin") as c:
                fill[name] = f"persistent://public/default/fanout-{uuid.uuid4().hex[:6]}"
                c.admin.create_topic(fill[name])
                with c.create_producer(fill[name]) as prod:
                    rnd = os.urandom(a.payload * 64)
                    for i in range(a.fanout_messages):
                        prod.send_async(rnd[(i % 63) * a.payload:(i % 63 + 1) * a.payload])
                    prod.flush(timeout=300)
        rounds = []
        for r in range(a.rounds):
            row: dict = {}
            for name, target in targets.items():  # A (plaintext) then B (TLS + tokens)
                topic = f"persistent://public/default/produce-{uuid.uuid4().hex[:6]}"
                with _client(target, "admin") as c:
                    c.admin.create_topic(topic)
                row[name] = {"produce": produce_round(target, topic, a),
                             "fanout": fanout_round(target, fill[name], a)}
            for part in ("produce", "fanout"):
                row[f"{part}_ratio"] = round(row["secure"][part]["msgs_per_s"]
                                             / row["plain"][part]["msgs_per_s"], 3)
            rounds.append(row)
            print(f"round {r + 1}: {json.dumps(row)}", file=sys.stderr, flush=True)
        out = {"rounds": rounds, "args": vars(a),
               "produce_ratio_median": statistics.median(x["produce_ratio"] for x in rounds),
               "fanout_ratio_median": statistics.median(x["fanout_ratio"] for x in rounds)}
        print("| round | produce plain msgs/s | produce TLS+token | ratio | fan-out plain "
              "msgs/s | fan-out TLS+token | ratio |", file=sys.stderr)
        print("|---|---:|---:|---:|---:|---:|---:|", file=sys.stderr)
        for i, x in enumerate(rounds, 1):
            print(f"| {i} | {x['plain']['produce']['msgs_per_s']:,} | "
                  f"{x['secure']['produce']['msgs_per_s']:,} | {x['produce_ratio']} | "
                  f"{x['plain']['fanout']['msgs_per_s']:,} | "
                  f"{x['secure']['fanout']['msgs_per_s']:,} | {x['fanout_ratio']} |",
                  file=sys.stderr)
        print(json.dumps(out))
        return out
    finally:
        for b in brokers:
            b.kill()
        etcd.close()


if __name__ == "__main__":
    main()
