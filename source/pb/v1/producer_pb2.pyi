from shadowtopic.pb.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProduceRequest(_message.Message):
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
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    sequence_id: int
    attach: bool
    def __init__(self, topic: _Optional[str] = ..., producer_name: _Optional[str] = ..., request_id: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ..., sequence_id: _Optional[int] = ..., attach: _Optional[bool] = ...) -> None: ...

class ProduceReceipt(_message.Message):
    __slots__ = ("request_id", "ledger_id", "first_entry_id", "count", "error", "partition", "duplicate", "producer_name", "last_sequence_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    ledger_id: int
    first_entry_id: int
    count: int
    error: _common_pb2.ErrorStatus
    partition: int
    duplicate: bool
    producer_name: str
    last_sequence_id: int
    def __init__(self, request_id: _Optional[int] = ..., ledger_id: _Optional[int] = ..., first_entry_id: _Optional[int] = ..., count: _Optional[int] = ..., error: _Optional[_Union[_common_pb2.ErrorStatus, _Mapping]] = ..., partition: _Optional[int] = ..., duplicate: _Optional[bool] = ..., producer_name: _Optional[str] = ..., last_sequence_id: _Optional[int] = ...) -> None: ...
