"""kill -9 of a broker holding 1,000 durable subscriptions at different positions with
individually acknowledged holes: after a restart every cursor and backlog is restored exactly
(docs/BEHAVIOURS.md C4, C6)."""
from __future__ import annotations

import time

import pytest
from support.waiting import wait_cursors_saved

from shadowtopic.client import Client, Policies
from shadowtopic.core import errors

SUBS = 1000
MESSAGES = 300


def plan(i: int) -> tuple[int, set[int]]:
    """Subscription i: cumulative ack up to message `upto` (-1: none), plus two holes."""
    upto = (i * 37) % (MESSAGES + 1) - 1
    holes = {(i * 7 + 5) % MESSAGES, (i * 13 + 11) % MESSAGES}
    return upto, holes


def expected_backlog(i: int) -> int:
    upto, holes = plan(i)
    acked = set(range(upto + 1)) | holes
    return MESSAGES - len(acked)


@pytest.mark.own_broker
def test_1000_subscriptions_survive_kill_9_with_exact_backlogs(broker, client, topic):
    client.admin.create_topic(topic, policies=Policies(ledger_max_entries=50))
    with client.create_producer(topic) as p:
        ids = [p.send(f"m{i}".encode()) for i in range(MESSAGES)]
    with Client(broker.url, timeout=60) as c:
        consumers = [c.subscribe(topic, f"s{i}", initial_position="earliest",
                                 receiver_queue_size=1) for i in range(SUBS)]
        for i, cons in enumerate(consumers):
            upto, holes = plan(i)
            if upto >= 0:
                cons.acknowledge_cumulative(ids[upto])
            for h in sorted(holes):
                cons.acknowledge(ids[h])
        deadline = time.monotonic() + 60
        while True:
            subs = client.admin.stats(topic)["subscriptions"]
            if all(subs[f"s{i}"]["msgBacklog"] == expected_backlog(i) for i in range(SUBS)):
                break
            assert time.monotonic() < deadline, "acks did not all arrive"
            time.sleep(0.2)
        wait_cursors_saved(client, topic)
        broker.kill()
    broker.start(timeout=60)
    with Client(broker.url, timeout=60) as again:
        subs = again.admin.stats(topic)["subscriptions"]
        assert len(subs) == SUBS
        wrong = {i: subs[f"s{i}"]["msgBacklog"] for i in range(SUBS)
                 if subs[f"s{i}"]["msgBacklog"] != expected_backlog(i)}
        assert not wrong, f"{len(wrong)} backlogs differ, e.g. {list(wrong.items())[:5]}"
        for i in range(0, SUBS, 97):  # a sample reads everything it has not acknowledged
            upto, holes = plan(i)
            want = [ids[j] for j in range(MESSAGES) if j > upto and j not in holes]
            with again.subscribe(topic, f"s{i}") as cons:
                got = []
                while len(got) < len(want):
                    m = cons.receive(timeout=10)
                    got.append(m.message_id)
                    cons.acknowledge(m)
                assert got == want, f"subscription s{i}"
                try:
                    extra = cons.receive(timeout=0.3)
                except errors.Timeout:
                    extra = None
                assert extra is None
