"""Producer limits and publisher stats."""
from __future__ import annotations

import time

import pytest

from shadowtopic.client import Client, Policies
from shadowtopic.core import errors


def test_max_producers_refuses_the_extra_producer_and_stats_list_publishers(broker, client,
                                                                            topic):
    client.admin.create_topic(topic, policies=Policies(max_producers=1))
    with Client(broker.url) as c1, Client(broker.url) as c2:
        first = c1.create_producer(topic, producer_name="first")
        assert first.send(b"a").entry_id == 0
        second = c2.create_producer(topic, producer_name="second")
        with pytest.raises(errors.TooManyProducers) as info:
            second.send(b"b")
        assert info.value.code.name == "RESOURCE_EXHAUSTED"
        pubs = client.admin.stats(topic)["publishers"]
        assert [p["producerName"] for p in pubs] == ["first"]
        first.close()
        c1.close()
        deadline = time.monotonic() + 10
        while client.admin.stats(topic)["publishers"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.admin.stats(topic)["publishers"] == []
        assert second.send(b"c").entry_id == 1
        second.close()
    with client.create_reader(topic) as r:
        assert [r.read_next(5).payload for _ in range(2)] == [b"a", b"c"]


@pytest.mark.own_broker
def test_same_producer_recovers_after_broker_restart(broker, client, topic):
    client.admin.create_topic(topic)
    with Client(broker.url, timeout=10) as c:
        p = c.create_producer(topic)
        first = p.send(b"before")
        broker.terminate()
        with pytest.raises(errors.ShadowTopicError) as info:
            p.send(b"while-down", timeout=5)
        assert info.value.retriable
        broker.start(timeout=60)
        deadline = time.monotonic() + 30
        while True:
            try:
                after = p.send(b"after", timeout=5)
                break
            except errors.ShadowTopicError as exc:
                assert exc.retriable, exc
                assert time.monotonic() < deadline, "producer did not reconnect"
                time.sleep(0.2)
        assert after.ledger_id > first.ledger_id
        p.close()
    # the send that timed out while the broker was down stayed queued in the producer and was
    # resent once it reconnected: stored once, in order (a send that raised `Timeout` before
    # the operation timeout is unknown, not failed: docs/CLIENT.md, "Idempotent producing")
    with Client(broker.url) as c, c.create_reader(topic) as r:
        got = [r.read_next(15).payload for _ in range(3)]  # (a loaded CI machine: slow)
        assert got == [b"before", b"while-down", b"after"]
        assert not r.has_message_available()


def test_producer_stats_count_acked_and_failed(client, topic):
    client.admin.create_topic(topic, policies=Policies(max_message_size=1000))
    with client.create_producer(topic, batch_max_messages=10) as p:
        for _ in range(25):
            p.send_async(b"ok")
        p.flush()
        assert p.stats() == {"sent": 25, "acked": 25, "failed": 0, "pending_batches": 0}
        for i in range(10):  # one batch of 10 with one oversized message: all 10 refused
            p.send_async(b"x" * (2000 if i == 5 else 10))
        p.flush()
        assert p.stats() == {"sent": 35, "acked": 25, "failed": 10, "pending_batches": 0}
