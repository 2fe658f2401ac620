"""Client and CLI side of durable subscriptions, without a broker.

`FakeBroker` is an in-process gRPC server that speaks the wire contract (Admin and
Consumer.Connect) and that each test scripts: it answers subscribe / seek / unsubscribe /
close as the broker will (or with the error a test asks for), records every command the
client sends, and lets the test push frames (entries, events) down the stream. So the
consumer's own logic is tested exactly: what it sends, when, and what it does with what
comes back (seek_done dropping buffered messages, warnings, errors, flow control).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from support.fake_broker import acked, entry, event_frame, status

from shadowtopic.cli import main as cli
from shadowtopic.client import Client, Consumer, MessageId, SeekResult, errors
from shadowtopic.client.admin import position_pb
from shadowtopic.client.options import parse_consumer_type
from shadowtopic.client.seek import seek_targets
from shadowtopic.core.argtypes import subscription_type, time_ms
from shadowtopic.pb.v1 import common_pb2, consumer_pb2

EXE = os.path.join(os.path.dirname(sys.executable), "shadowtopic")
TOPIC = "persistent://public/default/t"


def handle_of(consumer: Consumer, index: int = -1) -> int:
    return consumer._handles.by_index[index].handle


# ---- argument parsing, no network ----------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("exclusive", "exclusive"), ("Exclusive", "exclusive"), ("SHARED", "shared"),
    ("Failover", "failover"), ("key_shared", "key_shared"), ("Key_Shared", "key_shared"),
    ("KeyShared", "key_shared"), ("key-shared", "key_shared")])
def test_consumer_types_parse_in_any_case(text, expected):
    assert parse_consumer_type(text)[0] == expected


@pytest.mark.parametrize("bad", ["", "exclusiv", "round_robin", None, 1])
def test_unknown_consumer_types_are_invalid_arguments(bad):
    with pytest.raises(errors.InvalidArgument):
        parse_consumer_type(bad)


def test_positions_parse_to_the_wire_form():
    assert position_pb("earliest") == common_pb2.StartPosition(earliest=True)
    assert position_pb("Latest") == common_pb2.StartPosition(latest=True)
    ms = 1_700_000_000_000
    assert position_pb(ms) == common_pb2.StartPosition(publish_time=ms)
    mid = common_pb2.StartPosition(message_id=common_pb2.MessageIdData(ledger_id=5, entry_id=3))
    assert position_pb("5:3") == mid
    assert position_pb(MessageId(5, 3)) == mid
    assert position_pb("5:3:2") == mid  # the partition is named by the handle, not the id
    assert position_pb(MessageId(5, 3, 2)) == mid
    for bad in (True, -1, 1.5, None, b"5:3", "soon"):
        with pytest.raises(errors.InvalidArgument):
            position_pb(bad)
    with pytest.raises(errors.InvalidMessageId):
        position_pb("5:x")


def test_seek_targets_route_ids_with_a_partition_to_that_partition():
    parts = {0: "p0", 1: "p1", 2: "p2"}
    assert seek_targets("1:2:1", parts)[1] == ["p1"]
    assert seek_targets(MessageId(1, 2, 2), parts)[1] == ["p2"]
    assert seek_targets("1:2", parts)[1] == ["p0", "p1", "p2"]
    assert seek_targets(123, parts)[1] == ["p0", "p1", "p2"]
    assert seek_targets("earliest", parts)[1] == ["p0", "p1", "p2"]
    with pytest.raises(errors.InvalidArgument):
        seek_targets("1:2:7", parts)
    assert seek_targets("1:2:7", {-1: "only"})[1] == ["only"]  # non-partitioned


def test_subscribe_checks_its_arguments_before_contacting_the_broker():
    with Client("127.0.0.1:1", timeout=1) as c:  # nothing listens there
        for kwargs in [dict(subscription_name=""), dict(subscription_name="a/b"),
                       dict(subscription_name=".hidden"), dict(consumer_type="round_robin"),
                       dict(initial_position="soon"), dict(initial_position=-5),
                       dict(receiver_queue_size=0), dict(priority="high"),
                       dict(negative_ack_redelivery_delay_ms=-1),
                       dict(on_active_change="not callable")]:
            kwargs.setdefault("subscription_name", "sub")
            with pytest.raises(errors.InvalidArgument):
                c.subscribe("t", **kwargs)


def test_time_values_for_reset_cursor():
    assert time_ms("10m", now_ms=1_000_000) == 400_000
    assert time_ms("1h", now_ms=10_000_000) == 10_000_000 - 3_600_000
    assert time_ms("1700000000000") == 1_700_000_000_000
    assert time_ms("2024-05-01T12:00:00Z") == 1_714_564_800_000
    assert time_ms("2024-05-01T14:00:00+02:00") == 1_714_564_800_000
    for bad in ("soon", "10", "-1h", "2024-13-01"):
        if bad == "10":
            assert time_ms(bad) == 10  # a bare number is ms since the epoch
            continue
        with pytest.raises(argparse.ArgumentTypeError):
            time_ms(bad)
    assert subscription_type("Key_Shared") == "key_shared"


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        cli.main(list(argv))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.mark.parametrize("argv,needle", [
    (["consume", "t"], "-s/--subscription"),
    (["consume", "t", "-s", "x", "-t", "roundrobin"], "not a subscription type"),
    (["consume", "t", "-s", "x", "-n", "-1"], "below 0"),
    (["consume", "t", "-s", "x", "--timeout", "soon"], "seconds"),
    (["topics", "reset-cursor", "t", "-s", "x"], "one of the arguments"),
    (["topics", "reset-cursor", "t", "-s", "x", "-m", "1:2", "-t", "1h"], "not allowed with"),
    (["topics", "reset-cursor", "t", "-s", "x", "-t", "yesterday"], "not a time"),
    (["topics", "skip", "t", "-s", "x"], "-n/--count"),
    (["topics", "peek-messages", "t", "-s", "x", "-n", "0"], "below 1"),
    (["topics", "create-subscription", "t"], "-s/--subscription"),
    (["topics", "set-policies", "t", "--max-consumers", "-3"], "below 0"),
])
def test_cli_usage_errors_are_one_line(capsys, argv, needle):
    code, out, err = run_cli(capsys, *argv)
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("error: ") and needle in err, err


def test_cli_invalid_subscription_and_position_are_one_line(capsys, fake):
    code, _, err = run_cli(capsys, "consume", "t", "-s", "bad/name", "--url", fake.url)
    assert code == 1 and err.startswith("error: InvalidArgument:") and err.count("\n") == 1
    code, _, err = run_cli(capsys, "consume", "t", "-s", "x", "-p", "5:x", "--url", fake.url)
    assert code == 1 and err.startswith("error: InvalidMessageId:") and err.count("\n") == 1


def test_policy_flags_for_limits():
    args = cli.parse_args(["topics", "set-policies", "t", "--max-producers", "3",
                           "--max-subscriptions", "0", "--max-consumers", "2"])
    from shadowtopic.cli.commands import _policies
    assert _policies(args).as_dict() == {"max_producers": 3, "max_subscriptions": 0,
                                         "max_consumers": 2}


# ---- the consumer against the fake broker --------------------------------------------------

def test_subscribe_sends_subscribe_then_flow(fake, client):
    with client.subscribe("t", "sub", consumer_type="Failover", initial_position="earliest",
                          consumer_name="c1", priority=3, receiver_queue_size=7) as c:
        sub = fake.wait_for("subscribe").subscribe
        assert (sub.topic, sub.subscription, sub.type, sub.consumer_name, sub.priority) == (
            TOPIC, "sub", consumer_pb2.FAILOVER, "c1", 3)
        assert sub.start == common_pb2.StartPosition(earliest=True)
        assert fake.wait_for("flow").flow.permits == 7
        assert (c.topic, c.subscription_name, c.consumer_type) == (TOPIC, "sub", "failover")
        assert c.is_active is None and c.last_warning is None
    fake.wait_for("close")


def test_default_start_is_latest_and_type_exclusive(fake, client):
    client.subscribe("t", "sub")
    sub = fake.wait_for("subscribe").subscribe
    assert sub.start == common_pb2.StartPosition(latest=True) and sub.type == consumer_pb2.EXCLUSIVE


def test_receive_ack_and_flow_top_up(fake, client):
    c = client.subscribe("t", "sub", receiver_queue_size=4)
    h = handle_of(c)
    fake.entries(h, entry(1, 0), entry(1, 1), entry(1, 2))
    msgs = [c.receive(timeout=5) for _ in range(3)]
    assert [str(m.message_id) for m in msgs] == ["1:0", "1:1", "1:2"]
    assert msgs[0].value() == "m1:0" and msgs[0].topic == TOPIC
    # a frame counts as consumed once the application starts on it (inbox.py): 3 of 4,
    # past half the queue, so the permits are topped up by 3
    fake.wait_for("flow", lambda f: f.flow.permits == 3)
    c.acknowledge(msgs[0])
    c.acknowledge(MessageId(1, 1))
    c.acknowledge_cumulative(msgs[2])
    c.negative_acknowledge(msgs[1])
    fake.wait_for("nack")
    acks = fake.commands("ack", h)  # individual acks queued together go up as one command
    assert [(*i, a.ack.cumulative) for a in acks for i in acked(a.ack)] == [
        (1, 0, False), (1, 1, False), (1, 2, True)]
    # individual acks go up as ranges (acks.py), the cumulative one as an id (no partition)
    assert all(not a.ack.ids for a in acks if not a.ack.cumulative)
    assert not acks[-1].ack.ids[0].HasField("partition")
    nack = fake.commands("nack", h)[0].nack
    assert (nack.ids[0].entry_id, nack.delay_ms) == (1, 1000)


@pytest.mark.parametrize("kind", ["shared", "key_shared", "Key_Shared"])
def test_cumulative_ack_is_refused_on_shared_without_sending(fake, client, kind):
    c = client.subscribe("t", "sub", consumer_type=kind)
    fake.entries(handle_of(c), entry(1, 0))
    msg = c.receive(timeout=5)
    with pytest.raises(errors.NotAllowed):
        c.acknowledge_cumulative(msg)
    fake.sync(client)
    assert fake.commands("ack") == []
    c.acknowledge(msg)  # an individual ack is fine
    fake.wait_for("ack", lambda a: not a.ack.cumulative)


def test_ack_of_a_foreign_id_is_refused(fake, client):
    c = client.subscribe("t", "sub")
    with pytest.raises(errors.InvalidArgument):
        c.acknowledge(MessageId(1, 0, 3))  # a partition this consumer does not read
    with pytest.raises(errors.InvalidArgument):
        c.acknowledge(object())


def test_receive_times_out(fake, client):
    c = client.subscribe("t", "sub")
    t0 = time.monotonic()
    with pytest.raises(errors.Timeout):
        c.receive(timeout=0.3)
    assert 0.25 < time.monotonic() - t0 < 2
    assert c.batch_receive(10, timeout=0.1) == []


def test_batch_receive_takes_what_is_there(fake, client):
    c = client.subscribe("t", "sub")
    h = handle_of(c)
    fake.entries(h, *[entry(1, i) for i in range(5)])
    first = c.batch_receive(3, timeout=5)
    assert [m.message_id.entry_id for m in first] == [0, 1, 2]
    assert [m.message_id.entry_id for m in c.batch_receive(10, timeout=5)] == [3, 4]


def test_seek_done_by_admin_drops_what_was_received_before(fake, client):
    c = client.subscribe("t", "sub", receiver_queue_size=10)
    h = handle_of(c)
    fake.entries(h, entry(1, 0), entry(1, 1))
    assert c.receive(timeout=5).message_id.entry_id == 0  # 1:1 is buffered now
    fake.entries(h, entry(1, 2))                          # and 1:2 queued, not decoded
    fake.push(event_frame(h, seek_done=consumer_pb2.SeekDone(
        position=common_pb2.MessageIdData(ledger_id=1, entry_id=0), by_admin=True)))
    fake.wait_for("flow", lambda f: f.flow.permits == 10, count=2)  # a fresh flow
    fake.entries(h, entry(1, 0))
    assert str(c.receive(timeout=5).message_id) == "1:0"  # not the dropped 1:1


def test_seek_waits_for_its_answer_and_drops_the_buffer(fake, client):
    c = client.subscribe("t", "sub", receiver_queue_size=10)
    h = handle_of(c)
    fake.entries(h, entry(1, 0), entry(1, 1), entry(1, 2))
    assert c.receive(timeout=5).message_id.entry_id == 0
    fake.seek_clamped = True
    assert c.seek("5:0") == (MessageId(5, 0), True)
    seek = fake.commands("seek", h)[0].seek.position
    assert (seek.message_id.ledger_id, seek.message_id.entry_id) == (5, 0)
    assert fake.commands("flow", h)[-1].flow.permits == 10
    fake.entries(h, entry(5, 0))
    assert c.receive(timeout=5).message_id == MessageId(5, 0)
    fake.seek_clamped = False
    assert c.seek(1_700_000_000_000) == (MessageId(4, 0), False)
    assert fake.commands("seek", h)[-1].seek.position.publish_time == 1_700_000_000_000


def test_a_refused_seek_raises_its_typed_error_and_the_consumer_goes_on(fake, client):
    fake.answers["seek"] = lambda cmd: [event_frame(cmd.handle, warning=status(
        "InvalidMessageId", "no such ledger", "INVALID_ARGUMENT", command="seek"))]
    c = client.subscribe("t", "sub")
    with pytest.raises(errors.InvalidMessageId):
        c.seek("9:9")
    assert isinstance(c.last_warning, errors.InvalidMessageId)
    fake.entries(handle_of(c), entry(1, 0))
    assert c.receive(timeout=5).message_id.entry_id == 0


def test_an_error_answering_a_seek_fails_it_and_the_consumer_goes_on(fake, client):
    fake.answers["seek"] = lambda cmd: [event_frame(cmd.handle, error=status(
        "TopicNotOwned", "reloading", "UNAVAILABLE"))]
    c = client.subscribe("t", "sub")
    with pytest.raises(errors.TopicNotOwned):
        c.seek("9:9")
    fake.entries(handle_of(c), entry(1, 0))
    assert c.receive(timeout=5).message_id.entry_id == 0


@pytest.mark.parametrize("details", [{}, {"command": "ack"}])
def test_a_warning_about_another_command_does_not_answer_a_seek(fake, client, details):
    def answer(cmd):
        return [event_frame(cmd.handle, warning=status("InvalidMessageId", "bad ack",
                                                       "INVALID_ARGUMENT", **details)),
                event_frame(cmd.handle, seek_done=consumer_pb2.SeekDone(
                    position=cmd.seek.position.message_id))]
    fake.answers["seek"] = answer
    c = client.subscribe("t", "sub")
    assert c.seek("3:3") == (MessageId(3, 3), False)
    assert isinstance(c.last_warning, errors.InvalidMessageId)


def test_seek_times_out_without_an_answer(fake):
    fake.answers["seek"] = lambda cmd: []
    with Client(fake.url, timeout=0.5) as client:
        c = client.subscribe("t", "sub")
        with pytest.raises(errors.Timeout):
            c.seek("1:0")


def test_warnings_are_kept_and_the_consumer_goes_on(fake, client):
    c = client.subscribe("t", "sub")
    h = handle_of(c)
    fake.push(event_frame(h, warning=status("InvalidMessageId", "ack of 9:9: no such entry",
                                            "INVALID_ARGUMENT")))
    fake.entries(h, entry(1, 0))
    assert c.receive(timeout=5).message_id.entry_id == 0
    assert isinstance(c.last_warning, errors.InvalidMessageId)
    assert "no such entry" in c.last_warning.message


def test_an_error_event_ends_the_consumer(fake, client):
    c = client.subscribe("t", "sub")
    fake.push(event_frame(handle_of(c), error=status("TopicNotFound", "topic deleted",
                                                     "NOT_FOUND")))
    for _ in range(2):
        with pytest.raises(errors.TopicNotFound):
            c.receive(timeout=5)
    with pytest.raises(errors.TopicNotFound):
        c.acknowledge(MessageId(1, 0))
    c.close()
    with pytest.raises(errors.AlreadyClosed):
        c.receive(timeout=1)


@pytest.mark.parametrize("reason,cls", [("ConsumerBusy", errors.ConsumerBusy),
                                        ("TooManyConsumers", errors.TooManyConsumers),
                                        ("SubscriptionNotFound", errors.SubscriptionNotFound)])
def test_a_refused_subscribe_raises_the_typed_error(fake, client, reason, cls):
    fake.answers["subscribe"] = lambda cmd: [event_frame(cmd.handle, error=status(reason))]
    with pytest.raises(cls):
        client.subscribe("t", "sub")


def test_a_partly_refused_subscribe_leaves_the_partitions_that_subscribed(fake, client):
    fake.partitions[TOPIC] = 2

    def answer(cmd):
        if cmd.subscribe.topic.endswith("-1"):
            return [event_frame(cmd.handle, error=status("TooManyConsumers"))]
        return [event_frame(cmd.handle, subscribed=consumer_pb2.Subscribed())]
    fake.answers["subscribe"] = answer
    with pytest.raises(errors.TooManyConsumers):
        client.subscribe("t", "sub")
    close = fake.wait_for("close")
    assert close.handle == fake.commands("subscribe")[0].handle


def test_unsubscribe_refused_then_done(fake, client):
    answers = iter([status("ConsumerBusy", "2 consumers attached"), None])

    def answer(cmd):
        st = next(answers)
        if st is None:
            return [event_frame(cmd.handle, closed=consumer_pb2.HandleClosed())]
        return [event_frame(cmd.handle, error=st)]
    fake.answers["unsubscribe"] = answer
    c = client.subscribe("t", "sub")
    with pytest.raises(errors.ConsumerBusy):
        c.unsubscribe()
    fake.entries(handle_of(c), entry(1, 0))  # still consuming
    assert c.receive(timeout=5).message_id.entry_id == 0
    c.unsubscribe()
    with pytest.raises(errors.AlreadyClosed):
        c.receive(timeout=1)
    fake.sync(client)
    assert fake.commands("close") == []  # an unsubscribed handle needs no close


def test_unsubscribe_of_a_subscription_that_is_gone_is_done(fake, client):
    fake.answers["unsubscribe"] = lambda cmd: [
        event_frame(cmd.handle, error=status("SubscriptionNotFound", "sub was deleted",
                                             "NOT_FOUND")),
        event_frame(cmd.handle, closed=consumer_pb2.HandleClosed())]
    c = client.subscribe("t", "sub")
    c.unsubscribe()
    with pytest.raises(errors.AlreadyClosed):
        c.receive(timeout=1)


def test_close_wakes_a_receive_blocked_in_another_thread(fake, client):
    c = client.subscribe("t", "sub")
    caught: list = []

    def blocked():
        try:
            c.receive()
        except Exception as exc:  # noqa: BLE001
            caught.append(exc)
    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    c.close()
    t.join(2)
    assert not t.is_alive() and isinstance(caught[0], errors.AlreadyClosed)
    assert time.monotonic() - t0 < 2
    fake.wait_for("close")
    c.close()  # twice: a no-op


def test_iteration_ends_when_closed(fake, client):
    c = client.subscribe("t", "sub")
    fake.entries(handle_of(c), entry(1, 0), entry(1, 1))
    got = []
    for msg in c:
        got.append(msg.message_id.entry_id)
        if len(got) == 2:
            threading.Timer(0.2, c.close).start()
    assert got == [0, 1]


def test_closing_the_client_closes_its_consumers(fake):
    client = Client(fake.url, timeout=5)
    c = client.subscribe("t", "sub")
    client.close()
    with pytest.raises(errors.AlreadyClosed):
        c.receive(timeout=1)


def test_a_broken_stream_fails_receive(fake, client):
    c = client.subscribe("t", "sub")
    fake.stop()
    with pytest.raises(errors.ServiceUnavailable):
        c.receive(timeout=10)


def test_redelivery_counts(fake, client):
    c = client.subscribe("t", "sub", consumer_type="shared")
    h = handle_of(c)
    fake.entries(h, entry(1, 0, redelivery_count=2))
    fake.entries(h, entry(1, 1), entry(1, 2), redeliveries=[
        consumer_pb2.Redelivery(handle=h, entry_index=1, count=3),
        consumer_pb2.Redelivery(handle=h + 99, entry_index=0, count=5)])
    assert [c.receive(timeout=5).redelivery_count for _ in range(3)] == [2, 0, 3]


def test_redeliver_unacknowledged_drops_the_buffer_and_returns_its_permits(fake, client):
    # Shared: the broker requeues, the client gives back the dropped permits itself
    # (Exclusive / Failover rewind and answer with seek_done, which re-flows)
    c = client.subscribe("t", "sub", "shared", receiver_queue_size=100)
    h = handle_of(c)
    fake.entries(h, entry(1, 0))
    assert c.receive(timeout=5).message_id.entry_id == 0
    fake.entries(h, entry(1, 1), entry(1, 2))  # a frame the application never started on
    deadline = time.monotonic() + 5
    while not c.has_buffered() and time.monotonic() < deadline:
        time.sleep(0.01)
    c.redeliver_unacknowledged_messages()
    fake.wait_for("redeliver")
    assert fake.wait_for("flow", lambda f: f.handle == h, count=2).flow.permits == 2
    fake.entries(h, entry(1, 0, redelivery_count=1))
    assert c.receive(timeout=5).redelivery_count == 1


def test_active_consumer_changes(fake, client):
    seen: list = []
    c = client.subscribe("t", "sub", consumer_type="failover", on_active_change=seen.append)
    h = handle_of(c)
    fake.push(event_frame(h, active_consumer_changed=consumer_pb2.ActiveConsumerChanged(
        is_active=True)))
    deadline = time.monotonic() + 5
    while seen != [True] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [True] and c.is_active is True
    fake.push(event_frame(h, active_consumer_changed=consumer_pb2.ActiveConsumerChanged()))
    while seen != [True, False] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [True, False] and c.is_active is False


def test_partitioned_topics_one_handle_per_partition(fake, client):
    fake.partitions[TOPIC] = 2
    c = client.subscribe("t", "sub")
    subs = fake.commands("subscribe")
    assert [s.subscribe.topic for s in subs] == [f"{TOPIC}-partition-0", f"{TOPIC}-partition-1"]
    h0, h1 = handle_of(c, 0), handle_of(c, 1)
    fake.entries(h1, entry(7, 0))
    msg = c.receive(timeout=5)
    assert msg.message_id == MessageId(7, 0, 1) and msg.topic == f"{TOPIC}-partition-1"
    c.acknowledge(msg)
    assert fake.wait_for("ack").handle == h1
    with pytest.raises(errors.InvalidArgument):
        c.acknowledge(MessageId(7, 0))  # which partition?
    assert c.seek("7:0:1") == (MessageId(7, 0, 1), False)
    assert [s.handle for s in fake.commands("seek")] == [h1]
    landed, _ = c.seek(1000)
    assert landed == MessageId(4, 0, 0) and {s.handle for s in fake.commands("seek")} == {h0, h1}


def test_reader_seek_drops_the_buffer(fake, client):
    r = client.create_reader("t", start="earliest", receiver_queue_size=10)
    h = fake.commands("subscribe")[-1].handle
    fake.entries(h, entry(1, 0), entry(1, 1), entry(1, 2))
    assert r.read_next(timeout=5).message_id.entry_id == 0
    assert r.seek("1:0") == SeekResult(MessageId(1, 0), False)  # the consumer's type too
    assert fake.commands("flow", h)[-1].flow.permits == 10
    fake.entries(h, entry(1, 0))
    assert str(r.read_next(timeout=5).message_id) == "1:0"  # not the dropped 1:1


# ---- retries of opening calls and admin calls (source/client/retry.py) ----------------------

def refuse_first(n: int, reason: str = "TopicNotOwned", code: str = "UNAVAILABLE"):
    """A subscribe answer: `reason` for the first `n` subscribes, then subscribed."""
    seen: list = []

    def answer(cmd):
        seen.append(cmd)
        if len(seen) <= n:
            return [event_frame(cmd.handle, error=status(reason, "reloading", code))]
        return [event_frame(cmd.handle, subscribed=consumer_pb2.Subscribed(
            topic=cmd.subscribe.topic))]
    return answer


def test_a_subscribe_refused_for_now_is_retried_without_the_user_seeing_it(fake, client):
    fake.answers["subscribe"] = refuse_first(2)
    c = client.subscribe("t", "sub", receiver_queue_size=5)
    subs = fake.commands("subscribe")
    assert len(subs) == 3 and len({s.handle for s in subs}) == 3  # a fresh handle each time
    assert fake.wait_for("flow").handle == subs[-1].handle == handle_of(c)
    fake.entries(handle_of(c), entry(1, 0))
    assert c.receive(timeout=5).message_id.entry_id == 0


def test_a_reader_opened_while_the_topic_reloads_is_retried(fake, client):
    fake.answers["subscribe"] = refuse_first(1, "ServiceUnavailable")
    r = client.create_reader("t", start="earliest")
    assert len(fake.commands("subscribe")) == 2
    fake.entries(fake.commands("subscribe")[-1].handle, entry(1, 0))
    assert r.read_next(timeout=5).message_id.entry_id == 0


@pytest.mark.parametrize("open_", ["subscribe", "reader", "producer", "subscribe_many"])
def test_a_lookup_that_fails_for_now_is_retried(fake, client, open_):
    fake.admin_errors["GetTopicMetadata"] = [errors.TopicNotOwned("moving"),
                                             errors.ServiceUnavailable("restarting")]
    if open_ == "subscribe":
        client.subscribe("t", "sub")
    elif open_ == "reader":
        client.create_reader("t")
    elif open_ == "producer":
        client.create_producer("t", idempotent=False)  # the fake serves no Produce stream
    else:
        assert len(client.subscribe_many("t", ["a", "b"])) == 2
    assert fake.admin_counts["GetTopicMetadata"] == 3


def test_a_non_retriable_refusal_is_not_retried(fake, client):
    fake.answers["subscribe"] = refuse_first(5, "NotAllowed", "FAILED_PRECONDITION")
    with pytest.raises(errors.NotAllowed):
        client.subscribe("t", "sub")
    assert len(fake.commands("subscribe")) == 1
    fake.admin_errors["GetTopicMetadata"] = [errors.TopicNotFound("no such topic")]
    with pytest.raises(errors.TopicNotFound):
        client.create_reader("t")
    assert fake.admin_counts["GetTopicMetadata"] == 2  # the subscribe's, then this one


def test_a_retriable_refusal_surfaces_after_the_operation_timeout(fake):
    fake.answers["subscribe"] = refuse_first(10 ** 6)
    # (long enough for a second attempt on a loaded machine: one attempt took over 0.5 s)
    with Client(fake.url, timeout=5, operation_timeout=2) as client:
        with pytest.raises(errors.TopicNotOwned) as info:
            client.subscribe("t", "sub")
        assert info.value.reason == "TopicNotOwned" and info.value.retriable
        assert len(fake.commands("subscribe")) > 1
        assert any("operation timeout" in note for note in info.value.__notes__)
        fake.admin_errors["GetTopicMetadata"] = [errors.ServiceUnavailable("away")] * 10 ** 4
        with pytest.raises(errors.ServiceUnavailable):
            client.create_reader("t")


def test_admin_reads_retry_every_retriable_error(fake, client):
    fake.admin_errors["ListSubscriptions"] = [errors.Timeout("slow"),
                                              errors.MetadataUnavailable("etcd away")]
    assert client.admin.list_subscriptions("t") == ["a", "b", "c"]


@pytest.mark.parametrize("err,retried", [
    (errors.TopicNotOwned("not the owner"), True),
    (errors.ServiceUnavailable("changed meanwhile; taken back"), True),
    (errors.MetadataUnavailable("etcd write timed out"), False),
    (errors.Timeout("deadline passed"), False)])
def test_non_idempotent_admin_calls_retry_only_what_was_not_applied(fake, client, err, retried):
    fake.admin_errors["CreateSubscription"] = [err]
    if retried:
        client.admin.create_subscription("t", "sub")
        assert fake.admin_counts["CreateSubscription"] == 2
    else:
        with pytest.raises(type(err)):
            client.admin.create_subscription("t", "sub")
        assert fake.admin_counts["CreateSubscription"] == 1
    fake.admin_errors["Skip"] = [errors.Timeout("deadline passed")]
    with pytest.raises(errors.Timeout):  # skipping twice would skip twice as many
        client.admin.skip("t", "sub", 5)
    fake.admin_errors["Skip"] = [errors.Timeout("deadline passed")]
    assert client.admin.skip("t", "sub", 5, dry_run=True)["entriesAcked"] == 5


def test_admin_calls_to_a_broker_that_is_down_retry_until_the_operation_timeout():
    with Client("127.0.0.1:1", timeout=5, operation_timeout=0.5) as c:
        with pytest.raises(errors.ConnectError) as info:
            c.admin.create_subscription("t", "sub")  # never sent: safe to retry
        assert info.value.retriable and "operation timeout" in "".join(info.value.__notes__)


# ---- admin --------------------------------------------------------------------------------

def test_admin_subscription_calls(fake, client):
    a = client.admin
    assert a.list_subscriptions("t") == ["a", "b", "c"]
    assert a.reset_cursor("t", "sub", "3:1", dry_run=True) == (MessageId(8, 2), True)
    req = fake.admin_calls[-1][1]
    assert (req.topic, req.subscription, req.dry_run) == (TOPIC, "sub", True)
    assert req.position.message_id.entry_id == 1
    a.reset_cursor("t", "sub", 1234)
    assert fake.admin_calls[-1][1].position.publish_time == 1234
    a.create_subscription("t", "sub", "earliest")
    assert fake.admin_calls[-1][1].start.earliest
    change = a.delete_subscription("t", "sub", force=True, dry_run=True)
    assert change["markDeletePosition"] == "3:4"
    assert change["msgBacklog"] == 7 and change["dryRun"] is True
    assert fake.admin_calls[-1][1].force
    assert a.skip("t", "sub", 5)["entriesAcked"] == 5
    assert a.clear_backlog("t", "sub")["entriesAcked"] == 9
    msgs = a.peek_messages("t", "sub", 2)
    assert [(str(m.message_id), m.key, m.value()) for m in msgs] == [("1:0", b"k", "x"),
                                                                   ("1:1", None, "y")]
    for bad in [lambda: a.skip("t", "sub", -1), lambda: a.peek_messages("t", "sub", 0),
                lambda: a.create_subscription("t", "a/b"), lambda: a.reset_cursor("t", "s", "x")]:
        with pytest.raises(errors.InvalidArgument):
            bad()


# ---- the CLI against the fake broker ------------------------------------------------------

def _serve_entries(fake, count: int):
    """Answer the first flow of a consume with `count` entries."""
    def flow(cmd):
        if len(fake.commands("flow", cmd.handle)) == 0:
            return [consumer_pb2.ServerFrame(handles=[cmd.handle],
                                             entries=[entry(1, i) for i in range(count)])]
        return []
    fake.answers["flow"] = flow


def test_cli_consume_prints_and_acks(fake, capsys):
    _serve_entries(fake, 3)
    code, out, err = run_cli(capsys, "consume", "t", "-s", "sub", "-n", "2", "-t", "Shared",
                             "-p", "earliest", "--url", fake.url)
    assert code == 0, err
    assert out.splitlines() == ["1:0\t-\tm1:0", "1:1\t-\tm1:1"]
    assert "# 2 messages" in err
    sub = fake.commands("subscribe")[0].subscribe
    assert (sub.subscription, sub.type, sub.start.earliest) == ("sub", consumer_pb2.SHARED, True)
    assert [e for a in fake.commands("ack") for _ledger, e in acked(a.ack)] == [0, 1]


def test_cli_consume_json_no_ack_and_timeout(fake, capsys):
    _serve_entries(fake, 1)
    code, out, err = run_cli(capsys, "consume", "t", "-s", "sub", "-n", "0", "--no-ack",
                             "--timeout", "0.5", "-o", "json", "--url", fake.url)
    assert code == 1 and err.startswith("error: Timeout:") and "1 messages consumed" in err
    assert json.loads(out.splitlines()[0])["message_id"] == "1:0"
    assert fake.commands("ack") == []


def test_cli_subscription_commands(fake, capsys):
    code, out, _ = run_cli(capsys, "topics", "subscriptions", "t", "-o", "json", "--url", fake.url)
    assert code == 0 and json.loads(out) == ["a", "b", "c"]
    code, out, _ = run_cli(capsys, "topics", "reset-cursor", "t", "-s", "sub", "-m", "3:1",
                           "--url", fake.url)
    assert code == 0 and "8:2" in out and "(clamped)" in out
    before = int(time.time() * 1000) - 600_000
    code, out, _ = run_cli(capsys, "topics", "reset-cursor", "t", "-s", "sub", "-t", "10m",
                           "--dry-run", "-o", "json", "--url", fake.url)
    req = fake.admin_calls[-1][1]
    assert code == 0 and json.loads(out) == {"message_id": "8:2", "clamped": True, "dry_run": True}
    assert req.dry_run and before - 1000 <= req.position.publish_time <= before + 5000
    code, out, _ = run_cli(capsys, "topics", "create-subscription", "t", "-s", "sub",
                           "--messageId", "earliest", "--url", fake.url)
    assert code == 0 and fake.admin_calls[-1][1].start.earliest
    code, out, _ = run_cli(capsys, "topics", "unsubscribe", "t", "-s", "sub", "-f", "-o", "json",
                           "--url", fake.url)
    assert code == 0 and json.loads(out)["consumers"] == 1 and fake.admin_calls[-1][1].force
    code, out, _ = run_cli(capsys, "topics", "skip", "t", "-s", "sub", "-n", "5", "-o", "json",
                           "--url", fake.url)
    assert code == 0 and json.loads(out)["entriesAcked"] == 5
    code, out, _ = run_cli(capsys, "topics", "clear-backlog", "t", "-s", "sub", "--dry-run",
                           "-o", "json", "--url", fake.url)
    assert code == 0 and fake.admin_calls[-1][1].dry_run
    code, out, err = run_cli(capsys, "topics", "peek-messages", "t", "-s", "sub", "-n", "2",
                             "--url", fake.url)
    assert code == 0 and out.splitlines() == ["1:0\tk\tx", "1:1\t-\ty"]


# Ctrl-C as a terminal sends it: SIGINT at its default disposition in the CLI. A test run
# started as a background job of a non-interactive shell (`make test &`) ignores SIGINT and
# SIGQUIT, and a child inherits an ignored signal through exec, so the CLI would never see
# it (Python installs its KeyboardInterrupt handler only over the default disposition).
# The CLI is started through a one-line exec that puts SIGINT back to default first.
DEFAULT_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                  "os.execv(sys.argv[1], sys.argv[1:])")


def test_cli_consume_ctrl_c_exits_130_quietly(fake):
    """Ctrl-C ends `consume -n 0` with 130 and no traceback, and leaves the subscription."""
    proc = subprocess.Popen([sys.executable, "-c", DEFAULT_SIGINT, EXE, "consume", "t", "-s",
                             "sub", "-n", "0", "--url", fake.url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        fake.wait_for("flow", timeout=20)  # subscribed, now blocked in receive
        time.sleep(0.3)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert b"Traceback" not in err + out
    assert time.monotonic() - t0 < 8
    fake.wait_for("close")  # the consumer left the subscription on the way out
