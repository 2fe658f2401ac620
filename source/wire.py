"""Wire encoding done by hand where it pays: pure functions over bytes, no I/O.

A `ServerFrame` carrying entries is built by concatenating already-encoded `EncodedEntry`
records (a repeated message field is just length-delimited records one after another), so
an entry's `raw` bytes go from storage to the socket without being decoded or re-encoded;
a `ServerMessage` is the concatenation of its frames, each behind its tag and length.
Field numbers follow proto/shadowtopic/pb/v1/common.proto and consumer.proto; a unit test checks
that protobuf parses what these functions write.
"""
from __future__ import annotations

from shadowtopic.pb.v1 import consumer_pb2

# EncodedEntry:  1 ledger_id, 2 entry_id, 3 publish_time, 4 redelivery_count, 5 raw
# ServerFrame:   1 handles (packed uint64), 2 entries (repeated EncodedEntry), 3 event
# ServerMessage: 1 frames (repeated ServerFrame)


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


_last_publish: tuple[int, bytes] = (-1, b"")


def encode_entry(ledger_id: int, entry_id: int, publish_ms: int, raw: bytes,
                 redelivery_count: int = 0) -> bytes:
    """The bytes of one `EncodedEntry` message."""
    global _last_publish
    last = _last_publish
    if last[0] != publish_ms:  # entries of one produce batch share their time
        last = _last_publish = (publish_ms, varint(publish_ms))
    parts = [b"\x08", varint(ledger_id), b"\x10", varint(entry_id), b"\x18", last[1]]
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


def message_key(raw: bytes) -> bytes | None:
    """The `key` of a serialized `Message` (field 1, written first by every protobuf
    encoder), read without decoding the rest: what Key_Shared dispatch routes by. None for
    a message without a key (or bytes that do not start with one)."""
    if not raw or raw[0] != 0x0A:
        return None
    n, shift, i = 0, 0, 1
    while i < len(raw):
        b = raw[i]
        n |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return raw[i:i + n] if i + n <= len(raw) else None
        shift += 7
    return None
