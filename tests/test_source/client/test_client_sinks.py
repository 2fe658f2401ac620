"""A frame that names several handles of one sink (source/client/stream.py `Sink.put_many`):
the multiplexer hands it over once, and every kind of sink (a consumer's, a reader's queue)
passes it on to each of its handles. Against the fake broker of test_client_consumer_unit."""
from __future__ import annotations

import pytest
from support.fake_broker import FakeBroker, entry

from shadowtopic.client import MessageId
from shadowtopic.pb.v1 import consumer_pb2

TOPIC = "persistent://public/default/t"


@pytest.fixture
def fake(fake: FakeBroker) -> FakeBroker:
    """The broker of conftest.py, with TOPIC in 2 partitions."""
    fake.partitions[TOPIC] = 2
    return fake


def test_a_frame_naming_every_partition_of_a_consumer_reaches_each_partition(fake, client):
    c = client.subscribe("t", "sub")
    handles = [c._by_index[i].handle for i in (0, 1)]
    fake.push(consumer_pb2.ServerFrame(handles=handles, entries=[entry(1, 0)]))
    got = sorted(c.receive(timeout=5).topic for _ in range(2))
    assert got == [f"{TOPIC}-partition-0", f"{TOPIC}-partition-1"]


def test_a_frame_naming_every_partition_of_a_reader_reaches_each_partition(fake, client):
    reader = client.create_reader("t")
    try:
        handles = sorted(c.handle for c in fake.commands("subscribe"))
        fake.push(consumer_pb2.ServerFrame(handles=handles, entries=[entry(1, 0)]))
        got = sorted(reader.read_next(timeout=5).topic for _ in range(2))
        assert got == [f"{TOPIC}-partition-0", f"{TOPIC}-partition-1"]
    finally:
        reader.close()


def test_an_entry_of_a_shadow_and_its_source_is_decoded_once_and_read_as_each_topic():
    """`Decoded`: the same entry (same id, same bytes) under two topic names, as a shadow and
    its source deliver it, is decoded once; each topic's Message says its own topic and
    partition. Other bytes under the same id are decoded for themselves."""
    from shadowtopic.client.stream import Decoded
    from shadowtopic.pb.v1 import common_pb2

    def encoded(payload: bytes, key: bytes = b"k") -> common_pb2.EncodedEntry:
        raw = common_pb2.Message(payload=payload, key=key, properties={"p": "1"},
                                 event_time=7).SerializeToString()
        return common_pb2.EncodedEntry(ledger_id=3, entry_id=9, publish_time=11, raw=raw)

    decoded = Decoded()
    [src] = decoded.messages("persistent://a/b/src", 0, [encoded(b"hello")])
    [shadow] = decoded.messages("persistent://a/b/shadow", 0, [encoded(b"hello")])
    assert shadow.payload is src.payload  # not decoded again
    assert (shadow.topic, shadow.message_id) == ("persistent://a/b/shadow", MessageId(3, 9, 0))
    assert (src.topic, src.message_id) == ("persistent://a/b/src", MessageId(3, 9, 0))
    assert (shadow.key, dict(shadow.properties), shadow.event_time, shadow.publish_time) == (
        b"k", {"p": "1"}, 7, 11)
    [other] = decoded.messages("persistent://x/y/other", 0, [encoded(b"other bytes")])
    assert other.payload == b"other bytes" and other.topic == "persistent://x/y/other"
