from shadowtopic.pb.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReadArrowRequest(_message.Message):
    __slots__ = ("topic", "compacted", "start", "end", "columns", "max_batch_rows")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    compacted: bool
    start: _common_pb2.MessageIdData
    end: _common_pb2.MessageIdData
    columns: _containers.RepeatedScalarFieldContainer[str]
    max_batch_rows: int
    def __init__(self, topic: _Optional[str] = ..., compacted: _Optional[bool] = ..., start: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ..., end: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ..., columns: _Optional[_Iterable[str]] = ..., max_batch_rows: _Optional[int] = ...) -> None: ...

class ArrowBatch(_message.Message):
    __slots__ = ("ipc",)
    IPC_FIELD_NUMBER: _ClassVar[int]
    ipc: bytes
    def __init__(self, ipc: _Optional[bytes] = ...) -> None: ...
