"""Retry letters without a broker (source/client/retry_letter.py): the policy's names, the
letter's properties, the hold heap, `RetryLetters` over a scripted retry consumer (held until
due, woken, bounded, the order send -> receipt -> acknowledge, past the count to the
dead-letter topic), and the consumer wired to the fake broker (docs/BEHAVIOURS.md C17)."""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from types import MappingProxyType

import pytest
from support.fake_broker import acked, entry
from support.fake_producer import FakeProducer
from support.waiting import wait_for

from shadowtopic.client import DeadLetterPolicy, Message, MessageId
from shadowtopic.client.dead_letter import DeadLetters, dead_letter_properties
from shadowtopic.client.retry_letter import (
    MAX_DELAY_S,
    HoldHeap,
    RetryLetters,
    check_delay,
    check_properties,
    due_at,
    reconsume_times,
    retry_properties,
)
from shadowtopic.core import errors
from shadowtopic.pb.v1 import common_pb2

TOPIC = "persistent://a/b/t"
RETRY = "persistent://a/b/t-s-RETRY"


def message(entry_id: int, topic: str = TOPIC, props: dict | None = None, ledger: int = 5,
            partition: int = -1, count: int = 0) -> Message:
    return Message(message_id=MessageId(ledger, entry_id, partition), topic=topic,
                   payload=f"p{entry_id}".encode(), key=b"k", event_time=77,
                   properties=MappingProxyType(props if props is not None else {"x": "1"}),
                   redelivery_count=count)


def letter(entry_id: int, deliver_at_ms: int | None, times: int = 1) -> Message:
    props = {"x": "1", "RECONSUMETIMES": str(times), "REAL_TOPIC": TOPIC,
             "ORIGIN_MESSAGE_ID": "5:0"}
    if deliver_at_ms is not None:
        props["DELIVER_AT_TIME"] = str(deliver_at_ms)
    return message(entry_id, RETRY, props, ledger=8)


# ---- names, checks, properties ---------------------------------------------------------------

def test_the_policy_names_the_retry_topic_as_pulsar_does():
    p = DeadLetterPolicy(3)
    assert p.retry_letter_topic is None
    assert p.retry_topic_for(TOPIC, "s") == RETRY
    assert p.topic_for(TOPIC, "s") == "persistent://a/b/t-s-DLQ"
    assert DeadLetterPolicy(3, retry_letter_topic="r").retry_topic_for(TOPIC, "s") == \
        "persistent://public/default/r"
    with pytest.raises(errors.InvalidArgument):
        DeadLetterPolicy(3, retry_letter_topic=7)         # type: ignore[arg-type]
    with pytest.raises(errors.InvalidTopicName):
        DeadLetterPolicy(3, retry_letter_topic="a/b/c/d/e")


@pytest.mark.parametrize("good", [0, 0.001, 1, 2.5, MAX_DELAY_S])
def test_delays_in_range_are_taken_as_seconds(good):
    assert check_delay(good) == float(good)


@pytest.mark.parametrize("bad", [-0.001, -1, math.nan, math.inf, MAX_DELAY_S + 1, True, "1",
                                 None])
def test_bad_delays_are_invalid_arguments(bad):
    with pytest.raises(errors.InvalidArgument):
        check_delay(bad)


def test_properties_map_text_to_text():
    assert check_properties(None) == {}
    assert check_properties(MappingProxyType({"a": "b"})) == {"a": "b"}
    for bad in ({"a": 1}, {1: "a"}, ["a"], "a=b"):
        with pytest.raises(errors.InvalidArgument):
            check_properties(bad)


def test_reconsume_times_counts_from_one():
    assert reconsume_times(message(0)) == 1
    assert reconsume_times(message(0, props={"RECONSUMETIMES": "1"})) == 2
    assert reconsume_times(message(0, props={"RECONSUMETIMES": "41"})) == 42
    assert reconsume_times(message(0, props={"RECONSUMETIMES": "x"})) == 1
    assert reconsume_times(message(0, props={"RECONSUMETIMES": "-3"})) == 1


def test_a_first_letter_says_where_it_came_from_and_when_it_is_due():
    props = retry_properties(message(3, partition=2), TOPIC, 1, 1500, 10_000,
                             {"why": "busy", "RECONSUMETIMES": "99"}, letter=False)
    assert props == {"x": "1", "why": "busy", "REAL_TOPIC": TOPIC,
                     "ORIGIN_MESSAGE_ID": "5:3:2", "RECONSUMETIMES": "1",
                     "DELAY_TIME": "1500", "DELIVER_AT_TIME": "10000"}


def test_a_letter_given_back_again_keeps_its_origin():
    again = retry_properties(letter(4, 1000), TOPIC, 2, 10, 2000, {}, letter=True)
    assert (again["REAL_TOPIC"], again["ORIGIN_MESSAGE_ID"]) == (TOPIC, "5:0")
    assert (again["RECONSUMETIMES"], again["DELAY_TIME"], again["DELIVER_AT_TIME"]) == \
        ("2", "10", "2000")
    # a message of the topic that merely carries such names is its own origin
    mine = retry_properties(message(1, props={"REAL_TOPIC": "elsewhere",
                                              "ORIGIN_MESSAGE_ID": "1:1"}),
                            TOPIC, 1, 0, 0, {}, letter=False)
    assert (mine["REAL_TOPIC"], mine["ORIGIN_MESSAGE_ID"]) == (TOPIC, "5:1")


def test_a_dead_letter_of_a_letter_keeps_its_origin():
    props = dead_letter_properties(letter(4, 1000, times=3), RETRY, "s", "reconsume_later",
                                   {"why": "x"}, keep_origin=True)
    assert props["REAL_TOPIC"] == TOPIC and props["ORIGIN_MESSAGE_ID"] == "5:0"
    assert props["RECONSUMETIMES"] == "3" and props["why"] == "x"
    assert props["DEAD_LETTER_REASON"] == "reconsume_later"
    plain = dead_letter_properties(letter(4, 1000), RETRY, "s", "nack")
    assert plain["REAL_TOPIC"] == RETRY and plain["ORIGIN_MESSAGE_ID"] == "8:4"


def test_due_times_come_from_the_letter_on_the_receivers_clock():
    assert due_at(letter(0, 12_500), now=100.0, wall_s=10.0) == pytest.approx(102.501)
    assert due_at(letter(0, 9_000), now=100.0, wall_s=10.0) == 100.0     # past: now
    assert due_at(letter(0, None), now=100.0, wall_s=10.0) == 100.0      # none: now
    assert due_at(message(0, props={"DELIVER_AT_TIME": "soon"}), 100.0, 10.0) == 100.0


def test_the_hold_heap_gives_letters_back_earliest_first_once_each():
    h = HoldHeap()
    assert h.next_due() is None and h.pop_due(1e9) == []
    assert h.add(letter(1, 0), 3.0) and h.add(letter(2, 0), 1.0) and h.add(letter(3, 0), 2.0)
    assert h.add(letter(4, 0), 2.0)                        # a tie: arrival order
    assert not h.add(letter(1, 0), 0.5)                    # held already: unchanged
    assert len(h) == 4 and (8, 1) in h and h.next_due() == 1.0
    assert h.pop_due(0.99) == []
    assert [m.message_id.entry_id for m in h.pop_due(2.0)] == [2, 3, 4]
    assert h.next_due() == 3.0 and len(h) == 1
    h.clear()
    assert len(h) == 0 and h.next_due() is None


# ---- RetryLetters over a scripted retry consumer ------------------------------------------------

class FakeRetryConsumer:
    def __init__(self):
        self.inbox: deque[Message] = deque()
        self.wakers: list = []
        self.calls: list[tuple[str, object]] = []
        self.error: errors.ShadowTopicError | None = None

    def deliver(self, *msgs: Message) -> None:
        self.inbox.extend(msgs)
        wakers, self.wakers = self.wakers, []
        for wake in wakers:
            wake()

    def poll(self, wake=None):
        if self.error is not None:
            raise self.error
        if self.inbox:
            return self.inbox.popleft()
        if wake is not None:
            self.wakers.append(wake)
        return None

    def partitions(self):
        return [(RETRY, -1)]

    def acknowledge(self, message):
        self.calls.append(("ack", message.message_id))

    def acknowledge_async(self, message, callback):
        self.calls.append(("ack", message.message_id))

    def negative_acknowledge(self, message):
        self.calls.append(("nack", message.message_id))

    def redeliver_unacknowledged_messages(self):
        self.calls.append(("redeliver", None))

    def unsubscribe(self):
        self.calls.append(("unsubscribe", None))

    def close(self):
        self.calls.append(("close", None))


class FakeTimer:
    def __init__(self):
        self.ticks: dict[int, object] = {}
        self.wakes = 0

    def register(self, tick):
        self.ticks[1] = tick
        return 1

    def unregister(self, tick_id):
        self.ticks.pop(tick_id, None)

    def wake(self):
        self.wakes += 1


class Setup:
    def __init__(self, n: int = 2, hold_limit: int = 100, fail: bool = False):
        self.log: list = []
        self.consumer = FakeRetryConsumer()
        self.timer = FakeTimer()
        self.retry_producer = FakeProducer(self.log, fail)
        self.dead_producer = FakeProducer(self.log, fail)
        self.dead = DeadLetters(DeadLetterPolicy(n), "persistent://a/b/t-s-DLQ", TOPIC, "s",
                                lambda topic: self.dead_producer, keep_origin=True)
        self.wall = 1000.0
        self.notified = 0
        self.letters = RetryLetters(self.consumer, RETRY, TOPIC, self.dead,
                                    lambda topic: self.retry_producer, self.timer, hold_limit,
                                    clock=lambda: 0.0, wall=lambda: self.wall)
        self.letters.start(self.notify)

    def notify(self):
        self.notified += 1

    def ack(self, msg):
        self.log.append(("ack", msg.message_id))

    def nack(self, msg):
        self.log.append(("nack", msg.message_id))


def test_letters_are_held_until_due_then_returned_and_the_consumer_woken():
    s = Setup()
    assert s.timer.ticks                                  # registered by start
    letters = s.letters
    assert letters.tick(0.0) is None and letters.take() is None
    assert len(s.consumer.wakers) == 1                    # a waker left with the retry consumer
    # due at wall 1002 and 1001: on the monotonic clock, 2.0 and 1.0 from now (0.0), plus
    # the millisecond that keeps a letter late rather than early (due_at)
    s.consumer.deliver(letter(1, 1_002_000), letter(2, 1_001_000))
    assert s.timer.wakes == 1                             # the waker woke the timer
    assert letters.tick(0.0) == pytest.approx(1.001)
    assert letters.tick(1.0) == pytest.approx(1.001)      # not yet: a millisecond early
    assert letters.take() is None and s.notified == 0
    assert letters.tick(1.001) == pytest.approx(2.001) and s.notified == 1
    assert letters.take().message_id.entry_id == 2
    assert letters.take() is None
    assert letters.tick(2.5) is None and s.notified == 2
    assert letters.take().message_id.entry_id == 1
    letters.close()
    assert ("close", None) in s.consumer.calls and not s.timer.ticks


def test_a_letter_that_comes_again_while_held_or_due_is_returned_once():
    s = Setup()
    letters = s.letters
    s.consumer.deliver(letter(1, 1_005_000), letter(2, 0))
    letters.tick(0.0)
    s.consumer.deliver(letter(1, 1_005_000), letter(2, 0))   # a reconnect sent them again
    letters.tick(0.0)
    assert [letters.take().message_id.entry_id, letters.take()] == [2, None]
    letters.tick(10.0)
    assert [letters.take().message_id.entry_id, letters.take()] == [1, None]
    letters.close()


def test_at_most_the_hold_limit_is_taken_from_the_retry_consumer():
    s = Setup(hold_limit=2)
    letters = s.letters
    s.consumer.deliver(letter(1, 1_009_000), letter(2, 0), letter(3, 0))
    letters.tick(0.0)
    assert len(s.consumer.inbox) == 1                     # left there: its permits stop
    wakes = s.timer.wakes
    assert letters.take().message_id.entry_id == 2
    assert s.timer.wakes == wakes + 1                     # room again: tick soon
    letters.tick(0.0)
    assert letters.take().message_id.entry_id == 3 and not s.consumer.inbox
    letters.close()


def test_the_retry_consumers_end_is_raised_by_take():
    s = Setup()
    s.consumer.error = errors.TopicNotFound("gone")
    s.letters.tick(0.0)
    assert s.notified == 1
    with pytest.raises(errors.TopicNotFound):
        s.letters.take()
    s.letters.close()


def test_letters_are_told_apart_by_topic_or_by_the_ids_returned():
    s = Setup()
    letters = s.letters
    assert letters.owns(letter(1, 0)) and not letters.owns(message(1))
    assert not letters.owns(MessageId(8, 1)) and not letters.owns("8:1")
    s.consumer.deliver(letter(1, 0))
    letters.tick(0.0)
    letters.take()
    assert letters.owns(MessageId(8, 1)) and letters.owns("8:1")
    assert not letters.owns(MessageId(5, 1)) and not letters.owns("junk")
    assert letters.owns(MessageId(8, 1), settle=True)
    assert not letters.owns(MessageId(8, 1))              # acknowledged: no longer returned
    letters.close()


def test_reconsume_later_sends_then_acknowledges():
    s = Setup()
    s.letters.reconsume_later(message(3), 1.5, {"why": "busy"}, s.ack, s.nack)
    assert s.log == [("sent", "5:3"), ("ack", MessageId(5, 3))]
    [(payload, key, props, event_time)] = s.retry_producer.sent
    assert (payload, key, event_time) == (b"p3", b"k", 77)
    assert props == {"x": "1", "why": "busy", "REAL_TOPIC": TOPIC, "ORIGIN_MESSAGE_ID": "5:3",
                     "RECONSUMETIMES": "1", "DELAY_TIME": "1500",
                     "DELIVER_AT_TIME": "1001500"}
    # a letter given back: the next count, its origin kept
    s.letters.reconsume_later(letter(4, 0, times=1), 0, None, s.ack, s.nack)
    props = s.retry_producer.sent[1][2]
    assert (props["RECONSUMETIMES"], props["ORIGIN_MESSAGE_ID"]) == ("2", "5:0")
    assert s.log[-1] == ("ack", MessageId(8, 4))
    s.letters.close()
    assert s.retry_producer.closed


def test_past_the_count_reconsume_later_sends_to_the_dead_letter_topic_then_acknowledges():
    s = Setup(n=2)
    s.letters.reconsume_later(letter(6, 0, times=2), 1, {"why": "x"}, s.ack, s.nack)
    assert s.retry_producer.sent == []
    assert s.log == [("sent", "5:0"), ("ack", MessageId(8, 6))]
    [(payload, _key, props, _t)] = s.dead_producer.sent
    assert payload == b"p6"
    assert props["DEAD_LETTER_REASON"] == "reconsume_later"
    assert (props["REAL_TOPIC"], props["RECONSUMETIMES"], props["why"]) == (TOPIC, "2", "x")
    s.letters.close()


def test_a_failed_send_nacks_and_raises_and_a_bad_call_sends_nothing():
    s = Setup(fail=True)
    with pytest.raises(errors.Timeout):
        s.letters.reconsume_later(message(3), 1, None, s.ack, s.nack)
    assert s.log == [("nack", MessageId(5, 3))]
    for bad in ((MessageId(5, 3), 1, None), (message(3), -1, None),
                (message(3), math.nan, None), (message(3), 1, {"a": 2})):
        with pytest.raises(errors.InvalidArgument):
            s.letters.reconsume_later(*bad, s.ack, s.nack)
    assert s.log == [("nack", MessageId(5, 3))]
    s.letters.close()
    with pytest.raises(errors.AlreadyClosed):
        s.letters.reconsume_later(message(3), 1, None, s.ack, s.nack)


def test_redeliver_drops_what_is_held():
    s = Setup()
    s.consumer.deliver(letter(1, 1_009_000), letter(2, 0))
    s.letters.tick(0.0)
    s.letters.redeliver()
    assert s.letters.take() is None and s.letters.tick(100.0) is None
    assert ("redeliver", None) in s.consumer.calls
    s.letters.close()


# ---- wired into a consumer (the fake broker) ------------------------------------------------

def letter_entry(ledger: int, entry_id: int, props: dict) -> common_pb2.EncodedEntry:
    msg = common_pb2.Message(payload=b"again", key=b"k", properties=props, event_time=5)
    return common_pb2.EncodedEntry(ledger_id=ledger, entry_id=entry_id, publish_time=1,
                                   raw=msg.SerializeToString())


def test_retry_enable_needs_a_dead_letter_policy_and_checks_before_sending(fake, client):
    for bad in (1, "yes", None):
        with pytest.raises(errors.InvalidArgument):
            client.subscribe("t", "s", dead_letter_policy=DeadLetterPolicy(1),
                             retry_enable=bad)
    with pytest.raises(errors.InvalidArgument):
        client.subscribe("t", "s", retry_enable=True)
    with pytest.raises(errors.InvalidArgument):  # the retry topic is the topic
        client.subscribe("t", "s", retry_enable=True,
                         dead_letter_policy=DeadLetterPolicy(1, retry_letter_topic="t"))
    assert fake.admin_counts == {} and fake.commands() == []
    with client.subscribe("t", "s") as c, pytest.raises(errors.NotAllowed):
        c.reconsume_later(c, 1)                   # type: ignore[arg-type]
    # a topic that does not exist: no retry topic is made for it
    fake.admin_errors["GetTopicMetadata"] = [errors.TopicNotFound("no t")]
    with pytest.raises(errors.TopicNotFound):
        client.subscribe("t", "s2", retry_enable=True, dead_letter_policy=DeadLetterPolicy(1))
    assert fake.admin_counts.get("CreateTopic") is None


def test_a_consumer_reads_its_retry_topic_and_holds_a_letter_until_due(fake, client):
    c = client.subscribe("t", "sub", "shared", retry_enable=True,
                         dead_letter_policy=DeadLetterPolicy(3))
    assert [r.topic for name, r in fake.admin_calls if name == "CreateTopicRequest"] == \
        ["persistent://public/default/t-sub-RETRY"]
    subs = {s.subscribe.topic: s for s in fake.commands("subscribe")}
    retry = subs["persistent://public/default/t-sub-RETRY"]
    assert retry.subscribe.subscription == "sub" and retry.subscribe.start.HasField("earliest")
    h = c._handles.by_index[-1].handle
    rh = retry.handle
    fake.entries(h, entry(1, 0))
    m = c.receive(timeout=5)
    before = time.time()
    c.reconsume_later(m, 0.6, {"why": "later"})
    [batch] = fake.produced
    [copy] = batch.messages
    props = dict(copy.properties)
    assert props["RECONSUMETIMES"] == "1" and props["ORIGIN_MESSAGE_ID"] == "1:0"
    assert props["why"] == "later" and props["DELAY_TIME"] == "600"
    assert acked(fake.wait_for("ack", lambda cmd: cmd.handle == h).ack) == [(1, 0)]
    # the broker delivers the letter at once; the consumer holds it until it is due
    fake.entries(rh, letter_entry(7, 0, props))
    fake.entries(h, entry(1, 1))                           # the topic flows meanwhile
    assert c.receive(timeout=5).message_id == MessageId(1, 1)
    got = c.receive(timeout=5)
    waited = time.time() - before
    assert got.topic == "persistent://public/default/t-sub-RETRY" and waited >= 0.59, waited
    assert got.properties["RECONSUMETIMES"] == "1"
    c.acknowledge(got)                                     # to the retry topic's handle
    assert acked(fake.wait_for("ack", lambda cmd: cmd.handle == rh).ack) == [(7, 0)]
    with pytest.raises(errors.NotAllowed):
        c.acknowledge_cumulative(got)
    c.negative_acknowledge(got)
    assert fake.wait_for("nack", lambda cmd: cmd.handle == rh)
    fake.sync(client)
    assert not fake.commands("nack", h)
    c.close()
    wait_for(lambda: len(fake.commands("close")) == 2, 5, "both handles closed")


def test_the_asyncio_consumer_is_woken_by_a_letter_that_falls_due(fake, client):
    import asyncio

    from shadowtopic.client import AsyncClient

    async def run():
        async with AsyncClient(fake.url, timeout=5) as ac:
            c = await ac.subscribe("t", "sub", "shared", retry_enable=True,
                                   dead_letter_policy=DeadLetterPolicy(3))
            rh = next(s.handle for s in fake.commands("subscribe")
                      if s.subscribe.topic.endswith("-RETRY"))
            due = int((time.time() + 0.4) * 1000)
            fake.entries(rh, letter_entry(7, 0, {"DELIVER_AT_TIME": str(due)}))
            t0 = time.time()
            got = await c.receive(timeout=5)
            assert got.message_id == MessageId(7, 0) and time.time() * 1000 >= due
            assert time.time() - t0 < 2
            await c.close()
    asyncio.run(run())


def test_closing_the_client_closes_the_retry_consumer(fake):
    from shadowtopic.client import Client
    c = Client(fake.url, timeout=5)
    c.subscribe("t", "sub", retry_enable=True, dead_letter_policy=DeadLetterPolicy(3))
    done = threading.Event()
    threading.Thread(target=lambda: (c.close(), done.set()), daemon=True).start()
    assert done.wait(10)
    wait_for(lambda: len(fake.commands("close")) == 2, 5, "both handles closed")
