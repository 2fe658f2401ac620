"""End-to-end checks of the read path (a real broker): exact ids across
ledger rollovers and a truncate, and a stalled Connect stream that does not slow another."""
from __future__ import annotations

import threading
import time

import grpc

from shadowtopic.core.message_id import MessageId
from shadowtopic.core.policies import Policies
from shadowtopic.pb.v1 import common_pb2, consumer_pb2

CONNECT = "/shadowtopic.v1.Consumer/Connect"


def _ids(msgs):
    return [(m.message_id.ledger_id, m.message_id.entry_id) for m in msgs]


def _read(reader, n, timeout=20.0):
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        out.append(reader.read_next(timeout=max(0.1, deadline - time.monotonic())))
    return out


def test_readers_keep_exact_ids_across_rollovers_and_a_truncate(client, topic):
    client.admin.create_topic(topic, policies=Policies(ledger_max_entries=4))
    with client.create_producer(topic) as p:
        first = [p.send(f"a{i}".encode()) for i in range(23)]  # several rollovers
    ledgers = {mid.ledger_id for mid in first}
    assert len(ledgers) >= 3, first
    live = client.create_reader(topic, start="earliest", receiver_queue_size=5)
    got = _read(live, 23)
    assert [m.payload for m in got] == [f"a{i}".encode() for i in range(23)]
    assert _ids(got) == [(m.ledger_id, m.entry_id) for m in first]

    # a reader starting inside a ledger, exclusive and inclusive, at exact ids
    mid = first[9]
    r_ex = client.create_reader(topic, start=MessageId(mid.ledger_id, mid.entry_id))
    assert _ids(_read(r_ex, 13)) == [(m.ledger_id, m.entry_id) for m in first[10:]]
    r_in = client.create_reader(topic, start=MessageId(mid.ledger_id, mid.entry_id),
                                inclusive=True)
    assert _ids(_read(r_in, 14)) == [(m.ledger_id, m.entry_id) for m in first[9:]]

    client.admin.truncate(topic)
    with client.create_producer(topic) as p:
        after = [p.send(f"b{i}".encode()) for i in range(6)]
    assert min(m.ledger_id for m in after) > max(ledgers)
    # the live reader (at the end before the truncate) reads exactly the new messages
    got = _read(live, 6)
    assert [m.payload for m in got] == [f"b{i}".encode() for i in range(6)]
    assert _ids(got) == [(m.ledger_id, m.entry_id) for m in after]
    # a new reader from earliest starts at the first entry left, not at a deleted ledger
    fresh = client.create_reader(topic, start="earliest")
    got = _read(fresh, 6)
    assert _ids(got) == [(m.ledger_id, m.entry_id) for m in after]
    # a reader started at an id inside a deleted ledger moves to the next entry left
    gone = client.create_reader(topic, start=MessageId(first[2].ledger_id, first[2].entry_id))
    assert _ids(_read(gone, 6)) == [(m.ledger_id, m.entry_id) for m in after]
    assert not fresh.has_message_available() and not gone.has_message_available()


def test_a_stalled_stream_does_not_slow_a_reader_on_another_stream(broker, client, topic):
    """C7 end to end: a Connect stream that asked for everything and reads nothing fills
    its outbox and stops being served; a reader on another stream reads the whole topic
    meanwhile, and the stalled stream still gets every entry, in order, once it reads."""
    client.admin.create_topic(topic)
    payload = b"x" * (200 << 10)
    n = 150  # 30 MiB: past the stalled stream's outbox (8 MiB) and gRPC's windows
    release = threading.Event()

    def requests():
        yield consumer_pb2.ClientMessage(commands=[
            consumer_pb2.ClientCommand(handle=1, subscribe=consumer_pb2.Subscribe(
                topic=topic, start=common_pb2.StartPosition(earliest=True))),
            consumer_pb2.ClientCommand(handle=1, flow=consumer_pb2.Flow(permits=100_000))])
        release.wait(60)

    channel = grpc.insecure_channel(broker.url, options=[
        ("grpc.max_receive_message_length", 64 << 20)])
    try:
        call = channel.stream_stream(
            CONNECT, request_serializer=consumer_pb2.ClientMessage.SerializeToString,
            response_deserializer=consumer_pb2.ServerMessage.FromString)(requests(),
                                                                          timeout=90)
        first = next(call)
        assert first.frames[0].event.HasField("subscribed")
        with client.create_producer(topic) as p:
            for _i in range(n):
                p.send_async(payload)
            p.flush(timeout=60)
        reader = client.create_reader(topic, start="earliest", receiver_queue_size=20)
        t0 = time.monotonic()
        got = _read(reader, n, timeout=30)
        took = time.monotonic() - t0
        assert len(got) == n and took < 20, f"reader on another stream took {took:.1f}s"
        seen = []
        for message in call:  # the stalled stream now reads: everything, in order, once
            for frame in message.frames:
                assert not frame.event.HasField("error"), frame.event
                seen += [(e.ledger_id, e.entry_id) for e in frame.entries]
            if len(seen) >= n:
                break
        assert seen == _ids(got)
        call.cancel()
    finally:
        release.set()
        channel.close()
