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

class BacklogQuotaAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BACKLOG_QUOTA_ACTION_UNSPECIFIED: _ClassVar[BacklogQuotaAction]
    BACKLOG_QUOTA_PRODUCER_REQUEST_HOLD: _ClassVar[BacklogQuotaAction]
    BACKLOG_QUOTA_PRODUCER_EXCEPTION: _ClassVar[BacklogQuotaAction]
    BACKLOG_QUOTA_CONSUMER_BACKLOG_EVICTION: _ClassVar[BacklogQuotaAction]

class LedgerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEDGER_STATE_UNSPECIFIED: _ClassVar[LedgerState]
    SEALED: _ClassVar[LedgerState]
    OPEN: _ClassVar[LedgerState]

class CompactionJobPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPACTION_JOB_PHASE_UNSPECIFIED: _ClassVar[CompactionJobPhase]
    JOB_PENDING: _ClassVar[CompactionJobPhase]
    JOB_SEALING: _ClassVar[CompactionJobPhase]
    JOB_SCANNING_KEYS: _ClassVar[CompactionJobPhase]
    JOB_WRITING: _ClassVar[CompactionJobPhase]
    JOB_COMMITTING: _ClassVar[CompactionJobPhase]
    JOB_DONE: _ClassVar[CompactionJobPhase]
    JOB_FAILED: _ClassVar[CompactionJobPhase]

class SubscriptionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUBSCRIPTION_TYPE_UNSPECIFIED: _ClassVar[SubscriptionType]
    EXCLUSIVE: _ClassVar[SubscriptionType]
    SHARED: _ClassVar[SubscriptionType]
    FAILOVER: _ClassVar[SubscriptionType]
    KEY_SHARED: _ClassVar[SubscriptionType]
TOPIC_KIND_UNSPECIFIED: TopicKind
SOURCE: TopicKind
SHADOW: TopicKind
BACKLOG_QUOTA_ACTION_UNSPECIFIED: BacklogQuotaAction
BACKLOG_QUOTA_PRODUCER_REQUEST_HOLD: BacklogQuotaAction
BACKLOG_QUOTA_PRODUCER_EXCEPTION: BacklogQuotaAction
BACKLOG_QUOTA_CONSUMER_BACKLOG_EVICTION: BacklogQuotaAction
LEDGER_STATE_UNSPECIFIED: LedgerState
SEALED: LedgerState
OPEN: LedgerState
COMPACTION_JOB_PHASE_UNSPECIFIED: CompactionJobPhase
JOB_PENDING: CompactionJobPhase
JOB_SEALING: CompactionJobPhase
JOB_SCANNING_KEYS: CompactionJobPhase
JOB_WRITING: CompactionJobPhase
JOB_COMMITTING: CompactionJobPhase
JOB_DONE: CompactionJobPhase
JOB_FAILED: CompactionJobPhase
SUBSCRIPTION_TYPE_UNSPECIFIED: SubscriptionType
EXCLUSIVE: SubscriptionType
SHARED: SubscriptionType
FAILOVER: SubscriptionType
KEY_SHARED: SubscriptionType

class TopicInfo(_message.Message):
    __slots__ = ("name", "kind", "source", "properties", "policies", "partitions", "partition_of", "partition_index", "created_ms")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_OF_FIELD_NUMBER: _ClassVar[int]
    PARTITION_INDEX_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: TopicKind
    source: str
    properties: _containers.ScalarMap[str, str]
    policies: Policies
    partitions: int
    partition_of: str
    partition_index: int
    created_ms: int
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[TopicKind, str]] = ..., source: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ..., policies: _Optional[_Union[Policies, _Mapping]] = ..., partitions: _Optional[int] = ..., partition_of: _Optional[str] = ..., partition_index: _Optional[int] = ..., created_ms: _Optional[int] = ...) -> None: ...

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

class LedgerInfo(_message.Message):
    __slots__ = ("ledger_id", "state", "entries", "size_bytes", "path", "wal_path", "created_ms", "sealed_ms", "crc32c", "first_publish_ms", "last_publish_ms", "wal_objects")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    WAL_PATH_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    SEALED_MS_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    FIRST_PUBLISH_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_PUBLISH_MS_FIELD_NUMBER: _ClassVar[int]
    WAL_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    state: LedgerState
    entries: int
    size_bytes: int
    path: str
    wal_path: str
    created_ms: int
    sealed_ms: int
    crc32c: int
    first_publish_ms: int
    last_publish_ms: int
    wal_objects: bool
    def __init__(self, ledger_id: _Optional[int] = ..., state: _Optional[_Union[LedgerState, str]] = ..., entries: _Optional[int] = ..., size_bytes: _Optional[int] = ..., path: _Optional[str] = ..., wal_path: _Optional[str] = ..., created_ms: _Optional[int] = ..., sealed_ms: _Optional[int] = ..., crc32c: _Optional[int] = ..., first_publish_ms: _Optional[int] = ..., last_publish_ms: _Optional[int] = ..., wal_objects: _Optional[bool] = ...) -> None: ...

class WalCommit(_message.Message):
    __slots__ = ("object", "offset", "length", "first_entry_id", "count")
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    object: str
    offset: int
    length: int
    first_entry_id: int
    count: int
    def __init__(self, object: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., first_entry_id: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class LedgerList(_message.Message):
    __slots__ = ("ledgers", "writer_epoch", "entries_added", "entries_deleted", "dedup")
    LEDGERS_FIELD_NUMBER: _ClassVar[int]
    WRITER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_ADDED_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_DELETED_FIELD_NUMBER: _ClassVar[int]
    DEDUP_FIELD_NUMBER: _ClassVar[int]
    ledgers: _containers.RepeatedCompositeFieldContainer[LedgerInfo]
    writer_epoch: int
    entries_added: int
    entries_deleted: int
    dedup: DedupSnapshot
    def __init__(self, ledgers: _Optional[_Iterable[_Union[LedgerInfo, _Mapping]]] = ..., writer_epoch: _Optional[int] = ..., entries_added: _Optional[int] = ..., entries_deleted: _Optional[int] = ..., dedup: _Optional[_Union[DedupSnapshot, _Mapping]] = ...) -> None: ...

class DedupSnapshot(_message.Message):
    __slots__ = ("ledger_id", "producers")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    producers: _containers.RepeatedCompositeFieldContainer[ProducerSequence]
    def __init__(self, ledger_id: _Optional[int] = ..., producers: _Optional[_Iterable[_Union[ProducerSequence, _Mapping]]] = ...) -> None: ...

class ProducerSequence(_message.Message):
    __slots__ = ("producer_name", "sequence_id", "last_ms")
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_MS_FIELD_NUMBER: _ClassVar[int]
    producer_name: str
    sequence_id: int
    last_ms: int
    def __init__(self, producer_name: _Optional[str] = ..., sequence_id: _Optional[int] = ..., last_ms: _Optional[int] = ...) -> None: ...

class Ownership(_message.Message):
    __slots__ = ("broker_id", "broker_url", "epoch", "acquired_ms")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_URL_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_MS_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    broker_url: str
    epoch: int
    acquired_ms: int
    def __init__(self, broker_id: _Optional[str] = ..., broker_url: _Optional[str] = ..., epoch: _Optional[int] = ..., acquired_ms: _Optional[int] = ...) -> None: ...

class BrokerInfo(_message.Message):
    __slots__ = ("broker_id", "url", "roles", "started_ms", "metrics_url", "topics", "subscriptions", "load_ms", "wal_objects")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    STARTED_MS_FIELD_NUMBER: _ClassVar[int]
    METRICS_URL_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    LOAD_MS_FIELD_NUMBER: _ClassVar[int]
    WAL_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    url: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    started_ms: int
    metrics_url: str
    topics: int
    subscriptions: int
    load_ms: int
    wal_objects: bool
    def __init__(self, broker_id: _Optional[str] = ..., url: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., started_ms: _Optional[int] = ..., metrics_url: _Optional[str] = ..., topics: _Optional[int] = ..., subscriptions: _Optional[int] = ..., load_ms: _Optional[int] = ..., wal_objects: _Optional[bool] = ...) -> None: ...

class ShadowList(_message.Message):
    __slots__ = ("shadows",)
    SHADOWS_FIELD_NUMBER: _ClassVar[int]
    shadows: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, shadows: _Optional[_Iterable[str]] = ...) -> None: ...

class CompactionPointer(_message.Message):
    __slots__ = ("manifest_path", "horizon", "job_id", "published_ms", "manifest")
    MANIFEST_PATH_FIELD_NUMBER: _ClassVar[int]
    HORIZON_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_MS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    manifest_path: str
    horizon: _common_pb2.MessageIdData
    job_id: str
    published_ms: int
    manifest: CompactedManifest
    def __init__(self, manifest_path: _Optional[str] = ..., horizon: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ..., job_id: _Optional[str] = ..., published_ms: _Optional[int] = ..., manifest: _Optional[_Union[CompactedManifest, _Mapping]] = ...) -> None: ...

class CompactedFile(_message.Message):
    __slots__ = ("path", "rows", "first", "last", "size_bytes", "crc32c")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    path: str
    rows: int
    first: _common_pb2.MessageIdData
    last: _common_pb2.MessageIdData
    size_bytes: int
    crc32c: int
    def __init__(self, path: _Optional[str] = ..., rows: _Optional[int] = ..., first: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ..., last: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ..., size_bytes: _Optional[int] = ..., crc32c: _Optional[int] = ...) -> None: ...

class CompactedManifest(_message.Message):
    __slots__ = ("job_id", "topic", "horizon", "files", "entries", "keys", "input_entries", "input_bytes", "output_bytes", "input_ledgers", "previous_job_id", "retain_null_key", "created_ms", "tombstone_cutoff_ms", "tombstones")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    HORIZON_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    INPUT_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    INPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    INPUT_LEDGERS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RETAIN_NULL_KEY_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONE_CUTOFF_MS_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    topic: str
    horizon: _common_pb2.MessageIdData
    files: _containers.RepeatedCompositeFieldContainer[CompactedFile]
    entries: int
    keys: int
    input_entries: int
    input_bytes: int
    output_bytes: int
    input_ledgers: _containers.RepeatedScalarFieldContainer[int]
    previous_job_id: str
    retain_null_key: bool
    created_ms: int
    tombstone_cutoff_ms: int
    tombstones: int
    def __init__(self, job_id: _Optional[str] = ..., topic: _Optional[str] = ..., horizon: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ..., files: _Optional[_Iterable[_Union[CompactedFile, _Mapping]]] = ..., entries: _Optional[int] = ..., keys: _Optional[int] = ..., input_entries: _Optional[int] = ..., input_bytes: _Optional[int] = ..., output_bytes: _Optional[int] = ..., input_ledgers: _Optional[_Iterable[int]] = ..., previous_job_id: _Optional[str] = ..., retain_null_key: _Optional[bool] = ..., created_ms: _Optional[int] = ..., tombstone_cutoff_ms: _Optional[int] = ..., tombstones: _Optional[int] = ...) -> None: ...

class CompactionRequest(_message.Message):
    __slots__ = ("topic", "job_id", "horizon", "storage_root", "trigger", "requested_ms", "delete_retention_seconds")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    HORIZON_FIELD_NUMBER: _ClassVar[int]
    STORAGE_ROOT_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_MS_FIELD_NUMBER: _ClassVar[int]
    DELETE_RETENTION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    job_id: str
    horizon: _common_pb2.MessageIdData
    storage_root: str
    trigger: str
    requested_ms: int
    delete_retention_seconds: int
    def __init__(self, topic: _Optional[str] = ..., job_id: _Optional[str] = ..., horizon: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ..., storage_root: _Optional[str] = ..., trigger: _Optional[str] = ..., requested_ms: _Optional[int] = ..., delete_retention_seconds: _Optional[int] = ...) -> None: ...

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
    phase: CompactionJobPhase
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
    def __init__(self, job_id: _Optional[str] = ..., topic: _Optional[str] = ..., phase: _Optional[_Union[CompactionJobPhase, str]] = ..., entries_read: _Optional[int] = ..., entries_total: _Optional[int] = ..., keys: _Optional[int] = ..., bytes_written: _Optional[int] = ..., error: _Optional[_Union[_common_pb2.ErrorStatus, _Mapping]] = ..., start_time: _Optional[int] = ..., end_time: _Optional[int] = ..., horizon: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ..., entries_written: _Optional[int] = ..., bytes_read: _Optional[int] = ..., tasks_done: _Optional[int] = ..., tasks_total: _Optional[int] = ..., trigger: _Optional[str] = ..., worker: _Optional[str] = ..., input_ledgers: _Optional[int] = ..., previous_job_id: _Optional[str] = ..., peak_rss_bytes: _Optional[int] = ..., tombstone_cutoff_ms: _Optional[int] = ..., compute_ms: _Optional[int] = ...) -> None: ...

class SubscriptionMeta(_message.Message):
    __slots__ = ("name", "type", "created_ms", "initial_position", "read_compacted")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_POSITION_FIELD_NUMBER: _ClassVar[int]
    READ_COMPACTED_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: SubscriptionType
    created_ms: int
    initial_position: _common_pb2.MessageIdData
    read_compacted: bool
    def __init__(self, name: _Optional[str] = ..., type: _Optional[_Union[SubscriptionType, str]] = ..., created_ms: _Optional[int] = ..., initial_position: _Optional[_Union[_common_pb2.MessageIdData, _Mapping]] = ..., read_compacted: _Optional[bool] = ...) -> None: ...

class TenantInfo(_message.Message):
    __slots__ = ("admin_roles",)
    ADMIN_ROLES_FIELD_NUMBER: _ClassVar[int]
    admin_roles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, admin_roles: _Optional[_Iterable[str]] = ...) -> None: ...

class NamespaceInfo(_message.Message):
    __slots__ = ("created_ms",)
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    created_ms: int
    def __init__(self, created_ms: _Optional[int] = ...) -> None: ...

class Grants(_message.Message):
    __slots__ = ("roles",)
    class RolesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: GrantedActions
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[GrantedActions, _Mapping]] = ...) -> None: ...
    ROLES_FIELD_NUMBER: _ClassVar[int]
    roles: _containers.MessageMap[str, GrantedActions]
    def __init__(self, roles: _Optional[_Mapping[str, GrantedActions]] = ...) -> None: ...

class GrantedActions(_message.Message):
    __slots__ = ("actions",)
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    actions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, actions: _Optional[_Iterable[str]] = ...) -> None: ...
