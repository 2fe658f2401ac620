"""Payload compression's codecs (source/client/compression.py) and the decode of a received
message, without a broker: round trips on realistic payloads, and every way a compressed
payload can be wrong is `DataLoss`, never a wrong payload or an allocation a producer asks for."""
from __future__ import annotations

import json
import os
import random

import pytest

from shadowtopic.client import compression
from shadowtopic.client.message import Message
from shadowtopic.core import errors
from shadowtopic.core.policies import MAX_MESSAGE_SIZE
from shadowtopic.pb.v1 import common_pb2


def json_record(rnd: random.Random) -> bytes:
    return json.dumps({"user": f"u{rnd.randrange(10**6)}", "amount": round(rnd.random() * 1e4, 2),
                       "items": [rnd.choice(["book", "pen", "lamp", "desk"])
                                 for _ in range(rnd.randrange(1, 6))],
                       "ok": rnd.random() < 0.9}).encode()


PAYLOADS = [json_record(random.Random(i)) for i in range(20)] + [os.urandom(300), b"x"]


@pytest.mark.parametrize("name", ["lz4", "zstd", "LZ4", "Zstd"])
def test_each_codec_round_trips_realistic_payloads(name):
    kind = compression.codec(name)
    compress = compression.compressor(kind)
    assert compress is not None
    for payload in PAYLOADS:
        packed = compress(payload)
        assert compression.decompress(kind, packed, len(payload)) == payload


def test_none_compresses_nothing_and_unknown_names_are_invalid():
    assert compression.compressor(compression.codec("none")) is None
    for bad in ("gzip", "", None, 2):
        with pytest.raises(errors.InvalidArgument, match="compression_type"):
            compression.codec(bad)


def test_json_records_get_smaller():
    batch = b"".join(PAYLOADS[:20])
    for name in ("lz4", "zstd"):
        packed = compression.compressor(compression.codec(name))(batch)
        assert len(packed) < len(batch) * 0.8, name


@pytest.mark.parametrize("name", ["lz4", "zstd"])
def test_a_wrong_compressed_payload_is_data_loss(name):
    kind = compression.codec(name)
    payload = PAYLOADS[0]
    packed = compression.compressor(kind)(payload)
    with pytest.raises(errors.DataLoss):          # damaged bytes
        compression.decompress(kind, packed[: len(packed) // 2], len(payload))
    with pytest.raises(errors.DataLoss):          # a size that is not the payload's
        compression.decompress(kind, packed, len(payload) + 7)
    with pytest.raises(errors.DataLoss, match="more than a message may have"):
        compression.decompress(kind, packed, MAX_MESSAGE_SIZE + 1)


def test_an_unknown_codec_is_data_loss():
    with pytest.raises(errors.DataLoss, match="unknown codec 9"):
        compression.decompress(9, b"abc", 3)


def entry(message: common_pb2.Message) -> common_pb2.EncodedEntry:
    return common_pb2.EncodedEntry(ledger_id=3, entry_id=4, publish_time=5,
                                   raw=message.SerializeToString())


@pytest.mark.parametrize("name", ["lz4", "zstd"])
def test_a_received_message_is_decompressed_with_its_other_fields_as_sent(name):
    kind = compression.codec(name)
    payload = PAYLOADS[3]
    m = common_pb2.Message(key=b"k", payload=compression.compressor(kind)(payload),
                           compression=kind, uncompressed_size=len(payload),
                           properties={"a": "b"}, event_time=9, producer_name="p",
                           sequence_id=11)
    msg = Message.from_entry("persistent://public/default/t", -1, entry(m))
    assert (msg.payload, msg.key, dict(msg.properties), msg.event_time, msg.sequence_id) == (
        payload, b"k", {"a": "b"}, 9, 11)


def test_a_received_message_that_does_not_decompress_raises_data_loss():
    m = common_pb2.Message(key=b"k", payload=b"not zstd", compression=compression.ZSTD,
                           uncompressed_size=100)
    msg = Message.from_entry("persistent://public/default/t", -1, entry(m))
    with pytest.raises(errors.DataLoss):  # (when the payload is read: message.py)
        _ = msg.payload


def test_a_received_message_equals_the_one_its_fields_make_and_is_read_only():
    """`from_entry` parses the stored message only when a field of it is read: the message
    is still equal to the one the constructor builds, read-only, and `replace` copies it."""
    from shadowtopic.client.message import NO_PROPERTIES
    from shadowtopic.core.message_id import MessageId

    m = common_pb2.Message(key=b"k", payload=b"v", producer_name="p", sequence_id=3)
    got = Message.from_entry("persistent://public/default/t", 2, entry(m))
    made = Message(message_id=MessageId(3, 4, 2), topic="persistent://public/default/t",
                   payload=b"v", key=b"k", properties=NO_PROPERTIES, event_time=0,
                   publish_time=5, producer_name="p", sequence_id=3)
    assert got == made and repr(got) == repr(made)
    with pytest.raises(AttributeError):
        got.payload = b"w"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        got.message_id = MessageId(1, 1)  # type: ignore[misc]
    again = got.replace(redelivery_count=2)
    assert again.redelivery_count == 2 and again.payload == b"v" and got.redelivery_count == 0
    with pytest.raises(TypeError):
        got.replace(colour="red")
    keyless = Message.from_entry("t", -1, entry(common_pb2.Message(payload=b"x")))
    assert keyless.key is None and keyless.properties == {}


def test_bytes_that_do_not_parse_raise_data_loss_when_a_field_is_read():
    bad = common_pb2.EncodedEntry(ledger_id=1, entry_id=0, raw=b"\xff\xff\xff")
    msg = Message.from_entry("t", -1, bad)
    assert msg.message_id == (1, 0, -1)  # the envelope reads without parsing
    with pytest.raises(errors.DataLoss):
        _ = msg.payload
