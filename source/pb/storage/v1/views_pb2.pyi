from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class RawProduceRequest(_message.Message):
    __slots__ = ("topic", "producer_name", "request_id", "messages", "sequence_id", "attach")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTACH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    producer_name: str
    request_id: int
    messages: _containers.RepeatedScalarFieldContainer[bytes]
    sequence_id: int
    attach: bool
    def __init__(self, topic: _Optional[str] = ..., producer_name: _Optional[str] = ..., request_id: _Optional[int] = ..., messages: _Optional[_Iterable[bytes]] = ..., sequence_id: _Optional[int] = ..., attach: _Optional[bool] = ...) -> None: ...

class MessageKeyView(_message.Message):
    __slots__ = ("key", "payload")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    payload: bytes
    def __init__(self, key: _Optional[bytes] = ..., payload: _Optional[bytes] = ...) -> None: ...
