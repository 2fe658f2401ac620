"""Load shedding (source/broker/shedding.py): a shadow broker that joins a cluster whose
shadows all sit on one shadow broker gets its share, a shadow at a time, and durable
subscriptions of a moved shadow go on from their last acknowledgement on the new broker.
(Source topics shed among brokers with the WAL on object storage: test_object_wal.py.)"""
from __future__ import annotations

import subprocess
import sys
import time
import uuid

from support.waiting import drain, wait_for

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client, errors
from shadowtopic.standalone import BrokerProcess

SHED = ["--load-shedding-interval", "0.5"]


def owners(c: Client, topics: list[str]) -> dict[str, str]:
    """topic -> the url of the broker that owns it ('' while nobody does)."""
    out = {}
    for t in topics:
        found = c.admin.lookup(t)
        out[t] = found.get("brokerUrl", "") if found.get("epoch") else ""
    return out


def test_a_shadow_broker_that_joins_takes_its_share(start_pair, etcd_server, tmp_path):
    src, a = start_pair(*SHED)
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"
    shadows = [f"{topic}-shadow-{i}" for i in range(4)]
    with Client(src.url, timeout=30) as c:
        c.admin.create_topic(topic)
        for sh in shadows:
            c.admin.create_shadow_topic(sh, topic)
        with c.create_producer(topic) as p:
            ids = [p.send(f"m{i}".encode()) for i in range(10)]
        wait_for(lambda: set(owners(c, shadows).values()) == {a.url}, 30,
                 "every shadow served by the one shadow broker")
        for sh in shadows:  # a durable subscription on each, half acknowledged
            with c.subscribe(sh, "sub", initial_position="earliest") as cons:
                got = drain(cons, 10, ack=False)
                assert [m.message_id for m in got] == ids, sh
                for m in got[:5]:
                    cons.acknowledge(m)
        time.sleep(1.5)  # the acknowledgements flushed (cursor snapshots: 1 s)

        args = src.extra_args  # the pair's cluster, storage root and leases
        b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "sh-b"), free_port(),
                          extra_args=args, module="shadowtopic.shadow.broker")
        try:
            b.start(timeout=60)
            placed = wait_for(lambda: (lambda o: o if sorted(o.values()) == sorted(
                [a.url, a.url, b.url, b.url]) else None)(owners(c, shadows)), 60,
                "two shadows moved to the broker that joined", ignore=(errors.ShadowTopicError,))
            moved = [sh for sh, url in placed.items() if url == b.url]
            time.sleep(2.0)  # a few shedding intervals: nothing else moves
            assert owners(c, shadows) == placed
            # each subscription goes on from its first unacknowledged message
            for sh in shadows:
                with c.subscribe(sh, "sub", initial_position="earliest") as cons:
                    rest = drain(cons, 5, timeout=30)
                    assert [m.message_id for m in rest] == ids[5:], sh
            with c.create_producer(topic) as p:
                more = p.send(b"after")
            for sh in moved:
                with c.create_reader(sh, start=more, inclusive=True) as r:
                    assert r.read_next(timeout=30).message_id == more
        finally:
            b.kill()


def test_a_negative_shedding_interval_is_refused(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "shadowtopic.shadow.broker", "--data-dir", str(tmp_path),
         "--load-shedding-interval", "-1"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode == 2, res.stderr
    assert "--load-shedding-interval must be 0 (off) or more" in res.stderr, res.stderr
