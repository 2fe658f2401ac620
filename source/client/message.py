"""Messages as the client hands them to users (domain type, decoded from `raw`).

`payload` and `key` are bytes, as produced (`key` is None for a message sent without one; a
payload the producer compressed is decompressed here: source/client/compression.py);
`value()` is the payload as text, and `str(msg)` the line `shadowtopic read` prints.

A received Message is immutable (its properties too): readers of one topic on one client
share the same objects."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from shadowtopic.client.compression import decompress
from shadowtopic.core.message_id import MessageId
from shadowtopic.pb.v1 import common_pb2

_new, _set, _tuple_new = object.__new__, object.__setattr__, tuple.__new__

#: the properties of every received message that has none (read-only, shared: copying an
#: empty protobuf map into a dict went through the Mapping ABC, ~5 us a message)
NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class Message:
    message_id: MessageId
    topic: str
    payload: bytes
    key: bytes | None = None
    properties: Mapping[str, str] = field(default_factory=dict)  # read-only when received
    event_time: int = 0
    publish_time: int = 0
    producer_name: str = ""
    sequence_id: int = 0
    redelivery_count: int = 0

    @property
    def is_tombstone(self) -> bool:
        return not self.payload

    def value(self) -> str:
        return self.payload.decode("utf-8", "replace")

    def __str__(self) -> str:
        """`id<TAB>key<TAB>payload[<TAB>k=v ...]`, key and payload as UTF-8 text, `-` for
        no key."""
        key = self.key.decode("utf-8", "replace") if self.key is not None else "-"
        props = " ".join(f"{k}={v}" for k, v in self.properties.items())
        return "\t".join([str(self.message_id), key, self.value()] + ([props] if props else []))

    @classmethod
    def from_entry(cls, topic: str, partition: int, e: common_pb2.EncodedEntry) -> Message:
        m = common_pb2.Message.FromString(e.raw)
        payload = m.payload
        if m.compression:
            payload = decompress(m.compression, payload, m.uncompressed_size)
        # the instance's fields in one step: the dataclass's own __init__ sets them one
        # `object.__setattr__` at a time (frozen), 6.4 us a message against 1.7 here; the
        # object is the same (equality, repr, `dataclasses.replace`, frozen)
        msg = _new(cls)
        _set(msg, "__dict__", {
            "message_id": _tuple_new(MessageId, (e.ledger_id, e.entry_id, partition)),
            "topic": topic,
            "payload": payload, "key": m.key if m.HasField("key") else None,
            "properties": MappingProxyType(dict(m.properties)) if m.properties
            else NO_PROPERTIES, "event_time": m.event_time, "publish_time": e.publish_time,
            "producer_name": m.producer_name, "sequence_id": m.sequence_id,
            "redelivery_count": e.redelivery_count})
        return msg

    def to_dict(self) -> dict[str, Any]:
        return {"message_id": str(self.message_id), "topic": self.topic,
                "key": self.key.decode("utf-8", "replace") if self.key is not None else None,
                "payload": self.value(), "properties": dict(self.properties),
                "event_time": self.event_time, "publish_time": self.publish_time,
                "producer_name": self.producer_name, "sequence_id": self.sequence_id,
                "redelivery_count": self.redelivery_count}

