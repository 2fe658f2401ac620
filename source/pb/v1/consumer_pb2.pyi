from shadowtopic.pb.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubscriptionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXCLUSIVE: _ClassVar[SubscriptionType]
    SHARED: _ClassVar[SubscriptionType]
    FAILOVER: _ClassVar[SubscriptionType]
    KEY_SHARED: _ClassVar[SubscriptionType]
EXCLUSIVE: SubscriptionType
SHARED: SubscriptionType
FAILOVER: SubscriptionType
KEY_SHARED: SubscriptionType

class ClientMessage(_message.Message):
    __slots__ = ("commands",)
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedCompositeFieldContainer[ClientCommand]
    def __init__(self, commands: _Optional[_Iterable[_Union[ClientCommand, _Mapping]]] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[ServerFrame]
    def __init__(self, frames: _Optional[_Iterable[_Union[ServerFrame, _Mapping]]] = ...) -> None: ...

class ClientCommand(_message.Message):
    __slots__ = ("handle", "subscribe", "flow", "ack", "nack", "seek", "unsubscribe", "close", "redeliver", "also")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    FLOW_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    SEEK_FIELD_NUMBER: _ClassVar[int]
    UNSUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    REDELIVER_FIELD_NUMBER: _ClassVar[int]
    ALSO_FIELD_NUMBER: _ClassVar[int]
    handle: int
    subscribe: Subscribe
    flow: Flow
    ack: Ack
    nack: Nack
    seek: Seek
    unsubscribe: Unsubscribe
    close: CloseHandle
    redeliver: RedeliverUnacknowledged
    also: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, handle: _Optional[int] = ..., subscribe: _Optional[_Union[Subscribe, _Mapping]] = ..., flow: _Optional[_Union[Flow, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., nack: _Optional[_Union[Nack, _Mapping]] = ..., seek: _Optional[_Union[Seek, _Mapping]] = ..., unsubscribe: _Optional[_Union[Unsubscribe, _Mapping]] = ..., close: _Optional[_Union[CloseHandle, _Mapping]] = ..., redeliver: _Optional[_Union[RedeliverUnacknowledged, _Mapping]] = ..., also: _Optional[_Iterable[int]] = ...) -> None: ...

class Subscribe(_message.Message):
    __slots__ = ("topic", "subscription", "type", "start", "start_inclusive", "read_compacted", "consumer_name", "priority")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    START_INCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    READ_COMPACTED_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_NAME_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    type: SubscriptionType
    start: _common_pb2.StartPosition
    start_inclusive: bool
    read_compacted: bool
    consumer_name: str
    priority: int
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., type: _Optional[_Union[SubscriptionType, str]] = ..., start: _Optional[_Union[_common_pb2.StartPosition, _Mapping]] = ..., start_inclusive: _Optional[bool] = ..., read_compacted: _Optional[bool] = ..., consumer_name: _Optional[str] = ..., priority: _Optional[int] = ...) -> None: ...

class Flow(_message.Message):
    __slots__ = ("permits",)
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    permits: int
    def __init__(self, permits: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("ids", "cumulative", "ranges", "request_id")
    IDS_FIELD_NUMBER: _ClassVar[int]
    CUMULATIVE_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedCompositeFieldContainer[_common_pb2.MessageIdData]
    cumulative: bool
    ranges: _containers.RepeatedCompositeFieldContainer[AckRange]
    request_id: int
    def __init__(self, ids: _Optional[_Iterable[_Union[_common_pb2.MessageIdData, _Mapping]]] = ..., cumulative: _Optional[bool] = ..., ranges: _Optional[_Iterable[_Union[AckRange, _Mapping]]] = ..., request_id: _Optional[int] = ...) -> None: ...

class AckRange(_message.Message):
    __slots__ = ("ledger_id", "first_entry", "last_entry")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    first_entry: int
    last_entry: int
    def __init__(self, ledger_id: _Optional[int] = ..., first_entry: _Optional[int] = ..., last_entry: _Optional[int] = ...) -> None: ...

class Nack(_message.Message):
    __slots__ = ("ids", "delay_ms")
    IDS_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedCompositeFieldContainer[_common_pb2.MessageIdData]
    delay_ms: int
    def __init__(self, ids: _Optional[_Iterable[_Union[_common_pb2.MessageIdData, _Mapping]]] = ..., delay_ms: _Optional[int] = ...) -> None: ...

class Seek(_message.Message):
    __slots__ = ("position",)
    POSITION_FIELD_NUMBER: _ClassVar[int]
    position: _common_pb2.StartPosition
    def __init__(self, position: _Optional[_Union[_common_pb2.StartPosition, _Mapping]] = ...) -> None: ...

class Unsubscribe(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CloseHandle(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RedeliverUnacknowledged(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerFrame(_message.Message):
    __slots__ = ("handles", "entries", "event", "redeliveries")
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    REDELIVERIES_FIELD_NUMBER: _ClassVar[int]
    handles: _containers.RepeatedScalarFieldContainer[int]
    entries: _containers.RepeatedCompositeFieldContainer[_common_pb2.EncodedEntry]
    event: Event
    redeliveries: _containers.RepeatedCompositeFieldContainer[Redelivery]
    def __init__(self, handles: _Optional[_Iterable[int]] = ..., entries: _Optional[_Iterable[_Union[_common_pb2.EncodedEntry, _Mapping]]] = ..., event: _Optional[_Union[Event, _Mapping]] = ..., redeliveries: _Optional[_Iterable[_Union[Redelivery, _Mapping]]] = ...) -> None: ...

class Redelivery(_message.Message):
    __slots__ = ("handle", "entry_index", "count")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    ENTRY_INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    handle: int
    entry_index: int
    count: int
    def __init__(self, handle: _Optional[int] = ..., entry_index: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("subscribed", "active_consumer_changed", "end_of_topic", "error", "seek_done", "closed", "warning", "ack_receipt")
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CONSUMER_CHANGED_FIELD_NUMBER: _ClassVar[int]
    END_OF_TOPIC_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SEEK_DONE_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    WARNING_FIELD_NUMBER: _ClassVar[int]
    ACK_RECEIPT_FIELD_NUMBER: _ClassVar[int]
    subscribed: Subscribed
    active_consumer_changed: ActiveConsumerChanged
    end_of_topic: EndOfTopic
    error: _common_pb2.ErrorStatus
    seek_done: SeekDone
    closed: HandleClosed
    warning: _common_pb2.ErrorStatus
    ack_receipt: AckReceipt
    def __init__(self, subscribed: _Optional[_Union[Subscribed, _Mapping]] = ..., active_consumer_changed: _Optional[_Union[ActiveConsumerChanged, _Mapping]] = ..., end_of_topic: _Optional[_Union[EndOfTopic, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.ErrorStatus, _Mapping]] = ..., seek_done: _Optional[_Union[SeekDone, _Mapping]] = ..., closed: _Optional[_Union[HandleClosed, _Mapping]] = ..., warning: _Optional[_Union[_common_pb2.ErrorStatus, _Mapping]] = ..., ack_receipt: _Optional[_Union[AckReceipt, _Mapping]] = ...) -> None: ...

class AckReceipt(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    def __init__(self, request_id: _Optional[int] = ...) -> None: ...

class Subscribed(_message.Message):
    __slots__ = ("topic", "last_message_id", "position", "created")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LAST_MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    topic: str
    last_message_id: _common_pb2.MessageIdData
    position: _common_pb2.MessageIdData
    created: bool
    def __init__(self, topic: _Optional[str] = ..., last_message_id: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ..., position: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class ActiveConsumerChanged(_message.Message):
    __slots__ = ("is_active",)
    IS_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    is_active: bool
    def __init__(self, is_active: _Optional[bool] = ...) -> None: ...

class EndOfTopic(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SeekDone(_message.Message):
    __slots__ = ("position", "clamped", "by_admin")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    CLAMPED_FIELD_NUMBER: _ClassVar[int]
    BY_ADMIN_FIELD_NUMBER: _ClassVar[int]
    position: _common_pb2.MessageIdData
    clamped: bool
    by_admin: bool
    def __init__(self, position: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ..., clamped: _Optional[bool] = ..., by_admin: _Optional[bool] = ...) -> None: ...

class HandleClosed(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
