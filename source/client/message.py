"""Messages as the client hands them to users (domain type, decoded from `raw` on access).

`payload` and `key` are bytes, as produced (`key` is None for a message sent without one; a
payload the producer compressed is decompressed here: source/client/compression.py);
`value()` is the payload as text, and `str(msg)` the line `shadowtopic read` prints.

A received Message is read-only (its properties too): readers of one topic on one client
share the same objects. It is built from the entry's envelope (ids, publish time, redelivery
count) and its stored bytes; the message inside (`payload`, `key`, `properties`,
`event_time`, `producer_name`, `sequence_id`) is parsed once, when one of those is first
read, so a consumer that only routes or acknowledges by id never parses it. Bytes that do
not parse, or a compressed payload that does not decompress, raise `DataLoss` there.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from google.protobuf.message import DecodeError

from shadowtopic.client.compression import decompress
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.pb.v1 import common_pb2

_new, _tuple_new = object.__new__, tuple.__new__
_parse = common_pb2.Message.FromString

#: the properties of every received message that has none (read-only, shared: copying an
#: empty protobuf map into a dict went through the Mapping ABC, ~5 us a message)
NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})

#: the public fields, in the order of the constructor, `repr` and equality
FIELDS = ("message_id", "topic", "payload", "key", "properties", "event_time", "publish_time",
          "producer_name", "sequence_id", "redelivery_count")

#: (payload, key, properties or None for none, event_time, producer_name, sequence_id)
_Inner = tuple[bytes, "bytes | None", "Mapping[str, str] | None", int, str, int]


def _decode(raw: bytes) -> _Inner:
    """The fields of a stored message (`_Inner`)."""
    try:
        m = _parse(raw)
    except DecodeError as exc:
        raise errors.DataLoss(f"a received message does not parse: {exc}") from None
    payload = m.payload
    if m.compression:
        payload = decompress(m.compression, payload, m.uncompressed_size)
    return (payload, m.key if m.HasField("key") else None,
            MappingProxyType(dict(m.properties)) if m.properties else None,
            m.event_time, m.producer_name, m.sequence_id)


class Message:
    """One message. `Message(message_id=..., topic=..., payload=..., ...)` makes one (every
    field after `payload` has a default); a received one comes from `from_entry`. Fields are
    read-only (setting one raises AttributeError); equality compares them all;
    `replace(**changes)` gives a copy."""

    __slots__ = ("_id", "_topic", "_publish_time", "_redelivery_count", "_raw", "_inner")

    def __init__(self, message_id: MessageId, topic: str, payload: bytes,
                 key: bytes | None = None, properties: Mapping[str, str] | None = None,
                 event_time: int = 0, publish_time: int = 0, producer_name: str = "",
                 sequence_id: int = 0, redelivery_count: int = 0):
        self._id = message_id
        self._topic = topic
        self._publish_time = publish_time
        self._redelivery_count = redelivery_count
        self._raw: bytes | None = None
        self._inner: _Inner | None = (payload, key,
                                      {} if properties is None else properties,
                                      event_time, producer_name, sequence_id)

    @classmethod
    def from_entry(cls, topic: str, partition: int, e: common_pb2.EncodedEntry) -> Message:
        """A received entry of `topic` (its `partition`, -1 for none): the envelope read now,
        the stored message parsed when a field of it is first read."""
        msg = _new(cls)
        (msg._id, msg._topic, msg._publish_time, msg._redelivery_count,  # noqa: SLF001
         msg._raw, msg._inner) = (  # noqa: SLF001 - (its own class's slots, set in one step)
            _tuple_new(MessageId, (e.ledger_id, e.entry_id, partition)), topic,
            e.publish_time, e.redelivery_count, e.raw, None)
        return msg

    def _fields(self) -> _Inner:
        inner = self._inner
        if inner is None:
            assert self._raw is not None  # (set whenever `_inner` is not)
            inner = self._inner = _decode(self._raw)
            self._raw = None
        return inner

    @property
    def message_id(self) -> MessageId:
        return self._id

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def publish_time(self) -> int:
        return self._publish_time

    @property
    def redelivery_count(self) -> int:
        return self._redelivery_count

    @property
    def payload(self) -> bytes:
        inner = self._inner
        return (inner if inner is not None else self._fields())[0]

    @property
    def key(self) -> bytes | None:
        inner = self._inner
        return (inner if inner is not None else self._fields())[1]

    @property
    def properties(self) -> Mapping[str, str]:
        return self._fields()[2] or NO_PROPERTIES

    @property
    def event_time(self) -> int:
        return self._fields()[3]

    @property
    def producer_name(self) -> str:
        return self._fields()[4]

    @property
    def sequence_id(self) -> int:
        return self._fields()[5]

    @property
    def is_tombstone(self) -> bool:
        return not self.payload

    def value(self) -> str:
        return self.payload.decode("utf-8", "replace")

    def replace(self, **changes: Any) -> Message:
        """A copy with `changes` (field names as the constructor's)."""
        unknown = set(changes) - set(FIELDS)
        if unknown:
            raise TypeError(f"Message has no field {sorted(unknown)[0]!r}")
        values = {name: getattr(self, name) for name in FIELDS}
        values.update(changes)
        return Message(**values)

    def _values(self) -> tuple[object, ...]:
        """The fields' values, properties as a dict (equal to any mapping with the same
        items: a received message's are read-only views)."""
        payload, key, properties, event_time, producer_name, sequence_id = self._fields()
        return (self._id, self._topic, payload, key, dict(properties or {}), event_time,
                self._publish_time, producer_name, sequence_id, self._redelivery_count)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # (equal by value; properties are a mapping)

    def __repr__(self) -> str:
        return "Message(" + ", ".join(f"{name}={getattr(self, name)!r}"
                                      for name in FIELDS) + ")"

    def __str__(self) -> str:
        """`id<TAB>key<TAB>payload[<TAB>k=v ...]`, key and payload as UTF-8 text, `-` for
        no key."""
        key = self.key.decode("utf-8", "replace") if self.key is not None else "-"
        props = " ".join(f"{k}={v}" for k, v in self.properties.items())
        return "\t".join([str(self.message_id), key, self.value()] + ([props] if props else []))

    def to_dict(self) -> dict[str, Any]:
        return {"message_id": str(self.message_id), "topic": self.topic,
                "key": self.key.decode("utf-8", "replace") if self.key is not None else None,
                "payload": self.value(), "properties": dict(self.properties),
                "event_time": self.event_time, "publish_time": self.publish_time,
                "producer_name": self.producer_name, "sequence_id": self.sequence_id,
                "redelivery_count": self.redelivery_count}
