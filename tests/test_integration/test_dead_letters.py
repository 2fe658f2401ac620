"""The ack timeout and dead letters against a real broker, driven through the client as a
user does (docs/BEHAVIOURS.md C13, C14; the redelivery counts they rest on: C3a)."""
from __future__ import annotations

import time

from support.waiting import eventually, nothing_more, wait_for

from shadowtopic.client import Client, DeadLetterPolicy, Message
from shadowtopic.core import errors


def sub_stats(client: Client, topic: str, sub: str) -> dict:
    return client.admin.stats(topic)["subscriptions"][sub]


def dead_letters(client: Client, topic: str) -> list[Message]:
    """Everything in the dead-letter topic `topic` now (none before it exists)."""
    try:
        with client.create_reader(topic, start="earliest") as reader:
            return list(reader)
    except errors.TopicNotFound:
        return []


def produce_keyed(client: Client, topic: str, n: int) -> list:
    with client.create_producer(topic) as p:
        return [p.send(f"m{i}".encode(), key=f"k{i}", properties={"app": str(i)},
                       event_time=1_000 + i) for i in range(n)]


def test_c13_an_unacknowledged_message_comes_again_after_the_ack_timeout(client, topic):
    client.admin.create_topic(topic)
    with client.subscribe(topic, "s", "shared", initial_position="earliest",
                          ack_timeout_ms=1000) as c:
        ids = produce_keyed(client, topic, 2)
        got = [c.receive(timeout=10), c.receive(timeout=10)]
        received_at = time.monotonic()
        assert [m.message_id for m in got] == ids
        c.acknowledge(got[1])           # acked: its timer stops
        again = c.receive(timeout=10)
        waited = time.monotonic() - received_at
        assert again.message_id == ids[0] and again.redelivery_count == 1
        assert 0.9 <= waited < 5, waited
        c.acknowledge(again)
        assert nothing_more(c, 1.5)     # past another timeout: nothing comes again
        wait_for(lambda: sub_stats(client, topic, "s")["msgBacklog"] == 0, 10, "backlog 0")


def test_c14_after_n_redeliveries_the_next_nack_sends_it_to_the_dead_letter_topic(
        client, topic):
    """max_redeliver_count 2: the poison message is received three times (counts 0, 1, 2)
    and its third nack forwards it; it lands in <topic>-<subscription>-DLQ exactly once with
    its payload, key, event time and properties plus where it came from, the subscription has
    nothing left of it, and every other message was received once, uncounted."""
    client.admin.create_topic(topic)
    with client.subscribe(topic, "s", initial_position="earliest",
                          negative_ack_redelivery_delay_ms=100,
                          dead_letter_policy=DeadLetterPolicy(max_redeliver_count=2)) as c:
        ids = produce_keyed(client, topic, 5)
        poison = ids[2]
        counts: dict = {}
        deadline = time.monotonic() + 30
        for _ in range(200):
            if time.monotonic() > deadline:
                break
            try:
                m = c.receive(timeout=1)
            except errors.Timeout:
                if len(counts) == 5 and len(counts[poison]) == 3:
                    break
                continue
            counts.setdefault(m.message_id, []).append(m.redelivery_count)
            if m.message_id == poison:
                c.negative_acknowledge(m)
            else:
                c.acknowledge(m)
        assert counts[poison] == [0, 1, 2]
        others = {i: n for i, n in counts.items() if i != poison}
        # each other message once, uncounted (or twice when its ack reached the broker after
        # a rewind had sent it again: still uncounted)
        assert set(others) == set(ids) - {poison}
        assert all(n and set(n) == {0} for n in others.values()), others
        dlq = f"{topic}-s-DLQ"
        [dead] = eventually(lambda: _one(dead_letters(client, dlq)), timeout=20)
        assert (dead.payload, dead.key, dead.event_time) == (b"m2", b"k2", 1_002)
        assert dict(dead.properties) == {
            "app": "2", "REAL_TOPIC": topic, "ORIGIN_MESSAGE_ID": str(poison),
            "REAL_SUBSCRIPTION": "s", "REDELIVERY_COUNT": "2", "DEAD_LETTER_REASON": "nack"}
        wait_for(lambda: sub_stats(client, topic, "s")["msgBacklog"] == 0, 10, "backlog 0")
        assert nothing_more(c, 0.5)
    time.sleep(0.5)
    assert len(dead_letters(client, dlq)) == 1        # exactly once


def test_c14_an_ack_timeout_past_the_count_sends_it_to_the_dead_letter_topic(client, topic):
    client.admin.create_topic(topic)
    dlq = f"{topic}-dead"
    with client.subscribe(topic, "s", "shared", initial_position="earliest",
                          ack_timeout_ms=1000,
                          dead_letter_policy=DeadLetterPolicy(1, dead_letter_topic=dlq)) as c:
        ids = produce_keyed(client, topic, 1)
        first = c.receive(timeout=10)
        again = c.receive(timeout=10)   # not acknowledged: its timeout passed
        assert (first.redelivery_count, again.redelivery_count) == (0, 1)
        assert again.message_id == ids[0]
        [dead] = eventually(lambda: _one(dead_letters(client, dlq)), timeout=20)
        assert dead.properties["DEAD_LETTER_REASON"] == "ack_timeout"
        assert dead.properties["ORIGIN_MESSAGE_ID"] == str(ids[0])
        wait_for(lambda: sub_stats(client, topic, "s")["msgBacklog"] == 0, 10, "backlog 0")
        assert nothing_more(c, 1.5)


def _one(messages: list[Message]) -> list[Message]:
    assert len(messages) == 1, messages
    return messages
