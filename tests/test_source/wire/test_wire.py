"""Hand-built frames parse as the protobuf messages they claim to be."""
from __future__ import annotations

from shadowtopic import wire
from shadowtopic.pb.v1 import admin_pb2, common_pb2, consumer_pb2


def test_varint_matches_protobuf():
    for n in (0, 1, 127, 128, 300, 2**32, 2**63 - 1):
        pb = common_pb2.MessageIdData(ledger_id=n).SerializeToString()
        assert pb == b"\x08" + wire.varint(n) if n else pb == b""


def test_entries_frame_parses_as_server_frame():
    raw = common_pb2.Message(key=b"k", payload=b"p" * 300, properties={"a": "b"}).SerializeToString()
    enc = [wire.encode_entry(7, i, 1_700_000_000_000 + i, raw, redelivery_count=i % 2)
           for i in range(3)]
    frame = consumer_pb2.ServerFrame.FromString(wire.entries_frame([42, 7, 2**40], enc))
    assert list(frame.handles) == [42, 7, 2**40]
    assert [(e.ledger_id, e.entry_id, e.publish_time, e.redelivery_count) for e in frame.entries] \
        == [(7, i, 1_700_000_000_000 + i, i % 2) for i in range(3)]
    assert all(e.raw == raw for e in frame.entries)
    assert common_pb2.Message.FromString(frame.entries[0].raw).properties["a"] == "b"


def test_entries_field_one_for_peek_and_read_responses():
    enc = [wire.encode_entry(1, 0, 5, b"r")]
    resp = admin_pb2.PeekMessagesResponse.FromString(wire.entries_field(enc, field=1))
    assert resp.entries[0].raw == b"r"


def test_server_message_carries_frames_in_order():
    enc = [wire.encode_entry(3, 0, 9, b"x")]
    event = consumer_pb2.ServerFrame(handles=[5], event=consumer_pb2.Event(
        closed=consumer_pb2.HandleClosed())).SerializeToString()
    msg = consumer_pb2.ServerMessage.FromString(
        wire.server_message([wire.entries_frame([1, 2], enc), event]))
    assert [list(f.handles) for f in msg.frames] == [[1, 2], [5]]
    assert msg.frames[0].entries[0].raw == b"x" and msg.frames[1].event.HasField("closed")
    assert wire.server_message([]) == b""
