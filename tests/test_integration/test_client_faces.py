"""The client's behaviours through both faces, `Client` and `AsyncClient` (the asyncio face
driven through support/faces.py's blocking wrapper), against the real broker: one test body,
two faces, the same answers, types and errors. What only the asyncio face has (cancellation,
awaiting many sends at once) is at the end."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
from support.faces import make_client
from support.waiting import nothing_more, wait_for, wait_for_async

from shadowtopic.client import DeadLetterPolicy, Message, MessageId, SeekResult
from shadowtopic.client.aio import AsyncClient
from shadowtopic.core import errors

FACES = ["sync", "async"]


@pytest.fixture(params=FACES)
def face_client(request, broker):
    c = make_client(request.param, broker.url, timeout=20)
    try:
        yield c
    finally:
        c.close()


def test_every_field_round_trips_and_acks_empty_the_backlog(face_client, topic):
    c = face_client
    c.admin.create_topic(topic)
    consumer = c.subscribe(topic, "s", consumer_type="shared", initial_position="earliest")
    with c.create_producer(topic) as p:
        first = p.send(b"\x00raw", key="k1", properties={"a": "1"}, event_time=1234)
        rest = [p.send(f"m{i}") for i in range(20)]
    assert isinstance(first, MessageId)
    assert [first, *rest] == sorted([first, *rest])
    m = consumer.receive(timeout=10)
    assert isinstance(m, Message)
    assert (m.message_id, m.payload, m.key, m.properties, m.event_time) == (
        first, b"\x00raw", b"k1", {"a": "1"}, 1234)
    consumer.acknowledge(m)
    got = consumer.batch_receive(100, timeout=5)
    while len(got) < 20:
        more = consumer.batch_receive(100, timeout=5)
        assert more, f"only {len(got)} of 20"
        got += more
    assert [x.message_id for x in got] == rest
    for x in got:
        consumer.acknowledge(x)
    wait_for(lambda: c.admin.stats(topic)["subscriptions"]["s"]["msgBacklog"] == 0, 20,
             "the backlog to reach 0")
    consumer.close()
    with pytest.raises(errors.AlreadyClosed):
        consumer.receive(timeout=1)


def test_nack_redelivers_with_a_count_and_seek_returns_a_seek_result(face_client, topic):
    c = face_client
    c.admin.create_topic(topic)
    with c.create_producer(topic) as p:
        ids = [p.send(f"m{i}") for i in range(5)]
    with c.subscribe(topic, "s", consumer_type="shared", initial_position="earliest",
                     negative_ack_redelivery_delay_ms=100) as consumer:
        got = [consumer.receive(timeout=10) for _ in ids]
        assert [m.message_id for m in got] == ids
        assert all(m.redelivery_count == 0 for m in got)
        consumer.negative_acknowledge(got[0])
        for m in got[1:]:
            consumer.acknowledge(m)
        again = consumer.receive(timeout=10)
        assert again.message_id == ids[0] and again.redelivery_count == 1
        result = consumer.seek(ids[3])
        assert isinstance(result, SeekResult)
        assert result.message_id == ids[3] and not result.clamped
        assert consumer.receive(timeout=10).message_id == ids[3]
        clamped = consumer.seek(0)  # a publish time before the first message
        assert clamped.message_id == ids[0]


def test_with_ack_receipts_an_acknowledge_returns_once_the_broker_applied_it(
        face_client, topic):
    c = face_client
    c.admin.create_topic(topic)
    with c.create_producer(topic) as p:
        ids = [p.send(f"m{i}") for i in range(3)]
    with c.subscribe(topic, "s", consumer_type="shared", initial_position="earliest",
                     ack_receipt=True) as consumer:
        assert consumer.ack_receipt is True
        for want in ids:
            m = consumer.receive(timeout=10)
            assert m.message_id == want
            consumer.acknowledge(m)
            # no waiting: the receipt came after the broker applied it
            left = len(ids) - ids.index(want) - 1
            assert c.admin.stats(topic)["subscriptions"]["s"]["msgBacklog"] == left


def test_errors_are_the_same_typed_errors(face_client, topic):
    c = face_client
    with pytest.raises(errors.TopicNotFound):
        c.create_producer(topic)
    with pytest.raises(errors.InvalidTopicName):
        c.subscribe("persistent://x/y/z/w", "s")
    with pytest.raises(errors.InvalidArgument):
        c.subscribe(topic, "s", receiver_queue_size=-1)
    c.admin.create_topic(topic)
    with pytest.raises(errors.TopicAlreadyExists):
        c.admin.create_topic(topic)
    with c.subscribe(topic, "s", consumer_type="exclusive"):
        with pytest.raises(errors.ConsumerBusy):
            c.subscribe(topic, "s", consumer_type="exclusive")
    with c.create_producer(topic) as p:
        with pytest.raises(errors.InvalidArgument):
            p.send(b"x", properties={"k": 1})


def test_unsubscribe_deletes_the_subscription_and_a_refusal_leaves_the_consumer(
        face_client, topic):
    c = face_client
    c.admin.create_topic(topic)
    a = c.subscribe(topic, "s", consumer_type="shared")
    b = c.subscribe(topic, "s", consumer_type="shared")
    with pytest.raises(errors.ConsumerBusy):
        a.unsubscribe()  # another consumer is attached
    b.close()
    a.unsubscribe()
    assert "s" not in c.admin.list_subscriptions(topic)


def test_readers_read_every_partition_and_seek(face_client, topic):
    c = face_client
    c.admin.create_topic(topic, partitions=3)
    with c.create_producer(topic) as p:
        ids = [p.send(f"m{i}", key=f"k{i}") for i in range(30)]
    with c.create_reader(topic, start="earliest") as r:
        got = [m.message_id for m in r]
        assert sorted(got) == sorted(ids)
        assert not r.has_message_available()
        with pytest.raises(errors.Timeout):
            r.read_next(timeout=0.3)
        landed = r.seek(ids[0])
        assert isinstance(landed, SeekResult) and landed.message_id == ids[0]
        assert r.read_next(timeout=10).message_id == ids[0]
        assert {m.partition for m in r.last_message_ids()} == {0, 1, 2}


def test_a_table_view_follows_updates_and_deletes(face_client, topic):
    c = face_client
    c.admin.create_topic(topic)
    with c.create_producer(topic) as p:
        p.send(b"1", key="a")
        p.send(b"2", key="b")
        with c.table_view(topic) as view:
            assert sorted(view.keys()) == ["a", "b"] and view.get("a").payload == b"1"
            changes: list[tuple[str, bytes | None]] = []
            view.for_each_and_listen(
                lambda k, m: changes.append((k, None if m is None else m.payload)))
            p.send(b"3", key="a")
            p.send(b"", key="b")  # a delete
            view.refresh(timeout=20)
            wait_for(lambda: len(changes) >= 4, 10, "the listener to hear both changes")
            assert changes == [("a", b"1"), ("b", b"2"), ("a", b"3"), ("b", None)]
            assert view.get("a").payload == b"3" and view.get("b") is None
            assert len(view) == 1 and "a" in view and "b" not in view


def test_a_grouped_listener_gets_each_message_once_for_all_its_consumers(face_client, topic):
    c = face_client
    c.admin.create_topic(topic)
    seen: list[tuple[bytes, int]] = []

    def listener(msg, recipients):
        seen.append((msg.payload, len(recipients)))
        recipients.acknowledge(msg)
    consumers = c.subscribe_many(topic, ["a", "b", "c"], message_listener=listener)
    with c.create_producer(topic) as p:
        for i in range(10):
            p.send(f"m{i}")
    wait_for(lambda: len(seen) >= 10, 20, "every message at the listener")
    assert seen == [(f"m{i}".encode(), 3) for i in range(10)]
    stats = c.admin.stats(topic)["subscriptions"]
    wait_for(lambda: all(c.admin.stats(topic)["subscriptions"][s]["msgBacklog"] == 0
                         for s in "abc"), 20, "every backlog at 0")
    assert set(stats) == {"a", "b", "c"}
    assert len(consumers) == 3


def test_a_grouped_listener_acknowledges_cumulatively_for_all(face_client, topic):
    """`recipients.acknowledge_cumulative` in a message listener, on both faces (the asyncio
    face relabels the recipients as its own consumers): every 25th message and the last
    empty both backlogs; on a Shared subscription it is refused, nothing sent."""
    c = face_client
    c.admin.create_topic(topic)
    with c.create_producer(topic) as p:
        for i in range(100):
            p.send(f"m{i}")
    seen: list[int] = []
    refusals: list[Exception] = []

    def listener(msg, recipients):
        seen.append(len(recipients))
        if len(seen) % 25 == 0:
            recipients.acknowledge_cumulative(msg)
    consumers = c.subscribe_many(topic, ["a", "b"], initial_position="earliest",
                                 message_listener=listener)
    wait_for(lambda: len(seen) >= 100, 20, "every message at the listener")
    wait_for(lambda: all(c.admin.stats(topic)["subscriptions"][s]["msgBacklog"] == 0
                         for s in "ab"), 20, "every backlog at 0")

    def on_shared(msg, recipients):
        try:
            recipients.acknowledge_cumulative(msg)
        except errors.NotAllowed as exc:
            refusals.append(exc)
    shared = c.subscribe_many(topic, ["s"], consumer_type="shared",
                              initial_position="earliest", message_listener=on_shared)
    wait_for(lambda: len(refusals) >= 100, 20, "every shared message refused")
    assert c.admin.stats(topic)["subscriptions"]["s"]["msgBacklog"] == 100
    assert len(consumers) == 2 and len(shared) == 1


def test_a_frame_listener_acknowledges_each_frame_cumulatively_for_all(face_client, topic):
    """A frame listener (both faces: the asyncio one calls it on the loop with its own
    consumers), `recipients.acknowledge_cumulative(last)`: one command per frame empties
    every backlog; refused on a Shared subscription, nothing sent."""
    c = face_client
    c.admin.create_topic(topic)
    with c.create_producer(topic) as p:
        for i in range(300):
            p.send_async(f"m{i}")
    frames: list[tuple[int, int]] = []
    refusals: list[Exception] = []

    def on_frame(messages, recipients):
        frames.append((len(messages), len(recipients)))
        recipients.acknowledge_cumulative(messages[-1])
    consumers = c.subscribe_many(topic, ["a", "b"], initial_position="earliest",
                                 frame_listener=on_frame)
    wait_for(lambda: sum(n for n, _ in frames) >= 300, 20, "every message at the listener")
    assert sum(n for n, _ in frames) == 300 and all(r == 2 for _, r in frames)
    wait_for(lambda: all(c.admin.stats(topic)["subscriptions"][s]["msgBacklog"] == 0
                         for s in "ab"), 20, "every backlog at 0")

    def on_shared(messages, recipients):
        try:
            recipients.acknowledge_cumulative(messages[-1])
        except errors.NotAllowed as exc:
            refusals.append(exc)
    shared = c.subscribe_many(topic, ["s"], consumer_type="shared",
                              initial_position="earliest", frame_listener=on_shared)
    wait_for(lambda: refusals, 20, "the shared subscription's frame")
    assert c.admin.stats(topic)["subscriptions"]["s"]["msgBacklog"] == 300
    assert len(consumers) == 2 and len(shared) == 1


def test_a_message_nacked_past_its_count_lands_in_the_dead_letter_topic_once(
        face_client, topic):
    c = face_client
    c.admin.create_topic(topic)
    with c.create_producer(topic) as p:
        poison = p.send(b"poison", key="k")
    with c.subscribe(topic, "s", initial_position="earliest",
                     negative_ack_redelivery_delay_ms=100,
                     dead_letter_policy=DeadLetterPolicy(max_redeliver_count=1)) as consumer:
        for count in (0, 1):
            m = consumer.receive(timeout=10)
            assert (m.message_id, m.redelivery_count) == (poison, count)
            consumer.negative_acknowledge(m)
        assert nothing_more(consumer, 1.0)
    with c.create_reader(f"{topic}-s-DLQ", start="earliest") as r:
        dead = list(r)
    assert [m.payload for m in dead] == [b"poison"]


# ---- the asyncio face only ------------------------------------------------------------------


def test_many_sends_awaited_together_get_every_id_in_order(broker, topic):
    async def main() -> list[MessageId]:
        async with AsyncClient(broker.url, timeout=20) as c:
            await c.admin.create_topic(topic)
            async with await c.create_producer(topic) as p:
                ids = await asyncio.gather(*(p.send(f"m{i}") for i in range(2000)))
                assert p.stats()["acked"] == 2000
            async with await c.create_reader(topic, "earliest") as r:
                read = [m.message_id async for m in r]
            assert read == ids
            return ids
    ids = asyncio.run(main())
    assert ids == sorted(ids) and len(set(ids)) == 2000


def test_cancelling_a_receive_loses_no_message_and_a_close_ends_a_waiting_one(broker, topic):
    async def main() -> None:
        async with AsyncClient(broker.url, timeout=20) as c:
            await c.admin.create_topic(topic)
            consumer = await c.subscribe(topic, "s", initial_position="earliest")
            waiting = asyncio.create_task(consumer.receive())
            await asyncio.sleep(0.3)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            async with await c.create_producer(topic) as p:
                mid = await p.send(b"after")
            got = await consumer.receive(timeout=10)  # the cancelled wait took nothing
            assert got.message_id == mid
            with pytest.raises(errors.Timeout):
                await consumer.receive(timeout=0.2)
            waiting = asyncio.create_task(consumer.receive())
            await asyncio.sleep(0.2)
            started = time.monotonic()
            await consumer.close()
            with pytest.raises(errors.AlreadyClosed):
                await asyncio.wait_for(waiting, 5)
            assert time.monotonic() - started < 5
    asyncio.run(main())


def test_cancelling_a_table_view_open_or_a_send_leaves_nothing_behind(broker, topic):
    async def main() -> None:
        async with AsyncClient(broker.url, timeout=20) as c:
            await c.admin.create_topic(topic)
            async with await c.create_producer(topic) as p:
                send = asyncio.create_task(p.send(b"v", key="k"))
                await asyncio.sleep(0)  # queued: a cancel now does not unsend it
                send.cancel()
                await p.flush()
            opening = asyncio.create_task(c.table_view(topic))
            await asyncio.sleep(0)
            opening.cancel()
            with pytest.raises(asyncio.CancelledError):
                await opening
            async with await c.table_view(topic) as view:
                assert view.get("k") is not None and view.get("k").payload == b"v"
            # the cancelled open's view was closed once its open finished: no view of the
            # topic follows it any more (each has a follower thread until closed)
            await wait_for_async(lambda: not [t for t in threading.enumerate()
                                              if t.name == f"table-view-{view.topic}"],
                                 10, "every view of the topic closed")
    asyncio.run(main())
