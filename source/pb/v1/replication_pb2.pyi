from shadowtopic.pb.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplicateBatch(_message.Message):
    __slots__ = ("shadow", "source", "batch_id", "entries", "source_epoch", "last_confirmed")
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    shadow: str
    source: str
    batch_id: int
    entries: _containers.RepeatedCompositeFieldContainer[_common_pb2.EncodedEntry]
    source_epoch: int
    last_confirmed: _common_pb2.MessageIdData
    def __init__(self, shadow: _Optional[str] = ..., source: _Optional[str] = ..., batch_id: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[_common_pb2.EncodedEntry, _Mapping]]] = ..., source_epoch: _Optional[int] = ..., last_confirmed: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ...) -> None: ...

class ReplicateAck(_message.Message):
    __slots__ = ("batch_id", "last_persisted", "error", "want_raw")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_PERSISTED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    WANT_RAW_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    last_persisted: _common_pb2.MessageIdData
    error: _common_pb2.ErrorStatus
    want_raw: bool
    def __init__(self, batch_id: _Optional[int] = ..., last_persisted: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.ErrorStatus, _Mapping]] = ..., want_raw: _Optional[bool] = ...) -> None: ...
