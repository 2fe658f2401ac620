from source.pb.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplicateBatch(_message.Message):
    __slots__ = ("shadow", "source", "batch_id", "entries")
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    shadow: str
    source: str
    batch_id: int
    entries: _containers.RepeatedCompositeFieldContainer[_common_pb2.EncodedEntry]
    def __init__(self, shadow: _Optional[str] = ..., source: _Optional[str] = ..., batch_id: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[_common_pb2.EncodedEntry, _Mapping]]] = ...) -> None: ...

class ReplicateAck(_message.Message):
    __slots__ = ("batch_id", "last_persisted", "error")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_PERSISTED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    last_persisted: _common_pb2.MessageIdData
    error: _common_pb2.ErrorStatus
    def __init__(self, batch_id: _Optional[int] = ..., last_persisted: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.ErrorStatus, _Mapping]] = ...) -> None: ...
