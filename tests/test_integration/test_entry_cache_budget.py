"""The broker-wide entry cache against a real broker: with a small `--entry-cache-bytes`,
several MiB produced to a few topics stay within the budget (the broker logs its entry
cache figures when it evicts and when it stops), and readers from earliest, a durable
subscription and the next incarnation after a kill -9 read every message back."""
from __future__ import annotations

import os
import re
import uuid

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client
from shadowtopic.standalone import BrokerProcess

BUDGET = 1 << 20
TOPICS = 3
MESSAGES = 1200          # per topic, 2 KiB each: ~7 MiB in all
PAYLOAD = 2048
STAT = re.compile(r"entry cache: limit=(\d+) held=(\d+) peak=(\d+) items=\d+ "
                  r"evictions=(\d+) evicted_bytes=(\d+)")


def _broker(etcd, data_dir: str) -> BrokerProcess:
    return BrokerProcess(etcd, data_dir, free_port(),
                         extra_args=["--lease-ttl", "3", "--entry-cache-bytes", "1M"])


def _stats(broker: BrokerProcess) -> list[tuple[int, ...]]:
    with open(broker.log_path, encoding="utf-8", errors="replace") as f:
        return [tuple(map(int, m.groups())) for m in STAT.finditer(f.read())]


def _read_all(client: Client, topic: str, limit: int = MESSAGES) -> list[bytes]:
    out = []
    with client.create_reader(topic, start="earliest") as r:
        while r.has_message_available():
            out.append(r.read_next(timeout=30).payload)
            assert len(out) <= limit, "more messages than were produced"
    return out


def _produce(client: Client, topic: str, payloads: list[bytes]) -> None:
    failures = []
    with client.create_producer(topic, batch_max_messages=100) as p:
        for payload in payloads:
            p.send_async(payload, callback=lambda mid, exc: exc and failures.append(exc))
        p.flush(timeout=120)
    assert not failures, failures[:3]


def test_held_entries_stay_within_the_budget_and_all_read_back(etcd_server, tmp_path):
    ns = f"persistent://public/ns-{uuid.uuid4().hex[:8]}"
    topics = [f"{ns}/budget-{i}" for i in range(TOPICS)]
    sent = {t: [f"{t}:{i}:".encode() + os.urandom(PAYLOAD) for i in range(MESSAGES)]
            for t in topics}
    data_dir = str(tmp_path / "data")
    broker = _broker(etcd_server.endpoint, data_dir).start(timeout=60)
    try:
        with Client(broker.url, timeout=30) as client:
            for t in topics:
                client.admin.create_topic(t)
            for t in topics:
                half = MESSAGES // 2
                _produce(client, t, sent[t][:half])
                if t == topics[0]:
                    client.admin.roll_ledger(t)   # half of it from Parquet, half from the WAL
                _produce(client, t, sent[t][half:])
            for t in topics:
                assert _read_all(client, t) == sent[t], f"{t} did not read back identical"
            got = []
            with client.subscribe(topics[1], "all", initial_position="earliest") as consumer:
                while len(got) < MESSAGES:
                    msg = consumer.receive(timeout=30)
                    got.append(msg.payload)
                    consumer.acknowledge(msg)
            assert got == sent[topics[1]]
        assert broker.terminate() == 0
    finally:
        broker.kill()
    stats = _stats(broker)
    assert stats, "the broker logged no entry cache figures:\n" + broker.log_tail()
    for limit, held, peak, _evictions, _evicted in stats:
        assert limit == BUDGET and held <= BUDGET and peak <= BUDGET, stats
    total = sum(map(len, (p for ps in sent.values() for p in ps)))
    assert stats[-1][4] >= total - BUDGET, f"too little was evicted: {stats[-1]}"

    # kill -9 with entries evicted from memory: the next incarnation seals every WAL
    broker = _broker(etcd_server.endpoint, data_dir).start(timeout=60)
    try:
        with Client(broker.url, timeout=30) as client:
            more = [f"more:{i}:".encode() + os.urandom(PAYLOAD) for i in range(600)]
            _produce(client, topics[2], more)
            sent[topics[2]] += more
        broker.kill()
        broker = _broker(etcd_server.endpoint, data_dir).start(timeout=60)
        with Client(broker.url, timeout=30) as client:
            for t in topics:
                assert _read_all(client, t, len(sent[t])) == sent[t]
    finally:
        broker.kill()
