"""The dead-letter policy and the consumer's redelivery component without a broker
(source/client/dead_letter.py, redelivery.py): the policy's checks, when a message is due,
the forward's order (send, receipt, THEN acknowledge; nack when the send fails), and what
the ack timeout asks of the consumer."""
from __future__ import annotations

import threading
import time
from types import MappingProxyType

import pytest
from support.fake_broker import acked, entry
from support.fake_producer import FakeProducer
from support.waiting import wait_for

from shadowtopic import DeadLetterPolicy as TopLevelPolicy
from shadowtopic.client import DeadLetterPolicy, Message, MessageId
from shadowtopic.client.ack_timeout import AckTimer
from shadowtopic.client.dead_letter import DeadLetters, dead_letter_properties
from shadowtopic.client.redelivery import Redelivery
from shadowtopic.core import errors


def message(entry: int, count: int = 0, partition: int = -1) -> Message:
    return Message(message_id=MessageId(5, entry, partition), topic="persistent://a/b/t",
                   payload=f"p{entry}".encode(), key=b"k", event_time=77,
                   properties=MappingProxyType({"x": "1"}), redelivery_count=count)


class Recorder:
    """What the consumer would do, in order, with an event per call."""

    def __init__(self):
        self.calls: list[tuple[str, MessageId]] = []
        self.event = threading.Event()

    def __call__(self, what):
        def record(msg, *rest):
            self.calls.append((what, msg.message_id))
            self.event.set()
        return record


def test_the_policy_checks_its_values_and_is_exported():
    assert TopLevelPolicy is DeadLetterPolicy
    p = DeadLetterPolicy(max_redeliver_count=3)
    assert p.topic_for("persistent://a/b/t", "s") == "persistent://a/b/t-s-DLQ"
    assert DeadLetterPolicy(1, "dlq").topic_for("persistent://a/b/t", "s") == \
        "persistent://public/default/dlq"
    for bad in (0, -1, 1.0, True, "3", 1 << 31):
        with pytest.raises(errors.InvalidArgument):
            DeadLetterPolicy(max_redeliver_count=bad)
    with pytest.raises(errors.InvalidArgument):
        DeadLetterPolicy(2, dead_letter_topic=5)          # type: ignore[arg-type]
    with pytest.raises(errors.InvalidTopicName):
        DeadLetterPolicy(2, dead_letter_topic="a/b/c/d/e")
    with pytest.raises(AttributeError):                   # frozen
        p.max_redeliver_count = 5                          # type: ignore[misc]


def test_the_dead_letter_copy_keeps_the_message_and_says_where_it_came_from():
    props = dead_letter_properties(message(3, count=2, partition=1), "persistent://a/b/t",
                                   "sub", "nack")
    assert props == {"x": "1", "REAL_TOPIC": "persistent://a/b/t",
                     "ORIGIN_MESSAGE_ID": "5:3:1", "REAL_SUBSCRIPTION": "sub",
                     "REDELIVERY_COUNT": "2", "DEAD_LETTER_REASON": "nack"}


def dead_letters(producer: FakeProducer, n: int = 2) -> DeadLetters:
    return DeadLetters(DeadLetterPolicy(n), "persistent://a/b/t-s-DLQ", "persistent://a/b/t",
                       "s", lambda topic: producer)


def test_a_forward_sends_then_acknowledges_and_is_not_sent_twice():
    producer = FakeProducer()
    dl = dead_letters(producer)
    rec = Recorder()
    assert not dl.due(message(1, count=1)) and dl.due(message(1, count=2))
    gate = threading.Event()
    real_send = producer.send

    def slow_send(*args, **kw):
        gate.wait(5)
        return real_send(*args, **kw)
    producer.send = slow_send                             # type: ignore[method-assign]
    dl.forward(message(1, count=2), "nack", rec("ack"), rec("nack"))
    dl.forward(message(1, count=2), "nack", rec("ack"), rec("nack"))  # under way: nothing
    gate.set()
    assert rec.event.wait(5)
    dl.close()
    assert rec.calls == [("ack", MessageId(5, 1))]
    assert len(producer.sent) == 1 and producer.closed
    payload, key, props, event_time = producer.sent[0]
    assert (payload, key, event_time) == (b"p1", b"k", 77)
    assert props["ORIGIN_MESSAGE_ID"] == "5:1" and props["x"] == "1"
    with pytest.raises(errors.AlreadyClosed):
        dl.forward(message(2, count=2), "nack", rec("ack"), rec("nack"))


def test_a_failed_send_nacks_and_acknowledges_nothing():
    dl = dead_letters(FakeProducer(fail=True))
    rec = Recorder()
    dl.forward(message(1, count=5), "ack_timeout", rec("ack"), rec("nack"))
    assert rec.event.wait(5)
    dl.close()
    assert rec.calls == [("nack", MessageId(5, 1))]


def test_a_producer_that_cannot_open_nacks():
    def cannot(topic):
        raise errors.NotAllowed("no")
    dl = DeadLetters(DeadLetterPolicy(1), "persistent://a/b/d", "persistent://a/b/t", "s",
                     cannot)
    rec = Recorder()
    dl.forward(message(1, count=1), "nack", rec("ack"), rec("nack"))
    assert rec.event.wait(5)
    dl.close()
    assert rec.calls == [("nack", MessageId(5, 1))]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def redelivery(ack_timeout_ms: int, dl: DeadLetters | None, rec: Recorder, clock: Clock,
               current=lambda msg, epoch: epoch == 0) -> tuple[Redelivery, AckTimer]:
    timer = AckTimer()
    timer.register = lambda tick: 1                      # type: ignore[method-assign]
    timer.wake = lambda: None                            # type: ignore[method-assign]
    timer.unregister = lambda tick_id: None              # type: ignore[method-assign]
    r = Redelivery(ack_timeout_ms, dl, timer, again=rec("again"), current=current,
                   settle=rec("ack"), retry=rec("nack"), clock=clock)
    return r, timer


def test_the_ack_timeout_asks_again_for_what_was_neither_acked_nor_dropped():
    rec, clock = Recorder(), Clock()
    r, _ = redelivery(1000, None, rec, clock)
    r.received(message(0), epoch=0)
    r.received(message(1), epoch=0)
    r.received(message(2, partition=3), epoch=0)
    r.received(message(3), epoch=0)
    r.received(message(4), epoch=1)                      # received after a seek...
    clock.now = 0.5
    r.received(message(5), epoch=0)
    r.acked(-1, MessageId(5, 1))                          # acknowledged: no timer
    r.acked_upto(3, MessageId(5, 9))                      # cumulative on partition 3
    assert r.nacked(-1, MessageId(5, 3), None) is False   # nacked: comes again anyway
    assert r.tick(0.99) == 1.0
    assert rec.calls == []
    assert r.tick(1.0) == 1.5
    # 4 is asked for too: whether it is current is the consumer's `again` to check
    assert rec.calls == [("again", MessageId(5, 0)), ("again", MessageId(5, 4))]
    r.dropped()                                           # redeliver-all: every timer stops
    assert r.tick(5.0) is None and len(rec.calls) == 2
    r.close()
    r.received(message(6), epoch=0)
    assert r.tick(100.0) is None


def test_past_its_count_a_nack_or_an_ack_timeout_forwards_instead():
    rec, clock = Recorder(), Clock()
    producer = FakeProducer()
    r, _ = redelivery(1000, dead_letters(producer, n=2), rec, clock)
    r.received(message(1, count=1), epoch=0)
    assert r.nacked(-1, MessageId(5, 1), message(1, count=1)) is False  # not yet: comes again
    r.received(message(2, count=2), epoch=0)
    assert r.nacked(-1, MessageId(5, 2), None) is True    # by id alone: the held message
    r.received(message(3, count=2), epoch=0)
    r.received(message(4, count=2), epoch=1)              # dropped since (not current)
    r.tick(2.0)
    wait_for(lambda: len(rec.calls) == 2, 5, "both forwards")
    r.close()
    assert sorted(rec.calls) == [("ack", MessageId(5, 2)), ("ack", MessageId(5, 3))]
    reasons = {p[2]["ORIGIN_MESSAGE_ID"]: p[2]["DEAD_LETTER_REASON"] for p in producer.sent}
    assert reasons == {"5:2": "nack", "5:3": "ack_timeout"} and producer.closed


# ---- wired into a consumer (the fake broker) ------------------------------------------------

def test_a_consumer_forwards_a_message_nacked_past_its_count_then_acknowledges_it(fake,
                                                                                  client):
    c = client.subscribe("t", "sub", "shared", dead_letter_policy=DeadLetterPolicy(2))
    h = c._handles.by_index[-1].handle
    fake.entries(h, entry(1, 0, redelivery_count=2), entry(1, 1, redelivery_count=1))
    m0, m1 = c.receive(timeout=5), c.receive(timeout=5)
    c.negative_acknowledge(m1)                            # count 1 < 2: asked for again
    nack = fake.wait_for("nack")
    assert [(i.ledger_id, i.entry_id) for i in nack.nack.ids] == [(1, 1)]
    c.negative_acknowledge(m0)                            # count 2: to the dead-letter topic
    ack = fake.wait_for("ack")
    assert acked(ack.ack) == [(1, 0)]
    assert [r.topic for name, r in fake.admin_calls if name == "CreateTopicRequest"] == \
        ["persistent://public/default/t-sub-DLQ"]
    [batch] = fake.produced
    [copy] = batch.messages
    assert copy.payload == m0.payload and copy.properties["ORIGIN_MESSAGE_ID"] == "1:0"
    assert copy.properties["REAL_TOPIC"] == "persistent://public/default/t"
    fake.sync(client)
    assert len(fake.commands("nack")) == 1                # the forwarded one was not nacked
    c.close()


def test_the_ack_timeout_nacks_what_was_received_and_not_acknowledged(fake, client):
    c = client.subscribe("t", "sub", ack_timeout_ms=1000)
    h = c._handles.by_index[-1].handle
    fake.entries(h, entry(1, 0), entry(1, 1))
    m0, m1 = c.receive(timeout=5), c.receive(timeout=5)
    c.acknowledge(m1)
    nack = fake.wait_for("nack", timeout=5)
    assert [(i.ledger_id, i.entry_id) for i in nack.nack.ids] == [(1, 0)]
    assert nack.nack.delay_ms == 0
    assert m0.message_id.entry_id == 0
    fake.entries(h, entry(1, 2))
    c.receive(timeout=5)
    c.seek("1:0")                                         # drops what was received: no timer
    fake.sync(client)
    before = len(fake.commands("nack"))
    time.sleep(1.3)                                       # past the timeout of 1:2
    fake.sync(client)
    assert len(fake.commands("nack")) == before
    c.close()


def test_bad_options_are_refused_before_anything_is_sent(fake, client):
    for bad in (500, 999, -1, "1000", 1.5):
        with pytest.raises(errors.InvalidArgument):
            client.subscribe("t", "s", ack_timeout_ms=bad)
    for policy in (3, {"max_redeliver_count": 3}):
        with pytest.raises(errors.InvalidArgument):
            client.subscribe("t", "s", dead_letter_policy=policy)
    with pytest.raises(errors.InvalidTopicName):  # the default name would be too long
        client.subscribe("t" * 150, "s" * 100, dead_letter_policy=DeadLetterPolicy(1))
    assert fake.admin_counts == {} and fake.commands() == []
