from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CompressionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPRESSION_NONE: _ClassVar[CompressionType]
    COMPRESSION_LZ4: _ClassVar[CompressionType]
    COMPRESSION_ZSTD: _ClassVar[CompressionType]

class BacklogQuotaAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BACKLOG_QUOTA_ACTION_UNSPECIFIED: _ClassVar[BacklogQuotaAction]
    BACKLOG_QUOTA_PRODUCER_REQUEST_HOLD: _ClassVar[BacklogQuotaAction]
    BACKLOG_QUOTA_PRODUCER_EXCEPTION: _ClassVar[BacklogQuotaAction]
    BACKLOG_QUOTA_CONSUMER_BACKLOG_EVICTION: _ClassVar[BacklogQuotaAction]
COMPRESSION_NONE: CompressionType
COMPRESSION_LZ4: CompressionType
COMPRESSION_ZSTD: CompressionType
BACKLOG_QUOTA_ACTION_UNSPECIFIED: BacklogQuotaAction
BACKLOG_QUOTA_PRODUCER_REQUEST_HOLD: BacklogQuotaAction
BACKLOG_QUOTA_PRODUCER_EXCEPTION: BacklogQuotaAction
BACKLOG_QUOTA_CONSUMER_BACKLOG_EVICTION: BacklogQuotaAction

class MessageIdData(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "partition")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    partition: int
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., partition: _Optional[int] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("key", "payload", "properties", "event_time", "producer_name", "sequence_id", "compression", "uncompressed_size")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    UNCOMPRESSED_SIZE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    payload: bytes
    properties: _containers.ScalarMap[str, str]
    event_time: int
    producer_name: str
    sequence_id: int
    compression: CompressionType
    uncompressed_size: int
    def __init__(self, key: _Optional[bytes] = ..., payload: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ..., event_time: _Optional[int] = ..., producer_name: _Optional[str] = ..., sequence_id: _Optional[int] = ..., compression: _Optional[_Union[CompressionType, str]] = ..., uncompressed_size: _Optional[int] = ...) -> None: ...

class EncodedEntry(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "publish_time", "redelivery_count", "raw")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_FIELD_NUMBER: _ClassVar[int]
    REDELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    publish_time: int
    redelivery_count: int
    raw: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., publish_time: _Optional[int] = ..., redelivery_count: _Optional[int] = ..., raw: _Optional[bytes] = ...) -> None: ...

class StartPosition(_message.Message):
    __slots__ = ("earliest", "latest", "message_id", "publish_time")
    EARLIEST_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_FIELD_NUMBER: _ClassVar[int]
    earliest: bool
    latest: bool
    message_id: MessageIdData
    publish_time: int
    def __init__(self, earliest: _Optional[bool] = ..., latest: _Optional[bool] = ..., message_id: _Optional[_Union[MessageIdData, _Mapping]] = ..., publish_time: _Optional[int] = ...) -> None: ...

class Policies(_message.Message):
    __slots__ = ("retention_time_seconds", "retention_size_bytes", "max_message_size", "compaction_threshold_bytes", "retain_null_key", "replicator_auto_reset_backlog_entries", "ledger_max_entries", "ledger_max_bytes", "ledger_max_age_seconds", "max_producers", "max_subscriptions", "max_consumers", "retention_keeps_shadow_backlog", "delete_retention_seconds", "message_ttl_seconds", "backlog_quota_size_bytes", "backlog_quota_age_seconds", "backlog_quota_action", "subscription_expiration_seconds")
    RETENTION_TIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_THRESHOLD_BYTES_FIELD_NUMBER: _ClassVar[int]
    RETAIN_NULL_KEY_FIELD_NUMBER: _ClassVar[int]
    REPLICATOR_AUTO_RESET_BACKLOG_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LEDGER_MAX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LEDGER_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    LEDGER_MAX_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    MAX_SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_KEEPS_SHADOW_BACKLOG_FIELD_NUMBER: _ClassVar[int]
    DELETE_RETENTION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_QUOTA_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_QUOTA_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_QUOTA_ACTION_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_EXPIRATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    retention_time_seconds: int
    retention_size_bytes: int
    max_message_size: int
    compaction_threshold_bytes: int
    retain_null_key: bool
    replicator_auto_reset_backlog_entries: int
    ledger_max_entries: int
    ledger_max_bytes: int
    ledger_max_age_seconds: int
    max_producers: int
    max_subscriptions: int
    max_consumers: int
    retention_keeps_shadow_backlog: bool
    delete_retention_seconds: int
    message_ttl_seconds: int
    backlog_quota_size_bytes: int
    backlog_quota_age_seconds: int
    backlog_quota_action: BacklogQuotaAction
    subscription_expiration_seconds: int
    def __init__(self, retention_time_seconds: _Optional[int] = ..., retention_size_bytes: _Optional[int] = ..., max_message_size: _Optional[int] = ..., compaction_threshold_bytes: _Optional[int] = ..., retain_null_key: _Optional[bool] = ..., replicator_auto_reset_backlog_entries: _Optional[int] = ..., ledger_max_entries: _Optional[int] = ..., ledger_max_bytes: _Optional[int] = ..., ledger_max_age_seconds: _Optional[int] = ..., max_producers: _Optional[int] = ..., max_subscriptions: _Optional[int] = ..., max_consumers: _Optional[int] = ..., retention_keeps_shadow_backlog: _Optional[bool] = ..., delete_retention_seconds: _Optional[int] = ..., message_ttl_seconds: _Optional[int] = ..., backlog_quota_size_bytes: _Optional[int] = ..., backlog_quota_age_seconds: _Optional[int] = ..., backlog_quota_action: _Optional[_Union[BacklogQuotaAction, str]] = ..., subscription_expiration_seconds: _Optional[int] = ...) -> None: ...

class ErrorStatus(_message.Message):
    __slots__ = ("code", "reason", "message", "details")
    class DetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: str
    reason: str
    message: str
    details: _containers.ScalarMap[str, str]
    def __init__(self, code: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., details: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PageRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...
