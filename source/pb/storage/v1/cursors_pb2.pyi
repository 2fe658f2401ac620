from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CursorFile(_message.Message):
    __slots__ = ("format", "topic", "sequence", "full", "names", "mark_delete_ledger", "mark_delete_entry", "range_counts", "ranges", "deleted", "last_active_ms")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    MARK_DELETE_LEDGER_FIELD_NUMBER: _ClassVar[int]
    MARK_DELETE_ENTRY_FIELD_NUMBER: _ClassVar[int]
    RANGE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVE_MS_FIELD_NUMBER: _ClassVar[int]
    format: int
    topic: str
    sequence: int
    full: bool
    names: _containers.RepeatedScalarFieldContainer[str]
    mark_delete_ledger: _containers.RepeatedScalarFieldContainer[int]
    mark_delete_entry: _containers.RepeatedScalarFieldContainer[int]
    range_counts: _containers.RepeatedScalarFieldContainer[int]
    ranges: _containers.RepeatedScalarFieldContainer[int]
    deleted: _containers.RepeatedScalarFieldContainer[str]
    last_active_ms: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, format: _Optional[int] = ..., topic: _Optional[str] = ..., sequence: _Optional[int] = ..., full: _Optional[bool] = ..., names: _Optional[_Iterable[str]] = ..., mark_delete_ledger: _Optional[_Iterable[int]] = ..., mark_delete_entry: _Optional[_Iterable[int]] = ..., range_counts: _Optional[_Iterable[int]] = ..., ranges: _Optional[_Iterable[int]] = ..., deleted: _Optional[_Iterable[str]] = ..., last_active_ms: _Optional[_Iterable[int]] = ...) -> None: ...

class CursorFileRef(_message.Message):
    __slots__ = ("path", "sequence", "crc32c", "size_bytes", "cursors")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CURSORS_FIELD_NUMBER: _ClassVar[int]
    path: str
    sequence: int
    crc32c: int
    size_bytes: int
    cursors: int
    def __init__(self, path: _Optional[str] = ..., sequence: _Optional[int] = ..., crc32c: _Optional[int] = ..., size_bytes: _Optional[int] = ..., cursors: _Optional[int] = ...) -> None: ...

class CursorPointer(_message.Message):
    __slots__ = ("sequence", "full", "deltas", "written_ms")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_MS_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    full: CursorFileRef
    deltas: _containers.RepeatedCompositeFieldContainer[CursorFileRef]
    written_ms: int
    def __init__(self, sequence: _Optional[int] = ..., full: _Optional[_Union[CursorFileRef, _Mapping]] = ..., deltas: _Optional[_Iterable[_Union[CursorFileRef, _Mapping]]] = ..., written_ms: _Optional[int] = ...) -> None: ...
