"""Retry letters against a real broker, driven through the client as a user does
(docs/BEHAVIOURS.md C17; the dead letters they end in: C14): `reconsume_later` brings a
message back no earlier than its delay, acknowledges the original only once the letter is
stored, gives up to the dead-letter topic after `max_redeliver_count` retries, and a consumer
killed with kill -9 while it holds a letter leaves it to the next one, which holds it again
until it is due."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from support.waiting import eventually, nothing_more, wait_for

from shadowtopic.client import Client, DeadLetterPolicy, Message
from shadowtopic.core import errors


def backlog(client: Client, topic: str, sub: str) -> int:
    return client.admin.stats(topic)["subscriptions"][sub]["msgBacklog"]


def read_all(client: Client, topic: str) -> list[Message]:
    """Everything in `topic` now (none before it exists)."""
    try:
        with client.create_reader(topic, start="earliest") as reader:
            return list(reader)
    except errors.TopicNotFound:
        return []


def test_c17_a_message_reconsumed_later_comes_back_after_its_delay(client, topic):
    """The letter comes back no earlier than 1 s later, with RECONSUMETIMES=1 and where it
    came from; the topic's messages flow meanwhile; the original is acknowledged."""
    client.admin.create_topic(topic)
    with client.subscribe(topic, "s", "shared", initial_position="earliest",
                          retry_enable=True,
                          dead_letter_policy=DeadLetterPolicy(max_redeliver_count=3)) as c, \
            client.create_producer(topic) as p:
        first = p.send(b"m0", key="k0", properties={"app": "0"}, event_time=1_000)
        m = c.receive(timeout=10)
        assert m.message_id == first
        t0 = time.time()
        c.reconsume_later(m, 1.0, {"why": "busy"})
        second = p.send(b"m1")
        m1 = c.receive(timeout=10)                         # the topic flows meanwhile
        assert m1.message_id == second and time.time() - t0 < 1.0
        c.acknowledge(m1)
        wait_for(lambda: backlog(client, topic, "s") == 0, 10, "the original acknowledged")
        again = c.receive(timeout=10)
        waited = time.time() - t0
        assert waited >= 1.0, waited
        assert waited < 5, waited
        retry = f"{topic}-s-RETRY"
        assert again.topic == retry
        assert (again.payload, again.key, again.event_time) == (b"m0", b"k0", 1_000)
        props = dict(again.properties)
        deliver_at = int(props.pop("DELIVER_AT_TIME"))
        assert t0 * 1000 + 1000 <= deliver_at <= time.time() * 1000
        assert props == {"app": "0", "why": "busy", "RECONSUMETIMES": "1",
                         "DELAY_TIME": "1000", "REAL_TOPIC": topic,
                         "ORIGIN_MESSAGE_ID": str(first)}
        c.acknowledge(again)                               # on the retry topic
        wait_for(lambda: backlog(client, retry, "s") == 0, 10, "the letter acknowledged")
        assert nothing_more(c, 0.3)


def test_c17_after_max_redeliver_count_retries_it_lands_in_the_dead_letter_topic_once(
        client, topic):
    """max_redeliver_count 2: the message comes three times (the original and two letters,
    RECONSUMETIMES 1 and 2), and the third reconsume_later sends it to the dead-letter
    topic, once, acknowledged everywhere."""
    client.admin.create_topic(topic)
    with client.subscribe(topic, "s", "shared", initial_position="earliest",
                          retry_enable=True,
                          dead_letter_policy=DeadLetterPolicy(max_redeliver_count=2)) as c:
        with client.create_producer(topic) as p:
            origin = p.send(b"poison", key="k", event_time=7)
        seen = []
        for _ in range(3):
            m = c.receive(timeout=10)
            seen.append(m.properties.get("RECONSUMETIMES"))
            c.reconsume_later(m, 0.2)
        assert seen == [None, "1", "2"]
        dlq = f"{topic}-s-DLQ"
        [dead] = eventually(lambda: _one(read_all(client, dlq)), timeout=10)
        assert (dead.payload, dead.key, dead.event_time) == (b"poison", b"k", 7)
        assert dead.properties["DEAD_LETTER_REASON"] == "reconsume_later"
        assert dead.properties["REAL_TOPIC"] == topic
        assert dead.properties["ORIGIN_MESSAGE_ID"] == str(origin)
        assert dead.properties["RECONSUMETIMES"] == "2"
        assert nothing_more(c, 0.5)
        for t in (topic, f"{topic}-s-RETRY"):
            wait_for(lambda t=t: backlog(client, t, "s") == 0, 10, f"backlog 0 on {t}")
    assert len(read_all(client, dlq)) == 1                 # exactly once


HOLDER = """
import sys, time
from shadowtopic.client import Client, DeadLetterPolicy

url, topic = sys.argv[1:]
retry = topic + "-s-RETRY"
client = Client(url, timeout=10)
c = client.subscribe(topic, "s", "shared", initial_position="earliest", retry_enable=True,
                     dead_letter_policy=DeadLetterPolicy(3))
m = c.receive(timeout=10)
c.reconsume_later(m, 4.0)
for _ in range(100):  # the broker delivered the letter here: held, unacknowledged
    subs = client.admin.stats(retry)["subscriptions"]
    if subs["s"]["unackedMessages"] >= 1:
        break
    time.sleep(0.05)
else:
    sys.exit("the letter never came")
print("holding", flush=True)
time.sleep(60)
"""


def test_c17_a_letter_held_by_a_consumer_killed_with_kill_9_comes_again_and_is_held_again(
        client, broker, topic):
    client.admin.create_topic(topic)
    with client.create_producer(topic) as p:
        origin = p.send(b"once")
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLDER), broker.url, topic],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout is not None else ""
        if line.strip() != "holding":
            proc.kill()
            pytest.fail(f"the holder did not get its letter: {line!r} {proc.communicate()[1]}")
        proc.kill()                                        # kill -9, holding the letter
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert backlog(client, topic, "s") == 0                # acknowledged before the kill
    with client.subscribe(topic, "s", "shared", retry_enable=True,
                          dead_letter_policy=DeadLetterPolicy(3)) as c:
        asked = time.time()
        again = c.receive(timeout=10)
        returned = time.time()
        deliver_at = int(again.properties["DELIVER_AT_TIME"]) / 1000
        assert asked < deliver_at, "the restart came after the letter was due: nothing shown"
        assert returned >= deliver_at, (returned, deliver_at)   # held again until due
        assert again.properties["RECONSUMETIMES"] == "1"
        assert again.properties["ORIGIN_MESSAGE_ID"] == str(origin)
        c.acknowledge(again)
        assert nothing_more(c, 0.3)


def _one(messages: list[Message]) -> list[Message]:
    assert len(messages) == 1, messages
    return messages
