from shadowtopic.pb.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TopicKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOPIC_KIND_UNSPECIFIED: _ClassVar[TopicKind]
    SOURCE: _ClassVar[TopicKind]
    SHADOW: _ClassVar[TopicKind]

class CompactionPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPACTION_PHASE_UNSPECIFIED: _ClassVar[CompactionPhase]
    PENDING: _ClassVar[CompactionPhase]
    SEALING: _ClassVar[CompactionPhase]
    SCANNING_KEYS: _ClassVar[CompactionPhase]
    WRITING: _ClassVar[CompactionPhase]
    COMMITTING: _ClassVar[CompactionPhase]
    DONE: _ClassVar[CompactionPhase]
    FAILED: _ClassVar[CompactionPhase]
TOPIC_KIND_UNSPECIFIED: TopicKind
SOURCE: TopicKind
SHADOW: TopicKind
COMPACTION_PHASE_UNSPECIFIED: CompactionPhase
PENDING: CompactionPhase
SEALING: CompactionPhase
SCANNING_KEYS: CompactionPhase
WRITING: CompactionPhase
COMMITTING: CompactionPhase
DONE: CompactionPhase
FAILED: CompactionPhase

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("topic", "partitions", "policies", "properties")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: int
    policies: _common_pb2.Policies
    properties: _containers.ScalarMap[str, str]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[int] = ..., policies: _Optional[_Union[_common_pb2.Policies, _Mapping]] = ..., properties: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("topic", "force")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    force: bool
    def __init__(self, topic: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class TopicMetadata(_message.Message):
    __slots__ = ("topic", "kind", "partitions", "source", "properties", "policies")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    kind: TopicKind
    partitions: int
    source: str
    properties: _containers.ScalarMap[str, str]
    policies: _common_pb2.Policies
    def __init__(self, topic: _Optional[str] = ..., kind: _Optional[_Union[TopicKind, str]] = ..., partitions: _Optional[int] = ..., source: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ..., policies: _Optional[_Union[_common_pb2.Policies, _Mapping]] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ("namespace", "page")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    page: _common_pb2.PageRequest
    def __init__(self, namespace: _Optional[str] = ..., page: _Optional[_Union[_common_pb2.PageRequest, _Mapping]] = ...) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics", "next_page_token")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicMetadata]
    next_page_token: str
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicMetadata, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SetPoliciesRequest(_message.Message):
    __slots__ = ("topic", "policies")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    policies: _common_pb2.Policies
    def __init__(self, topic: _Optional[str] = ..., policies: _Optional[_Union[_common_pb2.Policies, _Mapping]] = ...) -> None: ...

class NamespaceRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class SetNamespacePoliciesRequest(_message.Message):
    __slots__ = ("namespace", "policies", "remove")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    policies: _common_pb2.Policies
    remove: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., policies: _Optional[_Union[_common_pb2.Policies, _Mapping]] = ..., remove: _Optional[_Iterable[str]] = ...) -> None: ...

class NamespacePolicies(_message.Message):
    __slots__ = ("namespace", "policies")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    policies: _common_pb2.Policies
    def __init__(self, namespace: _Optional[str] = ..., policies: _Optional[_Union[_common_pb2.Policies, _Mapping]] = ...) -> None: ...

class PublisherStats(_message.Message):
    __slots__ = ("producer_name", "msg_rate_in", "msg_throughput_in", "address", "connected_since")
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    MSG_RATE_IN_FIELD_NUMBER: _ClassVar[int]
    MSG_THROUGHPUT_IN_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_SINCE_FIELD_NUMBER: _ClassVar[int]
    producer_name: str
    msg_rate_in: float
    msg_throughput_in: float
    address: str
    connected_since: str
    def __init__(self, producer_name: _Optional[str] = ..., msg_rate_in: _Optional[float] = ..., msg_throughput_in: _Optional[float] = ..., address: _Optional[str] = ..., connected_since: _Optional[str] = ...) -> None: ...

class ConsumerStats(_message.Message):
    __slots__ = ("consumer_name", "msg_rate_out", "available_permits", "unacked_messages", "address", "connected_since", "msg_throughput_out", "msg_rate_redeliver", "is_active", "key_hash_ranges")
    CONSUMER_NAME_FIELD_NUMBER: _ClassVar[int]
    MSG_RATE_OUT_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_PERMITS_FIELD_NUMBER: _ClassVar[int]
    UNACKED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_SINCE_FIELD_NUMBER: _ClassVar[int]
    MSG_THROUGHPUT_OUT_FIELD_NUMBER: _ClassVar[int]
    MSG_RATE_REDELIVER_FIELD_NUMBER: _ClassVar[int]
    IS_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    KEY_HASH_RANGES_FIELD_NUMBER: _ClassVar[int]
    consumer_name: str
    msg_rate_out: float
    available_permits: int
    unacked_messages: int
    address: str
    connected_since: str
    msg_throughput_out: float
    msg_rate_redeliver: float
    is_active: bool
    key_hash_ranges: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, consumer_name: _Optional[str] = ..., msg_rate_out: _Optional[float] = ..., available_permits: _Optional[int] = ..., unacked_messages: _Optional[int] = ..., address: _Optional[str] = ..., connected_since: _Optional[str] = ..., msg_throughput_out: _Optional[float] = ..., msg_rate_redeliver: _Optional[float] = ..., is_active: _Optional[bool] = ..., key_hash_ranges: _Optional[_Iterable[str]] = ...) -> None: ...

class SubscriptionStats(_message.Message):
    __slots__ = ("type", "msg_backlog", "backlog_size", "msg_rate_out", "msg_throughput_out", "msg_rate_redeliver", "unacked_messages", "durable", "consumers", "skipped_entries", "mark_delete_position", "read_position", "individually_acked_ranges", "msg_out_counter", "msg_redeliver_counter", "active_consumer", "msg_expired", "msg_evicted", "last_active", "backlog_quota_exceeded")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MSG_BACKLOG_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_SIZE_FIELD_NUMBER: _ClassVar[int]
    MSG_RATE_OUT_FIELD_NUMBER: _ClassVar[int]
    MSG_THROUGHPUT_OUT_FIELD_NUMBER: _ClassVar[int]
    MSG_RATE_REDELIVER_FIELD_NUMBER: _ClassVar[int]
    UNACKED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MARK_DELETE_POSITION_FIELD_NUMBER: _ClassVar[int]
    READ_POSITION_FIELD_NUMBER: _ClassVar[int]
    INDIVIDUALLY_ACKED_RANGES_FIELD_NUMBER: _ClassVar[int]
    MSG_OUT_COUNTER_FIELD_NUMBER: _ClassVar[int]
    MSG_REDELIVER_COUNTER_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CONSUMER_FIELD_NUMBER: _ClassVar[int]
    MSG_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    MSG_EVICTED_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_QUOTA_EXCEEDED_FIELD_NUMBER: _ClassVar[int]
    type: str
    msg_backlog: int
    backlog_size: int
    msg_rate_out: float
    msg_throughput_out: float
    msg_rate_redeliver: float
    unacked_messages: int
    durable: bool
    consumers: _containers.RepeatedCompositeFieldContainer[ConsumerStats]
    skipped_entries: int
    mark_delete_position: str
    read_position: str
    individually_acked_ranges: int
    msg_out_counter: int
    msg_redeliver_counter: int
    active_consumer: str
    msg_expired: int
    msg_evicted: int
    last_active: int
    backlog_quota_exceeded: bool
    def __init__(self, type: _Optional[str] = ..., msg_backlog: _Optional[int] = ..., backlog_size: _Optional[int] = ..., msg_rate_out: _Optional[float] = ..., msg_throughput_out: _Optional[float] = ..., msg_rate_redeliver: _Optional[float] = ..., unacked_messages: _Optional[int] = ..., durable: _Optional[bool] = ..., consumers: _Optional[_Iterable[_Union[ConsumerStats, _Mapping]]] = ..., skipped_entries: _Optional[int] = ..., mark_delete_position: _Optional[str] = ..., read_position: _Optional[str] = ..., individually_acked_ranges: _Optional[int] = ..., msg_out_counter: _Optional[int] = ..., msg_redeliver_counter: _Optional[int] = ..., active_consumer: _Optional[str] = ..., msg_expired: _Optional[int] = ..., msg_evicted: _Optional[int] = ..., last_active: _Optional[int] = ..., backlog_quota_exceeded: _Optional[bool] = ...) -> None: ...

class ReplicatorStats(_message.Message):
    __slots__ = ("msg_rate_out", "replication_backlog", "replication_delay_in_seconds", "connected", "last_error", "replicated_position", "msg_out_counter", "auto_resets")
    MSG_RATE_OUT_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_BACKLOG_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_DELAY_IN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_POSITION_FIELD_NUMBER: _ClassVar[int]
    MSG_OUT_COUNTER_FIELD_NUMBER: _ClassVar[int]
    AUTO_RESETS_FIELD_NUMBER: _ClassVar[int]
    msg_rate_out: float
    replication_backlog: int
    replication_delay_in_seconds: float
    connected: bool
    last_error: _common_pb2.ErrorStatus
    replicated_position: str
    msg_out_counter: int
    auto_resets: int
    def __init__(self, msg_rate_out: _Optional[float] = ..., replication_backlog: _Optional[int] = ..., replication_delay_in_seconds: _Optional[float] = ..., connected: _Optional[bool] = ..., last_error: _Optional[_Union[_common_pb2.ErrorStatus, _Mapping]] = ..., replicated_position: _Optional[str] = ..., msg_out_counter: _Optional[int] = ..., auto_resets: _Optional[int] = ...) -> None: ...

class TopicStats(_message.Message):
    __slots__ = ("topic", "msg_rate_in", "msg_throughput_in", "msg_rate_out", "msg_throughput_out", "average_msg_size", "storage_size", "backlog_size", "msg_in_counter", "bytes_in_counter", "msg_out_counter", "bytes_out_counter", "owner_broker", "topic_epoch", "publishers", "subscriptions", "shadow_replication", "kind", "source", "backlog_quota_exceeded")
    class SubscriptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: SubscriptionStats
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[SubscriptionStats, _Mapping]] = ...) -> None: ...
    class ShadowReplicationEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ReplicatorStats
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ReplicatorStats, _Mapping]] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MSG_RATE_IN_FIELD_NUMBER: _ClassVar[int]
    MSG_THROUGHPUT_IN_FIELD_NUMBER: _ClassVar[int]
    MSG_RATE_OUT_FIELD_NUMBER: _ClassVar[int]
    MSG_THROUGHPUT_OUT_FIELD_NUMBER: _ClassVar[int]
    AVERAGE_MSG_SIZE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_SIZE_FIELD_NUMBER: _ClassVar[int]
    MSG_IN_COUNTER_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_COUNTER_FIELD_NUMBER: _ClassVar[int]
    MSG_OUT_COUNTER_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_COUNTER_FIELD_NUMBER: _ClassVar[int]
    OWNER_BROKER_FIELD_NUMBER: _ClassVar[int]
    TOPIC_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PUBLISHERS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_REPLICATION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_QUOTA_EXCEEDED_FIELD_NUMBER: _ClassVar[int]
    topic: str
    msg_rate_in: float
    msg_throughput_in: float
    msg_rate_out: float
    msg_throughput_out: float
    average_msg_size: float
    storage_size: int
    backlog_size: int
    msg_in_counter: int
    bytes_in_counter: int
    msg_out_counter: int
    bytes_out_counter: int
    owner_broker: str
    topic_epoch: int
    publishers: _containers.RepeatedCompositeFieldContainer[PublisherStats]
    subscriptions: _containers.MessageMap[str, SubscriptionStats]
    shadow_replication: _containers.MessageMap[str, ReplicatorStats]
    kind: TopicKind
    source: str
    backlog_quota_exceeded: bool
    def __init__(self, topic: _Optional[str] = ..., msg_rate_in: _Optional[float] = ..., msg_throughput_in: _Optional[float] = ..., msg_rate_out: _Optional[float] = ..., msg_throughput_out: _Optional[float] = ..., average_msg_size: _Optional[float] = ..., storage_size: _Optional[int] = ..., backlog_size: _Optional[int] = ..., msg_in_counter: _Optional[int] = ..., bytes_in_counter: _Optional[int] = ..., msg_out_counter: _Optional[int] = ..., bytes_out_counter: _Optional[int] = ..., owner_broker: _Optional[str] = ..., topic_epoch: _Optional[int] = ..., publishers: _Optional[_Iterable[_Union[PublisherStats, _Mapping]]] = ..., subscriptions: _Optional[_Mapping[str, SubscriptionStats]] = ..., shadow_replication: _Optional[_Mapping[str, ReplicatorStats]] = ..., kind: _Optional[_Union[TopicKind, str]] = ..., source: _Optional[str] = ..., backlog_quota_exceeded: _Optional[bool] = ...) -> None: ...

class LedgerStats(_message.Message):
    __slots__ = ("ledger_id", "entries", "size", "state", "path", "created_time", "sealed_time")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CREATED_TIME_FIELD_NUMBER: _ClassVar[int]
    SEALED_TIME_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entries: int
    size: int
    state: str
    path: str
    created_time: int
    sealed_time: int
    def __init__(self, ledger_id: _Optional[int] = ..., entries: _Optional[int] = ..., size: _Optional[int] = ..., state: _Optional[str] = ..., path: _Optional[str] = ..., created_time: _Optional[int] = ..., sealed_time: _Optional[int] = ...) -> None: ...

class CursorStats(_message.Message):
    __slots__ = ("mark_delete_position", "read_position", "messages_consumed_counter", "individually_deleted_messages", "cursor_flushes", "cursors_unsaved", "cohort_size")
    MARK_DELETE_POSITION_FIELD_NUMBER: _ClassVar[int]
    READ_POSITION_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_CONSUMED_COUNTER_FIELD_NUMBER: _ClassVar[int]
    INDIVIDUALLY_DELETED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FLUSHES_FIELD_NUMBER: _ClassVar[int]
    CURSORS_UNSAVED_FIELD_NUMBER: _ClassVar[int]
    COHORT_SIZE_FIELD_NUMBER: _ClassVar[int]
    mark_delete_position: str
    read_position: str
    messages_consumed_counter: int
    individually_deleted_messages: str
    cursor_flushes: int
    cursors_unsaved: int
    cohort_size: int
    def __init__(self, mark_delete_position: _Optional[str] = ..., read_position: _Optional[str] = ..., messages_consumed_counter: _Optional[int] = ..., individually_deleted_messages: _Optional[str] = ..., cursor_flushes: _Optional[int] = ..., cursors_unsaved: _Optional[int] = ..., cohort_size: _Optional[int] = ...) -> None: ...

class InternalStats(_message.Message):
    __slots__ = ("entries_added_counter", "number_of_entries", "total_size", "current_ledger_entries", "current_ledger_size", "last_confirmed_entry", "state", "ledgers", "cursors", "compacted_ledger", "entry_cache")
    class CursorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: CursorStats
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[CursorStats, _Mapping]] = ...) -> None: ...
    ENTRIES_ADDED_COUNTER_FIELD_NUMBER: _ClassVar[int]
    NUMBER_OF_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEDGER_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEDGER_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAST_CONFIRMED_ENTRY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LEDGERS_FIELD_NUMBER: _ClassVar[int]
    CURSORS_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_LEDGER_FIELD_NUMBER: _ClassVar[int]
    ENTRY_CACHE_FIELD_NUMBER: _ClassVar[int]
    entries_added_counter: int
    number_of_entries: int
    total_size: int
    current_ledger_entries: int
    current_ledger_size: int
    last_confirmed_entry: str
    state: str
    ledgers: _containers.RepeatedCompositeFieldContainer[LedgerStats]
    cursors: _containers.MessageMap[str, CursorStats]
    compacted_ledger: str
    entry_cache: EntryCacheStats
    def __init__(self, entries_added_counter: _Optional[int] = ..., number_of_entries: _Optional[int] = ..., total_size: _Optional[int] = ..., current_ledger_entries: _Optional[int] = ..., current_ledger_size: _Optional[int] = ..., last_confirmed_entry: _Optional[str] = ..., state: _Optional[str] = ..., ledgers: _Optional[_Iterable[_Union[LedgerStats, _Mapping]]] = ..., cursors: _Optional[_Mapping[str, CursorStats]] = ..., compacted_ledger: _Optional[str] = ..., entry_cache: _Optional[_Union[EntryCacheStats, _Mapping]] = ...) -> None: ...

class EntryCacheStats(_message.Message):
    __slots__ = ("limit", "held", "peak", "items", "evictions", "evicted_bytes")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    PEAK_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    limit: int
    held: int
    peak: int
    items: int
    evictions: int
    evicted_bytes: int
    def __init__(self, limit: _Optional[int] = ..., held: _Optional[int] = ..., peak: _Optional[int] = ..., items: _Optional[int] = ..., evictions: _Optional[int] = ..., evicted_bytes: _Optional[int] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("broker_url", "broker_id", "epoch", "redirect")
    BROKER_URL_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    broker_url: str
    broker_id: str
    epoch: int
    redirect: bool
    def __init__(self, broker_url: _Optional[str] = ..., broker_id: _Optional[str] = ..., epoch: _Optional[int] = ..., redirect: _Optional[bool] = ...) -> None: ...

class TruncateResponse(_message.Message):
    __slots__ = ("ledgers_deleted", "entries_deleted")
    LEDGERS_DELETED_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_DELETED_FIELD_NUMBER: _ClassVar[int]
    ledgers_deleted: int
    entries_deleted: int
    def __init__(self, ledgers_deleted: _Optional[int] = ..., entries_deleted: _Optional[int] = ...) -> None: ...

class CreateShadowTopicRequest(_message.Message):
    __slots__ = ("shadow", "source", "properties")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    shadow: str
    source: str
    properties: _containers.ScalarMap[str, str]
    def __init__(self, shadow: _Optional[str] = ..., source: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ShadowTopicsResponse(_message.Message):
    __slots__ = ("shadows",)
    SHADOWS_FIELD_NUMBER: _ClassVar[int]
    shadows: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, shadows: _Optional[_Iterable[str]] = ...) -> None: ...

class ShadowSourceResponse(_message.Message):
    __slots__ = ("source",)
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    source: str
    def __init__(self, source: _Optional[str] = ...) -> None: ...

class CreateSubscriptionRequest(_message.Message):
    __slots__ = ("topic", "subscription", "start")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    start: _common_pb2.StartPosition
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., start: _Optional[_Union[_common_pb2.StartPosition, _Mapping]] = ...) -> None: ...

class SubscriptionChange(_message.Message):
    __slots__ = ("mark_delete_position", "msg_backlog", "entries_acked", "consumers", "dry_run")
    MARK_DELETE_POSITION_FIELD_NUMBER: _ClassVar[int]
    MSG_BACKLOG_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_ACKED_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    mark_delete_position: str
    msg_backlog: int
    entries_acked: int
    consumers: int
    dry_run: bool
    def __init__(self, mark_delete_position: _Optional[str] = ..., msg_backlog: _Optional[int] = ..., entries_acked: _Optional[int] = ..., consumers: _Optional[int] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class SubscriptionRequest(_message.Message):
    __slots__ = ("topic", "subscription")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ...) -> None: ...

class DeleteSubscriptionRequest(_message.Message):
    __slots__ = ("topic", "subscription", "force", "dry_run")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    force: bool
    dry_run: bool
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., force: _Optional[bool] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ClearBacklogRequest(_message.Message):
    __slots__ = ("topic", "subscription", "dry_run")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    dry_run: bool
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class GetLastMessageIdRequest(_message.Message):
    __slots__ = ("topic", "subscription", "read_compacted")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    READ_COMPACTED_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    read_compacted: bool
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., read_compacted: _Optional[bool] = ...) -> None: ...

class ListSubscriptionsRequest(_message.Message):
    __slots__ = ("topic", "page")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    page: _common_pb2.PageRequest
    def __init__(self, topic: _Optional[str] = ..., page: _Optional[_Union[_common_pb2.PageRequest, _Mapping]] = ...) -> None: ...

class ListSubscriptionsResponse(_message.Message):
    __slots__ = ("subscriptions", "next_page_token")
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedScalarFieldContainer[str]
    next_page_token: str
    def __init__(self, subscriptions: _Optional[_Iterable[str]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ResetCursorRequest(_message.Message):
    __slots__ = ("topic", "subscription", "position", "dry_run")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    position: _common_pb2.StartPosition
    dry_run: bool
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., position: _Optional[_Union[_common_pb2.StartPosition, _Mapping]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ResetCursorResponse(_message.Message):
    __slots__ = ("position", "clamped")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    CLAMPED_FIELD_NUMBER: _ClassVar[int]
    position: _common_pb2.MessageIdData
    clamped: bool
    def __init__(self, position: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ..., clamped: _Optional[bool] = ...) -> None: ...

class SkipRequest(_message.Message):
    __slots__ = ("topic", "subscription", "count", "dry_run")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    count: int
    dry_run: bool
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., count: _Optional[int] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class PeekMessagesRequest(_message.Message):
    __slots__ = ("topic", "subscription", "count")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    count: int
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class PeekMessagesResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[_common_pb2.EncodedEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[_common_pb2.EncodedEntry, _Mapping]]] = ...) -> None: ...

class CompactResponse(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CompactionJob(_message.Message):
    __slots__ = ("job_id", "topic", "phase", "entries_read", "entries_total", "keys", "bytes_written", "error", "start_time", "end_time", "horizon", "entries_written", "bytes_read", "tasks_done", "tasks_total", "trigger", "worker", "input_ledgers", "previous_job_id", "peak_rss_bytes", "tombstone_cutoff_ms", "compute_ms")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_READ_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    HORIZON_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    TASKS_DONE_FIELD_NUMBER: _ClassVar[int]
    TASKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    INPUT_LEDGERS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PEAK_RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONE_CUTOFF_MS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    topic: str
    phase: CompactionPhase
    entries_read: int
    entries_total: int
    keys: int
    bytes_written: int
    error: _common_pb2.ErrorStatus
    start_time: int
    end_time: int
    horizon: _common_pb2.MessageIdData
    entries_written: int
    bytes_read: int
    tasks_done: int
    tasks_total: int
    trigger: str
    worker: str
    input_ledgers: int
    previous_job_id: str
    peak_rss_bytes: int
    tombstone_cutoff_ms: int
    compute_ms: int
    def __init__(self, job_id: _Optional[str] = ..., topic: _Optional[str] = ..., phase: _Optional[_Union[CompactionPhase, str]] = ..., entries_read: _Optional[int] = ..., entries_total: _Optional[int] = ..., keys: _Optional[int] = ..., bytes_written: _Optional[int] = ..., error: _Optional[_Union[_common_pb2.ErrorStatus, _Mapping]] = ..., start_time: _Optional[int] = ..., end_time: _Optional[int] = ..., horizon: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ..., entries_written: _Optional[int] = ..., bytes_read: _Optional[int] = ..., tasks_done: _Optional[int] = ..., tasks_total: _Optional[int] = ..., trigger: _Optional[str] = ..., worker: _Optional[str] = ..., input_ledgers: _Optional[int] = ..., previous_job_id: _Optional[str] = ..., peak_rss_bytes: _Optional[int] = ..., tombstone_cutoff_ms: _Optional[int] = ..., compute_ms: _Optional[int] = ...) -> None: ...

class PermissionRequest(_message.Message):
    __slots__ = ("topic", "role", "actions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    role: str
    actions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topic: _Optional[str] = ..., role: _Optional[str] = ..., actions: _Optional[_Iterable[str]] = ...) -> None: ...

class PermissionsResponse(_message.Message):
    __slots__ = ("roles",)
    class RolesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: RoleActions
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[RoleActions, _Mapping]] = ...) -> None: ...
    ROLES_FIELD_NUMBER: _ClassVar[int]
    roles: _containers.MessageMap[str, RoleActions]
    def __init__(self, roles: _Optional[_Mapping[str, RoleActions]] = ...) -> None: ...

class RoleActions(_message.Message):
    __slots__ = ("actions",)
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    actions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, actions: _Optional[_Iterable[str]] = ...) -> None: ...

class TenantRequest(_message.Message):
    __slots__ = ("tenant", "admin_roles")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ADMIN_ROLES_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    admin_roles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant: _Optional[str] = ..., admin_roles: _Optional[_Iterable[str]] = ...) -> None: ...

class TenantInfo(_message.Message):
    __slots__ = ("tenant", "admin_roles")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ADMIN_ROLES_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    admin_roles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant: _Optional[str] = ..., admin_roles: _Optional[_Iterable[str]] = ...) -> None: ...

class ListTenantsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTenantsResponse(_message.Message):
    __slots__ = ("tenants",)
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[TenantInfo]
    def __init__(self, tenants: _Optional[_Iterable[_Union[TenantInfo, _Mapping]]] = ...) -> None: ...

class ListNamespacesRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class ListNamespacesResponse(_message.Message):
    __slots__ = ("namespaces",)
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    namespaces: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespaces: _Optional[_Iterable[str]] = ...) -> None: ...
