"""Acknowledgements as ranges and ack receipts against real brokers (issue 30 items 3 and 5;
docs/BEHAVIOURS.md C15, C16).

- Individual acks go up as ranges (the client's grouping) and leave the backlog exact across
  gaps: acking 1, 2, 3, 5, 6 of 0..7 leaves 0, 4 and 7, which come again to the next consumer.
- A bad range on the wire (2^60 entries, first after last) is refused with a warning naming
  it; nothing of that command is applied and the stream goes on.
- With `ack_receipt=True`, `acknowledge` returns once the broker applied the ack and wrote
  the cursor: a kill -9 of the broker right after it loses nothing (the broker here flushes
  batched cursors only every 30 s, so only the write made before the receipt can count).
"""
from __future__ import annotations

import os
import queue
import signal
import uuid

import grpc
import pytest
from support.waiting import drain, nothing_more, wait_for

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client, MessageId, errors
from shadowtopic.pb.v1 import common_pb2, consumer_pb2
from shadowtopic.standalone import BrokerProcess

SLOW_FLUSH = ["--lease-ttl", "3", "--cursor-flush-interval", "30"]


def backlog(client: Client, topic: str, sub: str) -> int:
    return client.admin.stats(topic)["subscriptions"][sub]["msgBacklog"]


def test_ranges_leave_the_backlog_right_and_the_gap_comes_again(client, topic):
    client.admin.create_topic(topic)
    with client.create_producer(topic) as p:
        ids = [p.send(f"m{i}".encode()) for i in range(8)]
    with client.subscribe(topic, "s", "shared", initial_position="earliest") as c:
        got = drain(c, 8, ack=False)
        assert [m.message_id for m in got] == ids
        for i in (1, 2, 3, 5, 6):
            c.acknowledge(got[i])
        wait_for(lambda: backlog(client, topic, "s") == 3, 10, "backlog 3 (0, 4, 7 unacked)")
    with client.subscribe(topic, "s", "shared") as again:
        assert sorted(m.payload for m in drain(again, 3, ack=False)) == [b"m0", b"m4", b"m7"]
        assert nothing_more(again)


def test_a_bad_range_is_refused_with_a_clear_warning_and_the_stream_goes_on(broker, client,
                                                                          topic):
    client.admin.create_topic(topic)
    with client.create_producer(topic) as p:
        ids = [p.send(f"m{i}".encode()) for i in range(4)]
    ledger, first = ids[0].ledger_id, ids[0].entry_id
    up: queue.SimpleQueue = queue.SimpleQueue()

    def requests():
        while (m := up.get()) is not None:
            yield m

    def ack(*ranges, request_id=0):
        return consumer_pb2.ClientMessage(commands=[consumer_pb2.ClientCommand(
            handle=1, ack=consumer_pb2.Ack(request_id=request_id, ranges=[
                consumer_pb2.AckRange(ledger_id=ledger, first_entry=a, last_entry=b)
                for a, b in ranges]))])

    channel = grpc.insecure_channel(broker.url)
    try:
        call = channel.stream_stream(
            "/shadowtopic.v1.Consumer/Connect",
            request_serializer=consumer_pb2.ClientMessage.SerializeToString,
            response_deserializer=consumer_pb2.ServerMessage.FromString)(requests(), timeout=60)
        up.put(consumer_pb2.ClientMessage(commands=[
            consumer_pb2.ClientCommand(handle=1, subscribe=consumer_pb2.Subscribe(
                topic=topic, subscription="s", type=consumer_pb2.SHARED,
                start=common_pb2.StartPosition(earliest=True))),
            consumer_pb2.ClientCommand(handle=1, flow=consumer_pb2.Flow(permits=10))]))
        events: list = []
        entries = 0

        def pump(until):
            nonlocal entries
            for message in call:
                for frame in message.frames:
                    entries += len(frame.entries)
                    if frame.HasField("event"):
                        events.append(frame.event)
                if until():
                    return

        pump(lambda: entries == 4)
        # 2^60 entries, then first after last: each refused whole, the good range with them too
        up.put(ack((first, first), (first, first + (1 << 60)), request_id=7))
        up.put(ack((first + 1, first), request_id=8))
        pump(lambda: sum(e.HasField("warning") for e in events) == 2)
        warnings = [e.warning for e in events if e.HasField("warning")]
        assert [w.reason for w in warnings] == ["InvalidMessageId"] * 2
        assert "more than" in warnings[0].message and "after its last" in warnings[1].message
        assert [w.details["request_id"] for w in warnings] == ["7", "8"]
        assert backlog(client, topic, "s") == 4  # nothing of either command was applied
        # the stream goes on: a good range is applied and receipted
        up.put(ack((first, first + 2), request_id=9))
        pump(lambda: any(e.HasField("ack_receipt") for e in events))
        assert [e.ack_receipt.request_id for e in events if e.HasField("ack_receipt")] == [9]
        assert backlog(client, topic, "s") == 1
        up.put(None)
        call.cancel()
    finally:
        up.put(None)
        channel.close()


def test_a_refused_ack_with_a_receipt_raises_and_the_consumer_goes_on(client, topic):
    client.admin.create_topic(topic)
    with client.create_producer(topic) as p:
        first = p.send(b"m0")
    with client.subscribe(topic, "s", "shared", initial_position="earliest",
                          ack_receipt=True) as c:
        with pytest.raises(errors.InvalidArgument, match="not written yet"):
            c.acknowledge(MessageId(first.ledger_id, first.entry_id + 1000))
        c.acknowledge(c.receive(timeout=10))  # returns: the broker applied it
        assert backlog(client, topic, "s") == 0  # (no waiting: the receipt says it is done)


@pytest.fixture(scope="module")
def slow_flush_broker(etcd_server, tmp_path_factory):
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path_factory.mktemp("ack-receipts")),
                      free_port(), extra_args=SLOW_FLUSH)
    b.start(timeout=60)
    try:
        yield b
    finally:
        if b.proc is not None and b.proc.poll() is None:
            os.kill(b.proc.pid, signal.SIGCONT)
        b.kill()


@pytest.mark.parametrize("kind", ["individual", "cumulative", "async"])
def test_an_ack_answered_by_its_receipt_survives_kill_9(slow_flush_broker, kind):
    topic = f"persistent://receipts/{uuid.uuid4().hex[:10]}/t"
    ctype = "exclusive" if kind == "cumulative" else "shared"
    with Client(slow_flush_broker.url, timeout=20) as c:
        c.admin.create_topic(topic)
        with c.create_producer(topic) as p:
            for i in range(10):
                p.send(f"m{i}".encode())
        cons = c.subscribe(topic, "s", ctype, initial_position="earliest", ack_receipt=True)
        got = drain(cons, 10, ack=False)
        if kind == "cumulative":
            cons.acknowledge_cumulative(got[5])   # 0..5
            left = [6, 7, 8, 9]
        elif kind == "individual":
            for i in (0, 1, 2, 3, 4, 6):
                cons.acknowledge(got[i])
            left = [5, 7, 8, 9]
        else:
            answers: queue.SimpleQueue = queue.SimpleQueue()
            for i in (0, 2, 4, 6, 8):
                cons.acknowledge_async(got[i], answers.put)
            assert [answers.get(timeout=20) for _ in range(5)] == [None] * 5
            left = [1, 3, 5, 7, 9]
        slow_flush_broker.kill()  # at once: no flush can have saved them since the receipts
    slow_flush_broker.start(timeout=60)
    with Client(slow_flush_broker.url, timeout=20) as c:
        wait_for(lambda: backlog(c, topic, "s") == len(left), 30, f"backlog {len(left)}",
                 ignore=(errors.ShadowTopicError,))
        with c.subscribe(topic, "s", ctype) as again:
            got = sorted(m.payload for m in drain(again, len(left), ack=False))
            assert got == sorted(f"m{i}".encode() for i in left)
            assert nothing_more(again)
