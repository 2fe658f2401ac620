"""C7 with durable subscriptions and a memory budget: one subscription stops consuming while
80 MiB go through a topic. The five others keep up with the producer; the broker's entries
stay within `--entry-cache-bytes` (its open ledger alone would otherwise hold 64 MiB) and
its RSS grows far less than what went through; the stalled subscription then reads every
message back, in order, from the WAL and Parquet."""
from __future__ import annotations

import threading
import time

import pytest

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client, errors
from shadowtopic.standalone import BrokerProcess

BUDGET = 8 << 20
PAYLOAD = 50 << 10
BATCHES = 40
PER_BATCH = 40            # 40 x 40 x 50 KiB = 80 MiB, one batch every 0.2 s (10 MiB/s)
N = BATCHES * PER_BATCH


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


@pytest.fixture
def budget_broker(etcd_server, tmp_path):
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "data"), free_port(),
                      extra_args=["--lease-ttl", "3", "--entry-cache-bytes", str(BUDGET)])
    b.start(timeout=60)
    try:
        yield b
    finally:
        b.kill()


def test_a_stalled_subscription_slows_no_one_and_memory_stays_in_budget(budget_broker, topic):
    broker = budget_broker
    with Client(broker.url, timeout=60) as client, Client(broker.url, timeout=60) as stalled_c:
        client.admin.create_topic(topic)
        got: dict[str, int] = {}
        lock = threading.Lock()

        def on_message(msg, recipients):
            with lock:
                for c in recipients:
                    got[c.subscription_name] = got.get(c.subscription_name, 0) + 1
            recipients.acknowledge(msg)

        names = [f"live{i}" for i in range(5)]
        client.subscribe_many(topic, names, initial_position="earliest",
                              message_listener=on_message)
        stalled = stalled_c.subscribe(topic, "stalled", initial_position="earliest",
                                      receiver_queue_size=10)
        rss0 = _rss(broker.proc.pid)
        peak = rss0
        ids = []
        behind = []  # after each batch: how far the slowest live subscription lags
        with client.create_producer(topic, batch_max_messages=PER_BATCH) as p:
            payload = b"x" * PAYLOAD
            for _b in range(BATCHES):
                t = time.monotonic()
                done: list = []
                for _ in range(PER_BATCH):
                    p.send_async(payload,
                                 callback=lambda mid, exc, out=done: out.append((mid, exc)))
                p.flush(timeout=60)
                assert len(done) == PER_BATCH and not any(exc for _, exc in done), done[:3]
                ids += [mid for mid, _ in done]
                with lock:
                    behind.append(len(ids) - min(got.get(n, 0) for n in names))
                peak = max(peak, _rss(broker.proc.pid))
                time.sleep(max(0.0, 0.2 - (time.monotonic() - t)))
        deadline = time.monotonic() + 60
        while True:
            with lock:
                if all(got.get(n, 0) >= N for n in names):
                    break
            assert time.monotonic() < deadline, f"live subscriptions stopped at {got}"
            time.sleep(0.1)
        peak = max(peak, _rss(broker.proc.pid))
        # the live subscriptions kept up: never more than a few batches behind the producer
        assert max(behind) <= 4 * PER_BATCH, f"live subscriptions fell behind: {behind}"
        assert got == {n: N for n in names}
        # what went through (80 MiB) did not stay in the broker's memory. The broker grows
        # by 38-42 MiB besides the budget when this test runs alone (Arrow's pool after the
        # seals, gRPC buffers) and by 49 MiB once in the parallel suite; keeping the 80 MiB
        # would grow it by over 110 MiB
        assert peak - rss0 < BUDGET + (56 << 20), \
            f"broker RSS grew {(peak - rss0) >> 20} MiB with an {BUDGET >> 20} MiB budget"
        # the stalled subscription holds only its permits; it now reads all, in order
        seen = []
        while len(seen) < N:
            m = stalled.receive(timeout=30)
            seen.append(m.message_id)
            stalled.acknowledge(m)
        assert seen == ids
        with pytest.raises(errors.Timeout):
            stalled.receive(timeout=0.5)
        cache = client.admin.internal_stats(topic)["entryCache"]
        assert int(cache["limit"]) == BUDGET
        assert 0 < int(cache["peak"]) <= BUDGET and int(cache["held"]) <= BUDGET
        assert int(cache["evictedBytes"]) > N * PAYLOAD // 2  # most of it went through
