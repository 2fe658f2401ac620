"""Ack receipts against the fake broker (`ack_receipt=True`, source/client/acks.py, issue 30):
`acknowledge` returns once the receipt came and raises the broker's refusal; the callback
form is called once; what is left waiting when the consumer closes fails."""
from __future__ import annotations

import threading
import time

import pytest
from support.fake_broker import acked, entry, event_frame, status

from shadowtopic.client import Client, MessageId, errors
from shadowtopic.pb.v1 import consumer_pb2


def handle_of(consumer) -> int:
    return next(iter(consumer._handles.by_handle))


def receipt(cmd) -> list:
    return [event_frame(cmd.handle, ack_receipt=consumer_pb2.AckReceipt(
        request_id=cmd.ack.request_id))]


def test_acknowledge_waits_for_the_receipt_of_its_own_ack(fake, client):
    answered, asked = threading.Event(), []

    def late(cmd):
        asked.append(cmd)
        answered.wait(5)  # (the fake's reader thread: the answer comes once the test says)
        return receipt(cmd)

    fake.answers["ack"] = late
    c = client.subscribe("t", "sub", "shared", ack_receipt=True)
    fake.entries(handle_of(c), entry(1, 0), entry(1, 1))
    m0 = c.receive(timeout=5)
    done = threading.Event()
    t = threading.Thread(target=lambda: (c.acknowledge(m0), done.set()))
    t.start()
    deadline = time.monotonic() + 5
    while not asked and time.monotonic() < deadline:
        time.sleep(0.01)
    sent = asked[0]
    assert sent.ack.request_id and acked(sent.ack) == [(1, 0)] and not sent.ack.cumulative
    time.sleep(0.2)
    assert not done.is_set()  # no receipt yet: still waiting
    answered.set()
    t.join(5)
    assert done.is_set()


def test_a_refused_ack_raises_its_typed_error_and_the_consumer_goes_on(fake, client):
    fake.answers["ack"] = lambda cmd: [event_frame(cmd.handle, warning=status(
        "InvalidArgument", "ack of ids not written yet", "INVALID_ARGUMENT", command="ack",
        request_id=str(cmd.ack.request_id)))]
    c = client.subscribe("t", "sub", ack_receipt=True)
    with pytest.raises(errors.InvalidArgument, match="not written yet"):
        c.acknowledge(MessageId(9, 9))
    assert isinstance(c.last_warning, errors.InvalidArgument)
    fake.answers["ack"] = receipt
    fake.entries(handle_of(c), entry(1, 0))
    c.acknowledge_cumulative(c.receive(timeout=5))
    cum = fake.commands("ack")[-1].ack
    assert cum.cumulative and cum.request_id and acked(cum) == [(1, 0)]


def test_a_warning_for_another_request_does_not_answer_an_ack(fake):
    fake.answers["ack"] = lambda cmd: [event_frame(cmd.handle, warning=status(
        "InvalidArgument", "bad", "INVALID_ARGUMENT", command="ack",
        request_id=str(cmd.ack.request_id + 1000)))]
    with Client(fake.url, timeout=0.5) as client:
        c = client.subscribe("t", "sub", ack_receipt=True)
        with pytest.raises(errors.Timeout, match="no receipt"):
            c.acknowledge(MessageId(1, 0))


def test_the_callback_form_is_called_once_and_pending_ones_fail_at_close(fake, client):
    fake.answers["ack"] = lambda cmd: receipt(cmd) if cmd.ack.ranges[0].first_entry == 0 else []
    c = client.subscribe("t", "sub", "shared", ack_receipt=True)
    heard: dict[int, list] = {0: [], 1: []}
    got = threading.Event()

    def on(i):
        def callback(error):
            heard[i].append(error)
            got.set()
        return callback

    c.acknowledge_async(MessageId(1, 0), on(0))
    assert got.wait(5) and heard[0] == [None]
    c.acknowledge_async(MessageId(1, 1), on(1))   # never answered
    fake.wait_for("ack", lambda cmd: cmd.ack.ranges[0].first_entry == 1)
    assert heard[1] == []
    c.close()
    assert [type(e) for e in heard[1]] == [errors.AlreadyClosed]
    assert heard[0] == [None]  # once


def test_without_receipts_acks_stay_grouped_and_the_callback_is_called_at_once(fake, client):
    c = client.subscribe("t", "sub", "shared")
    heard: list = []
    c.acknowledge_async(MessageId(1, 0), heard.append)
    assert heard == [None]
    c.acknowledge(MessageId(1, 1))
    fake.wait_for("ack", lambda cmd: (1, 1) in acked(cmd.ack))
    assert all(not cmd.ack.request_id for cmd in fake.commands("ack"))


def test_ack_receipt_must_be_a_bool(fake, client):
    with pytest.raises(errors.InvalidArgument, match="ack_receipt"):
        client.subscribe("t", "sub", ack_receipt="yes")
