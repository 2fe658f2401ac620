"""kill -9 of a broker whose 1,000 subscriptions share cursors in cohorts
(source/subscriptions/cohorts.py): one grouped listener acknowledges each message for all of
them, then for a part of them (cohorts split), then cumulatively for some (they meet again).
After the acks are saved the broker is killed; after the restart every subscription's
cursor is exact (its backlog, and a sample reads exactly what it did not acknowledge), and
equal cursors load as one cohort again."""
from __future__ import annotations

import threading

import pytest
from support.waiting import wait_cursors_saved, wait_for

from shadowtopic.client import Client
from shadowtopic.core import errors

SUBS = 1000
MESSAGES = 60


def acked_by(i: int, j: int) -> bool:
    """Whether subscription i acknowledges message j individually."""
    if j < 20:
        return True                   # all of them: the cohort moves as one
    if j < 40:
        return i % 4 != j % 4         # three in four: splits, with holes
    return i % 2 == 0                 # half of them move on


def cumulative(i: int) -> bool:
    """Subscription i also acknowledges cumulatively up to message 49 at the end."""
    return i % 10 == 3


def acked_set(i: int) -> set[int]:
    out = {j for j in range(MESSAGES) if acked_by(i, j)}
    if cumulative(i):
        out |= set(range(50))
    return out


@pytest.mark.own_broker
def test_cohorts_of_1000_subscriptions_survive_kill_9_exactly(broker, client, topic):
    client.admin.create_topic(topic)
    names = [f"s{i}" for i in range(SUBS)]
    index = {n: i for i, n in enumerate(names)}
    seen: dict[int, int] = {}
    done = threading.Event()
    lock = threading.Lock()
    ids: dict[int, object] = {}

    def listener(message, recipients):
        j = int(message.payload[1:])
        ids[j] = message.message_id
        some = [c for c in recipients if acked_by(index[c.subscription_name], j)]
        recipients.acknowledge(message, some)
        with lock:
            seen[j] = seen.get(j, 0) + len(recipients)
            if len(seen) == MESSAGES and all(n == SUBS for n in seen.values()):
                done.set()

    with Client(broker.url, timeout=60) as c:
        consumers = c.subscribe_many(topic, names, initial_position="earliest",
                                     message_listener=listener)
        with client.create_producer(topic) as p:
            for j in range(MESSAGES):
                p.send(f"m{j}".encode())
        assert done.wait(60), f"deliveries: {sorted(seen.items())[:5]}"
        last = ids[49]
        for cons in consumers:
            if cumulative(index[cons.subscription_name]):
                cons.acknowledge_cumulative(last)

        def arrived() -> bool:
            subs = client.admin.stats(topic)["subscriptions"]
            return all(subs[n]["msgBacklog"] == MESSAGES - len(acked_set(i))
                       for i, n in enumerate(names))
        wait_for(arrived, 60, "every acknowledgement to arrive")
        before = client.admin.internal_stats(topic)["cursors"]
        wait_cursors_saved(client, topic)
        broker.kill()
    # before the kill: the cumulative acks met in one cohort
    assert {int(before[n]["cohortSize"]) for i, n in enumerate(names) if cumulative(i)} \
        == {SUBS // 10}
    broker.start(timeout=60)
    with Client(broker.url, timeout=60) as again:
        subs = again.admin.stats(topic)["subscriptions"]
        wrong = {n: subs[n]["msgBacklog"] for i, n in enumerate(names)
                 if subs[n]["msgBacklog"] != MESSAGES - len(acked_set(i))}
        assert not wrong, f"{len(wrong)} backlogs differ, e.g. {list(wrong.items())[:5]}"
        # equal cursors without holes load as one cohort again: those acknowledged up to
        # message 49 cumulatively
        cursors = again.admin.internal_stats(topic)["cursors"]
        sizes = {int(cursors[n]["cohortSize"]) for i, n in enumerate(names) if cumulative(i)}
        assert sizes == {SUBS // 10}
        for i in range(0, SUBS, 111):  # a sample reads exactly what it did not acknowledge
            want = [j for j in range(MESSAGES) if j not in acked_set(i)]
            with again.subscribe(topic, names[i]) as cons:
                got = []
                while len(got) < len(want):
                    m = cons.receive(timeout=10)
                    got.append(int(m.payload[1:]))
                    cons.acknowledge(m)
                assert got == want, names[i]
                try:
                    extra = cons.receive(timeout=0.3)
                except errors.Timeout:
                    extra = None
                assert extra is None
