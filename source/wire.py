"""Protobuf's wire format, written and read by hand where it pays: functions over bytes, no
I/O, no module state (what an encoder keeps between entries, `LastPublish`, its caller owns).

The format (protobuf's encoding, all of it that is read or written here):

    message = field*                        fields in any order; a repeated field repeats
    field   = key value
    key     = varint (field_number << 3 | wire_type)      field numbers start at 1
    value   = varint                        wire type 0 (int32/64, uint32/64, bool, enum)
            | 8 bytes                       wire type 1 (fixed64, double)
            | varint length, length bytes   wire type 2 (bytes, string, message, packed)
            | 4 bytes                       wire type 5 (fixed32, float)
    varint  = 1 to 10 bytes, 7 bits each, least significant first; the high bit of each
              byte but the last is set; a negative int64 takes 10 bytes (two's complement)

Writing: a `ServerFrame` carrying entries is built by concatenating already-encoded
`EncodedEntry` records (a repeated message field is just length-delimited records one after
another), so an entry's `raw` bytes go from storage to the socket without being decoded or
re-encoded; a `ServerMessage` is the concatenation of its frames, each behind its tag and
length; a reader encoding a run of entries gives `encode_entry` its own `LastPublish`, so a
batch's shared publish time is encoded once. Field numbers follow
proto/shadowtopic/pb/v1/common.proto and consumer.proto; a unit test checks that protobuf
parses what these functions write:

    EncodedEntry:  1 ledger_id, 2 entry_id, 3 publish_time, 4 redelivery_count, 5 raw
    ServerFrame:   1 handles (packed uint64), 2 entries (repeated EncodedEntry), 3 event
    ServerMessage: 1 frames (repeated ServerFrame)

Reading: `read_varint` and `walk` (each field's number, wire type and where its value is)
read what the broker looks into without a protobuf parse: the messages of a produce request
in the WAL (source/ledger/wal.py), the request id of a refused produce request
(source/broker/producer_service.py), the field boundaries a large consumer message is cut at
(source/broker/consumer_service.py), a message's key (`message_key`). Bytes that are not
this format raise `WireError`, a protobuf `DecodeError`: a service answers it
INVALID_ARGUMENT with its reason (`errors.typed`), as it answers what protobuf cannot parse.
Groups (wire types 3 and 4, proto2 only) are not read here: `WireError` too.
"""
from __future__ import annotations

from collections.abc import Iterator

from google.protobuf.message import DecodeError

from shadowtopic.pb.v1 import consumer_pb2

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5  # the wire types read here
MAX_VARINT = 10  # bytes
_U64 = (1 << 64) - 1


class WireError(DecodeError):
    """Bytes that are not protobuf's encoding: a varint cut short or longer than 10 bytes, a
    value past the end, a field number 0, a group or an unknown wire type."""


# ---- writing -----------------------------------------------------------------------------

def varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    if n < 0x80:
        return bytes((n,))
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class LastPublish:
    """The encoding of the last publish time `encode_entry` wrote with it: the entries of one
    produce batch share their time, so a reader encoding a run of entries gives one (each
    reader its own: nothing is shared between threads or readers)."""

    __slots__ = ("ms", "encoded")

    def __init__(self) -> None:
        self.ms = -1
        self.encoded = b""


def encode_entry(ledger_id: int, entry_id: int, publish_ms: int, raw: bytes,
                 redelivery_count: int = 0, last: LastPublish | None = None) -> bytes:
    """The bytes of one `EncodedEntry` message (with `last`, its publish time encoded once
    per run of entries that share it)."""
    if last is None:
        publish = varint(publish_ms)
    elif last.ms == publish_ms:
        publish = last.encoded
    else:
        publish = last.encoded = varint(publish_ms)
        last.ms = publish_ms
    parts = [b"\x08", varint(ledger_id), b"\x10", varint(entry_id), b"\x18", publish]
    if redelivery_count:
        parts += [b"\x20", varint(redelivery_count)]
    parts += [b"\x2a", varint(len(raw)), raw]
    return b"".join(parts)


def entries_field(encoded: list[bytes], field: int = 2) -> bytes:
    """A repeated EncodedEntry field from encoded entries (ServerFrame.entries is field 2,
    ReadEntriesResponse.entries and PeekMessagesResponse.entries are field 1)."""
    tag = bytes(((field << 3) | 2,))
    parts = []
    for e in encoded:
        parts += [tag, varint(len(e)), e]
    return b"".join(parts)


def handles_field(handles: list[int]) -> bytes:
    """`ServerFrame.handles` (field 1, packed)."""
    if len(handles) > 32:  # a broadcast frame: protobuf's C encoder is ~20x faster
        return consumer_pb2.ServerFrame(handles=handles).SerializeToString()
    packed = b"".join(varint(h) for h in handles)
    return b"\x0a" + varint(len(packed)) + packed if packed else b""


def entries_frame(handles: list[int], encoded: list[bytes]) -> bytes:
    """A whole `ServerFrame{handles, entries}`: the entries once, for every handle."""
    return handles_field(handles) + entries_field(encoded)


def server_message(frames: list[bytes]) -> bytes:
    """A whole `ServerMessage{frames}` from encoded `ServerFrame`s."""
    parts = []
    for f in frames:
        parts += [b"\x0a", varint(len(f)), f]
    return b"".join(parts)


# ---- reading -----------------------------------------------------------------------------

def read_varint(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """The varint at buf[pos:end] (as protobuf reads it: unsigned, 64 bits) and the position
    after it; `WireError` when it is cut short by `end` or longer than 10 bytes."""
    if pos + 1 < end:  # most keys and lengths: one or two bytes
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
        c = buf[pos + 1]
        if c < 0x80:
            return (b & 0x7F) | (c << 7), pos + 2
    start, value, shift = pos, 0, 0
    stop = min(end, pos + MAX_VARINT)
    while pos < stop:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value & _U64, pos
        shift += 7
    if stop < end:
        raise WireError(f"varint at byte {start} is longer than {MAX_VARINT} bytes")
    raise WireError(f"varint at byte {start} is cut short (the message ends at byte {end})")


def walk(buf: bytes | memoryview, pos: int = 0, end: int | None = None
         ) -> Iterator[tuple[int, int, int, int, int]]:
    """Each field of the message encoded in buf[pos:end], in order, as
    (field number, wire type, value, start, stop): the field's value is buf[start:stop] (for
    wire type 0, its varint's bytes) and `value` is the varint (wire type 0) or the length
    (the others). `WireError` for bytes that are not protobuf's encoding (module docstring),
    raised when the walk reaches them."""
    if end is None:
        end = len(buf)
    while pos < end:
        key = buf[pos]
        if key < 0x80:  # field numbers up to 15
            pos += 1
        else:
            key, pos = read_varint(buf, pos, end)
        number, kind = key >> 3, key & 7
        if number == 0:
            raise WireError(f"field number 0 before byte {pos}")
        start = pos
        if kind == VARINT:
            value, pos = read_varint(buf, pos, end)
        elif kind == LENGTH:
            value, start = read_varint(buf, pos, end)
            pos = start + value
        elif kind == FIXED64 or kind == FIXED32:
            value = 8 if kind == FIXED64 else 4
            pos += value
        else:
            raise WireError(f"field {number} has wire type {kind} (a group or unknown), "
                            f"not read here")
        if pos > end:
            raise WireError(f"field {number} at byte {start} runs past the end of the "
                            f"message (byte {end}) to byte {pos}")
        yield number, kind, value, start, pos


def message_key(raw: bytes) -> bytes | None:
    """The `key` of a serialized `Message` (field 1, written first by every protobuf
    encoder), read without decoding the rest: what Key_Shared dispatch routes by. None for
    a message without a key (or bytes that do not start with one)."""
    if not raw or raw[0] != 0x0A:
        return None
    end = len(raw)
    if end > 1 and raw[1] < 0x80:  # a key shorter than 128 bytes
        n, i = raw[1], 2
    else:
        try:
            n, i = read_varint(raw, 1, end)
        except WireError:
            return None
    return raw[i:i + n] if i + n <= end else None
