"""Reconnecting readers and consumers (source/client/reconnect.py) against the scripted
`FakeBroker` of test_client_consumer_unit: the fake ends the stream as a broker that went
away would, and the tests look at what the client subscribes again with and what it
returns: a reader resumes after the last message it returned (what it had queued comes
again); a consumer resubscribes, drops what it had buffered (the cursor sends it again) and
does not return again what it acknowledged before the break."""
from __future__ import annotations

import threading

import pytest
from support.fake_broker import FakeBroker, acked, entry, event_frame

from shadowtopic.client import MessageId, errors
from shadowtopic.client.reconnect import Reconnector
from shadowtopic.pb.v1 import common_pb2, consumer_pb2


def end_stream(fake: FakeBroker) -> None:
    """The broker's side of the newest stream ends (the client sees the stream end)."""
    fake.push(None)


def ids(msgs) -> list[tuple[int, int]]:
    return [(m.message_id.ledger_id, m.message_id.entry_id) for m in msgs]


def test_a_reader_resumes_after_the_last_message_returned_and_what_was_queued_comes_again(
        fake, client):
    """A reader is a non-durable consumer (as in Pulsar): at a reconnect it drops what it had
    queued and not returned, and subscribes again right after the last message `read_next`
    returned, so the queued ones come again: nothing lost, nothing read twice."""
    reader = client.create_reader("t", start="earliest", receiver_queue_size=10)
    first = fake.wait_for("subscribe")
    for e in range(5):  # one frame each: some stay queued
        fake.entries(first.handle, entry(1, e))
    assert ids([reader.read_next(timeout=5) for _ in range(2)]) == [(1, 0), (1, 1)]
    end_stream(fake)
    again = fake.wait_for("subscribe", count=2)
    assert again.handle != first.handle
    assert again.subscribe.topic == first.subscribe.topic
    assert not again.subscribe.subscription  # still a reader: no subscription
    assert again.subscribe.start.message_id.ledger_id == 1
    assert again.subscribe.start.message_id.entry_id == 1
    assert not again.subscribe.start_inclusive  # exclusive: 1:1 was returned
    fake.wait_for("flow", lambda c: c.handle == again.handle)
    fake.entries(again.handle, *(entry(1, e) for e in range(2, 7)))
    assert ids([reader.read_next(timeout=5) for _ in range(5)]) == [(1, e) for e in range(2, 7)]
    with pytest.raises(errors.Timeout):
        reader.read_next(timeout=0.2)
    reader.close()


def test_a_reader_that_received_nothing_resumes_where_it_was_told_to_start(fake, client):
    reader = client.create_reader("t", start=MessageId(3, 7), inclusive=True)
    fake.wait_for("subscribe")
    end_stream(fake)
    with pytest.raises(errors.Timeout):
        reader.read_next(timeout=0.3)
    again = fake.wait_for("subscribe", count=2)
    start = again.subscribe.start.message_id
    assert (start.ledger_id, start.entry_id) == (3, 7)
    assert again.subscribe.start_inclusive
    fake.wait_for("flow", lambda c: c.handle == again.handle)
    fake.entries(again.handle, entry(3, 7))
    assert ids([reader.read_next(timeout=5)]) == [(3, 7)]
    reader.close()


def test_a_reader_after_a_seek_resumes_at_the_seek_position(fake, client):
    reader = client.create_reader("t", start="earliest")
    first = fake.wait_for("subscribe")
    fake.entries(first.handle, entry(1, 0))
    assert ids([reader.read_next(timeout=5)]) == [(1, 0)]
    reader.seek("5:2")
    end_stream(fake)
    with pytest.raises(errors.Timeout):
        reader.read_next(timeout=0.3)
    start = fake.wait_for("subscribe", count=2).subscribe
    assert (start.start.message_id.ledger_id, start.start.message_id.entry_id) == (5, 2)
    assert start.start_inclusive
    reader.close()


def test_a_consumer_resubscribes_and_does_not_return_what_it_acked_again(fake, client):
    consumer = client.subscribe("t", "sub", initial_position="earliest", receiver_queue_size=10)
    first = fake.wait_for("subscribe")
    fake.entries(first.handle, entry(1, 0), entry(1, 1), entry(1, 2), entry(1, 3))
    m0 = consumer.receive(timeout=5)
    consumer.acknowledge(m0)
    assert ids([consumer.receive(timeout=5)]) == [(1, 1)]  # returned, never acknowledged
    fake.wait_for("ack", lambda c: c.handle == first.handle)
    end_stream(fake)
    again = fake.wait_for("subscribe", count=2)  # at once: the consumer's stream broke
    assert again.handle != first.handle
    assert again.subscribe.subscription == "sub"
    assert again.subscribe.type == first.subscribe.type
    fake.wait_for("flow", lambda c: c.handle == again.handle)
    # the broker delivers from the cursor again: 1:0 as if its ack had been lost
    fake.entries(again.handle, entry(1, 0), entry(1, 1), entry(1, 2), entry(1, 3))
    got = [consumer.receive(timeout=5) for _ in range(3)]
    assert ids(got) == [(1, 1), (1, 2), (1, 3)]  # 1:2, 1:3 once: the old buffer was dropped
    with pytest.raises(errors.Timeout):
        consumer.receive(timeout=0.2)
    ack_again = fake.wait_for("ack", lambda c: c.handle == again.handle)
    assert acked(ack_again.ack) == [(1, 0)]  # acked again
    consumer.close()


def test_a_consumer_ended_by_a_retriable_error_reconnects_and_a_final_one_ends_it(fake, client):
    consumer = client.subscribe("t", "sub", initial_position="earliest")
    first = fake.wait_for("subscribe")
    fake.push(_error_frame(first.handle, "TopicNotOwned"))
    again = fake.wait_for("subscribe", count=2)
    fake.push(_error_frame(again.handle, "TopicNotFound", code="NOT_FOUND"))
    with pytest.raises(errors.TopicNotFound):
        consumer.receive(timeout=5)
    consumer.close()


def _error_frame(handle: int, reason: str, code: str = "UNAVAILABLE"):
    return event_frame(handle, error=common_pb2.ErrorStatus(code=code, reason=reason,
                                                             message=reason))


class _Owner:
    """A Resumable whose attempts fail as scripted."""

    topic = "t"

    def __init__(self, failures: list):
        self.failures = failures
        self.attempts = 0
        self.gave_up = None

    def resume(self, mux, timeout):
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)

    def give_up(self, err):
        self.gave_up = err


class _Conn:
    timeout = 1.0


def test_the_reconnector_gives_up_with_the_last_error_that_was_not_a_timeout():
    done = threading.Event()
    owner = _Owner([errors.ConnectError("down")] + [errors.Timeout("slow")] * 1000)
    give_up = owner.give_up

    def record(err):
        give_up(err)
        done.set()
    owner.give_up = record
    r = Reconnector(lambda topic, timeout: (_Conn(), None), operation_timeout=0.5)
    try:
        r.start(owner)
        assert done.wait(30)
    finally:
        r.close()
    assert isinstance(owner.gave_up, errors.ConnectError)
    assert owner.attempts >= 2


def test_the_reconnector_gives_up_at_once_on_an_error_that_is_not_retriable():
    done = threading.Event()
    owner = _Owner([errors.TopicNotFound("deleted")])
    owner.give_up = lambda err: (setattr(owner, "gave_up", err), done.set())
    r = Reconnector(lambda topic, timeout: (_Conn(), None), operation_timeout=30)
    try:
        r.start(owner)
        assert done.wait(30)
    finally:
        r.close()
    assert isinstance(owner.gave_up, errors.TopicNotFound)
    assert owner.attempts == 1


def test_each_partition_reconnects_on_its_own(fake, client):
    topic = "persistent://public/default/parts"
    fake.partitions[topic] = 2
    consumer = client.subscribe(topic, "sub", initial_position="earliest")
    p0 = fake.wait_for("subscribe", lambda c: c.subscribe.topic.endswith("-partition-0"))
    p1 = fake.wait_for("subscribe", lambda c: c.subscribe.topic.endswith("-partition-1"))
    fake.push(_error_frame(p1.handle, "TopicNotOwned"))  # partition 1 moved
    again = fake.wait_for("subscribe", count=3)
    assert again.subscribe.topic == p1.subscribe.topic
    fake.wait_for("flow", lambda c: c.handle == again.handle)
    fake.entries(p0.handle, entry(1, 0))          # partition 0 never stopped
    fake.entries(again.handle, entry(2, 0))
    got = sorted((m.message_id.partition, m.message_id.ledger_id)
                 for m in [consumer.receive(timeout=5) for _ in range(2)])
    assert got == [(0, 1), (1, 2)]
    assert len(fake.commands("subscribe")) == 3  # partition 0 did not subscribe again
    consumer.close()


def test_subscribe_many_listeners_carry_on_across_a_stream_break(fake, client):
    got: list[tuple[str, tuple[int, int]]] = []
    done = threading.Event()

    def on_message(msg, recipients):
        for c in recipients:
            got.append((c.subscription_name, (msg.message_id.ledger_id,
                                              msg.message_id.entry_id)))
        recipients.acknowledge(msg)
        if len(got) >= 4:
            done.set()
    consumers = client.subscribe_many("t", ["a", "b"], message_listener=on_message)
    fake.wait_for("subscribe", count=2)
    end_stream(fake)
    a = fake.wait_for("subscribe", lambda c: c.subscribe.subscription == "a", count=2)
    b = fake.wait_for("subscribe", lambda c: c.subscribe.subscription == "b", count=2)
    fake.wait_for("flow", lambda c: c.handle == b.handle)
    fake.push(common_frame([a.handle, b.handle], entry(1, 0), entry(1, 1)))
    assert done.wait(10)
    assert sorted(got) == [("a", (1, 0)), ("a", (1, 1)), ("b", (1, 0)), ("b", (1, 1))]
    ack = fake.wait_for("ack", lambda c: c.handle in (a.handle, b.handle))
    assert set([ack.handle, *ack.also]) == {a.handle, b.handle}
    for c in consumers:
        c.close()


def common_frame(handles: list[int], *entries):
    return consumer_pb2.ServerFrame(handles=handles, entries=list(entries))


def test_an_error_right_after_the_subscribe_answer_ends_the_consumer(fake, client):
    """The broker answers the subscribe and ends the handle at once: the error reaches
    `receive` (it was dropped when it came before the subscribing thread marked the
    partition open, and `receive` then waited for nothing)."""
    def answer(cmd):
        return [event_frame(cmd.handle, subscribed=consumer_pb2.Subscribed(
                    topic=cmd.subscribe.topic, position=common_pb2.MessageIdData(ledger_id=1))),
                _error_frame(cmd.handle, "TopicNotFound", code="NOT_FOUND")]
    fake.answers["subscribe"] = answer
    consumer = client.subscribe("t", "sub", initial_position="earliest")
    with pytest.raises(errors.TopicNotFound):
        consumer.receive(timeout=5)
    consumer.close()
