from shadowtopic.pb.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReadEntriesRequest(_message.Message):
    __slots__ = ("topic", "ledger_id", "from_entry", "max_entries", "max_bytes")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ENTRY_FIELD_NUMBER: _ClassVar[int]
    MAX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    ledger_id: int
    from_entry: int
    max_entries: int
    max_bytes: int
    def __init__(self, topic: _Optional[str] = ..., ledger_id: _Optional[int] = ..., from_entry: _Optional[int] = ..., max_entries: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class ReadEntriesResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[_common_pb2.EncodedEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[_common_pb2.EncodedEntry, _Mapping]]] = ...) -> None: ...
