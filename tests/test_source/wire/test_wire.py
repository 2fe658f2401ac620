"""Hand-built frames parse as the protobuf messages they claim to be."""
from __future__ import annotations

from shadowtopic import wire
from shadowtopic.pb.v1 import admin_pb2, common_pb2, consumer_pb2


def test_varint_matches_protobuf():
    for n in (0, 1, 127, 128, 300, 2**32, 2**63 - 1):
        pb = common_pb2.MessageIdData(ledger_id=n).SerializeToString()
        assert pb == b"\x08" + wire.varint(n) if n else pb == b""


def test_entries_frame_parses_as_server_frame():
    raw = common_pb2.Message(key=b"k", payload=b"p" * 300,
                             properties={"a": "b"}).SerializeToString()
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


def test_encode_entry_with_a_last_publish_writes_what_it_writes_without():
    last = wire.LastPublish()
    for i, publish_ms in enumerate([5, 5, 1_700_000_000_000, 1_700_000_000_000, 5, 0]):
        assert wire.encode_entry(2**40, i, publish_ms, b"r%d" % i, i % 2, last) == \
            wire.encode_entry(2**40, i, publish_ms, b"r%d" % i, i % 2)
    assert (last.ms, last.encoded) == (0, wire.varint(0))


# ---- reading: one varint reader, one field walker ------------------------------------------

def test_read_varint_reads_what_protobuf_writes():
    for n in (0, 1, 127, 128, 300, 16383, 16384, 2**32, 2**63 - 1, 2**64 - 1):
        data = b"\xff" + wire.varint(n) + b"\x00"
        assert wire.read_varint(data, 1, len(data)) == (n, len(data) - 1)
    # a negative int64 is 10 bytes, read as protobuf reads it: 64 bits, unsigned
    assert wire.read_varint(wire.varint(-1), 0, 10) == (2**64 - 1, 10)


def test_a_truncated_varint_is_a_wire_error():
    for data in (b"", b"\x80", b"\xff\xff", b"\x96\x81\x80"):
        try:
            wire.read_varint(data, 0, len(data))
        except wire.WireError as exc:
            assert "cut short" in str(exc)
        else:
            raise AssertionError(f"{data!r} read as a varint")
    # cut by `end`, not by the buffer: the bytes after it are not read
    try:
        wire.read_varint(b"\x96\x01", 0, 1)
    except wire.WireError as exc:
        assert "cut short" in str(exc)
    else:
        raise AssertionError("a varint read past its end")


def test_an_overlong_varint_is_a_wire_error():
    data = b"\x80" * 10 + b"\x01"  # 11 bytes: protobuf refuses it too
    try:
        wire.read_varint(data, 0, len(data))
    except wire.WireError as exc:
        assert "longer than 10 bytes" in str(exc)
    else:
        raise AssertionError("an 11-byte varint was read")


def test_walk_gives_each_field_with_where_its_value_is():
    msg = common_pb2.EncodedEntry(ledger_id=300, entry_id=2, publish_time=7, raw=b"abc")
    data = b"\x00\x00" + msg.SerializeToString()  # walked from an offset
    fields = list(wire.walk(data, 2))
    assert [(n, k, v) for n, k, v, _, _ in fields] == [
        (1, wire.VARINT, 300), (2, wire.VARINT, 2), (3, wire.VARINT, 7), (5, wire.LENGTH, 3)]
    _, _, _, start, stop = fields[-1]
    assert data[start:stop] == b"abc" and stop == len(data)
    fixed = b"\x09" + b"\x01" * 8 + b"\x15" + b"\x02" * 4  # fixed64 field 1, fixed32 field 2
    assert [(n, k, v, b, e) for n, k, v, b, e in wire.walk(fixed)] == [
        (1, wire.FIXED64, 8, 1, 9), (2, wire.FIXED32, 4, 10, 14)]


def _walk_error(data: bytes) -> str:
    try:
        list(wire.walk(data))
    except wire.WireError as exc:
        return str(exc)
    raise AssertionError(f"{data!r} walked without an error")


def test_walk_errors_on_bytes_that_are_not_a_message():
    assert "runs past the end" in _walk_error(b"\x2a\x05abc")        # a length past the end
    assert "runs past the end" in _walk_error(b"\x09\x01\x02")       # a fixed64 cut short
    assert "cut short" in _walk_error(b"\x08")                        # a value missing
    assert "cut short" in _walk_error(b"\x08\x96")                    # a varint cut short
    assert "cut short" in _walk_error(b"\x2a\x80")                    # a length cut short
    assert "longer than 10 bytes" in _walk_error(b"\x08" + b"\xff" * 11)
    assert "field number 0" in _walk_error(b"\x00\x01")
    assert "wire type 3" in _walk_error(b"\x0b\x0c")                  # a group
    assert "wire type 7" in _walk_error(b"\x0f")


def test_a_wire_error_is_a_decode_error_which_a_service_answers_invalid_argument():
    from google.protobuf.message import DecodeError

    from shadowtopic.core import errors
    err = errors.typed(wire.WireError("varint at byte 0 is cut short"))
    assert isinstance(wire.WireError("x"), DecodeError)
    assert isinstance(err, errors.InvalidArgument) and "cut short" in err.message


def test_message_key_reads_short_and_long_keys_and_refuses_cut_ones():
    for key in (b"k", b"k" * 127, b"k" * 128, b"k" * 20000):
        raw = common_pb2.Message(key=key, payload=b"p").SerializeToString()
        assert wire.message_key(raw) == key
    assert wire.message_key(b"\x0a\x05ab") is None      # a key past the end
    assert wire.message_key(b"\x0a\x80") is None        # a length cut short
    assert wire.message_key(b"\x12\x01p") is None       # no key field first
