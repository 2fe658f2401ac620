"""Consumers and readers reconnect by themselves (source/client/reconnect.py): across a
kill -9 and restart of their broker (same data dir, same port) a reader reads every message
exactly once and in order, a durable consumer gets every message at least once and never
again one it acknowledged, a shadow topic's consumer carries on across a restart of its
shadow broker (those two through `Client` and `AsyncClient` alike), and with the broker left
down `receive` raises a retriable typed error."""
from __future__ import annotations

import time

import pytest
from support.faces import make_client
from support.waiting import wait_cursors_saved, wait_for

from shadowtopic.client import Client
from shadowtopic.core import errors

#: the clients under test keep reconnecting this long (a restart takes a few seconds)
RECONNECT_S = 60.0


def produce(url: str, topic: str, payloads: list[str]) -> None:
    """Send `payloads` through a client of their own, opened only while the broker is up:
    the open retries (the topic loading again after a restart), a send is never repeated,
    so each payload is stored once."""
    with Client(url, timeout=20, operation_timeout=RECONNECT_S) as c:
        with c.create_producer(topic) as p:
            for text in payloads:
                p.send(text.encode())


def restart(broker) -> None:
    broker.kill()
    broker.start(timeout=60)


@pytest.mark.own_broker
def test_a_reader_reads_everything_once_in_order_across_two_kill_9_restarts(broker, topic):
    with Client(broker.url, timeout=20) as admin:
        admin.admin.create_topic(topic)
    batches = [[f"m{b}-{i}" for i in range(150)] for b in range(3)]
    produce(broker.url, topic, batches[0])
    got: list[str] = []
    ids = []
    with Client(broker.url, timeout=20, operation_timeout=RECONNECT_S) as c:
        # a small queue: at each kill some messages are buffered, some not yet delivered
        reader = c.create_reader(topic, start="earliest", receiver_queue_size=40)
        for b in range(3):
            want = sum(len(x) for x in batches[:b + 1])
            read_to = want - 60 if b < 2 else want
            while len(got) < read_to:
                m = reader.read_next(timeout=RECONNECT_S)
                got.append(m.value())
                ids.append(m.message_id)
            if b < 2:
                restart(broker)
                produce(broker.url, topic, batches[b + 1])
        assert not reader.has_message_available()
        with pytest.raises(errors.Timeout):
            reader.read_next(timeout=0.5)
        reader.close()
    assert got == [p for batch in batches for p in batch]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


@pytest.mark.own_broker
@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_durable_consumer_carries_on_across_kill_9_and_ends_with_everything_acked(
        broker, topic, face):
    total = 300
    with Client(broker.url, timeout=20) as admin:
        admin.admin.create_topic(topic)
    produce(broker.url, topic, [f"m{i}" for i in range(total)])
    seen: list[str] = []
    acked_before: set[str] = set()
    with make_client(face, broker.url, timeout=20, operation_timeout=RECONNECT_S) as c:
        consumer = c.subscribe(topic, "sub", initial_position="earliest",
                               receiver_queue_size=20)
        for _ in range(150):
            m = consumer.receive(timeout=RECONNECT_S)
            seen.append(m.value())
            consumer.acknowledge(m)
            acked_before.add(m.value())
        # received and not acknowledged: must come again after the restart
        unacked = [consumer.receive(timeout=RECONNECT_S).value() for _ in range(5)]
        seen += unacked

        def backlog() -> int:
            return c.admin.stats(topic)["subscriptions"]["sub"]["msgBacklog"]
        wait_for(lambda: backlog() == total - 150, 30, "the acks to reach the broker",
                 interval=0.2)
        wait_cursors_saved(c, topic)
        restart(broker)
        after: list[str] = []
        deadline = time.monotonic() + 3 * RECONNECT_S
        while len(set(seen) | set(after)) < total:
            assert time.monotonic() < deadline, "the consumer did not get everything"
            m = consumer.receive(timeout=RECONNECT_S)
            after.append(m.value())
            consumer.acknowledge(m)
        # what it acknowledged before the kill never came back (its acks were flushed; the
        # consumer also acknowledges again what a lost ack would have brought back)
        assert not acked_before & set(after)
        assert set(unacked) <= set(after)  # the at-least-once window
        assert set(seen) | set(after) == {f"m{i}" for i in range(total)}
        wait_for(lambda: backlog() == 0, 30, "the backlog to reach 0", interval=0.2)
        consumer.close()


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_shadow_topics_consumer_carries_on_across_a_shadow_broker_restart(
        start_pair, topic, face):
    src, sh = start_pair()
    shadow = f"{topic}-shadow"
    with Client(src.url, timeout=20) as admin:
        admin.admin.create_topic(topic)
        admin.admin.create_shadow_topic(shadow, topic)
    produce(src.url, topic, [f"m{i}" for i in range(50)])
    got: set[str] = set()
    with make_client(face, src.url, timeout=20, operation_timeout=RECONNECT_S) as c:
        consumer = c.subscribe(shadow, "audit", initial_position="earliest")
        for _ in range(50):
            m = consumer.receive(timeout=RECONNECT_S)
            got.add(m.value())
            consumer.acknowledge(m)
        restart(sh)
        produce(src.url, topic, [f"n{i}" for i in range(50)])
        want = {f"m{i}" for i in range(50)} | {f"n{i}" for i in range(50)}
        deadline = time.monotonic() + 3 * RECONNECT_S
        while not want <= got:
            assert time.monotonic() < deadline, f"missing {sorted(want - got)[:5]}"
            m = consumer.receive(timeout=RECONNECT_S)
            got.add(m.value())
            consumer.acknowledge(m)
        consumer.close()


@pytest.mark.own_broker
def test_with_the_broker_left_down_receive_and_read_next_raise_a_retriable_error(
        broker, topic):
    with Client(broker.url, timeout=20) as admin:
        admin.admin.create_topic(topic)
    produce(broker.url, topic, ["m0"])
    with Client(broker.url, timeout=5, operation_timeout=5) as c:
        consumer = c.subscribe(topic, "sub", initial_position="earliest")
        reader = c.create_reader(topic, start="earliest")
        assert consumer.receive(timeout=20).value() == "m0"
        assert reader.read_next(timeout=20).value() == "m0"
        broker.kill()
        # they keep waiting while reconnecting (the operation timeout is longer)...
        with pytest.raises(errors.Timeout):
            consumer.receive(timeout=0.5)
        with pytest.raises(errors.Timeout):
            reader.read_next(timeout=0.5)
        # ...then raise (generous bounds: they return once reconnecting gave up, ~5 s)
        with pytest.raises(errors.ShadowTopicError) as consumer_err:
            consumer.receive(timeout=120)
        with pytest.raises(errors.ShadowTopicError) as reader_err:
            reader.read_next(timeout=120)
        for err in (consumer_err.value, reader_err.value):
            assert not isinstance(err, errors.Timeout), err  # not our own receive timeout
            assert err.retriable, err
            assert any("gave up reconnecting" in n for n in getattr(err, "__notes__", ()))
        with pytest.raises(errors.ShadowTopicError):
            consumer.receive(timeout=1)  # and it stays failed
