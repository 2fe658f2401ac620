"""Topic policies: the domain type, defaults, allowed ranges, validation and protobuf conversion;
the limits of the other values a topic is created with (partitions, properties); and the hard
ceilings of what one produce request carries.

Stored per topic as only the fields a user set (`TopicInfo.policies`), and per namespace the
same way (source/metadata/namespace_policies.py), as the storage message `storage.v1.Policies`
(source/metadata/policies_record.py converts); `effective(namespace)` fills in, field by
field, the topic's own value, else the namespace's, else the default (DEFAULTS). Sizes are
bytes, times seconds. Every field has an explicit allowed range
(`RANGES`), inclusive, which also fits its protobuf type:

    retention_time_seconds                  -1 (keep forever) .. 100 years    int64
    retention_size_bytes                    -1 (no limit) .. 2^60 (1 EiB)     int64
    max_message_size                        1 .. MAX_MESSAGE_SIZE (5 MiB)     uint32
    compaction_threshold_bytes              0 (off) .. 2^60                   int64
    delete_retention_seconds                0 (drop at once) .. 100 years     int64
    replicator_auto_reset_backlog_entries   0 (never) .. 2^60                 int64
    ledger_max_entries                      1 .. 1e9                          uint64
    ledger_max_bytes                        1 .. 4 GiB                        uint64
    ledger_max_age_seconds                  1 .. 365 days                     uint64
    max_producers, max_subscriptions        0 (no limit) .. 1e6               uint32
    max_consumers (per subscription)        0 (no limit) .. 1e6               uint32
    retain_null_key                         a bool
    retention_keeps_shadow_backlog          a bool (default false)
    message_ttl_seconds                     0 (off) .. 100 years              int64
    backlog_quota_size_bytes                -1 (no limit) .. 2^60             int64
    backlog_quota_age_seconds               -1 (no limit) .. 100 years        int64
    backlog_quota_action                    1 .. 3 (a BacklogQuotaAction)     enum
    subscription_expiration_seconds         0 (never) .. 100 years            int64

Disk policies (Pulsar's; what they do: source/subscriptions/expiry.py, source/broker/quota.py):
`message_ttl_seconds` acknowledges, for every durable subscription, the messages published
longer ago than it; `backlog_quota_*` bounds the backlog of the slowest durable subscription
(its estimated bytes, the age of its oldest unacknowledged message) and says what happens
past it: `producer_request_hold` (default: produce requests wait), `producer_exception`
(they fail with `ProducerBlockedQuotaExceeded`) or `consumer_backlog_eviction` (the
subscriptions past it skip their oldest messages); `subscription_expiration_seconds`
deletes durable subscriptions that had no consumer for that long. A shadow applies them to
its own subscriptions; the producer actions do not apply to it (it takes no produce), and
its size quota counts the backlog in its source's sealed ledgers only (source/broker/quota.py).

`retention_keeps_shadow_backlog`: retention also keeps every ledger from the oldest position
the topic's shadows' durable subscriptions still need (each shadow broker publishes it in
etcd: `keys.shadow_needs`), so a lagging shadow subscription reads everything instead of
skipping what retention deleted. Off by default (a shadow that never reads would then hold
the source's ledgers forever). Truncate is explicit and still deletes every sealed ledger.

`delete_retention_seconds` (Kafka's delete.retention.ms; default 1 day): how long compaction
keeps a delete (a tombstone: a keyed message with an empty payload) in the compacted ledger,
counted from the tombstone's publish time to the job's request time (compaction/plan.py). A
reader or durable subscription that reaches the compacted head within that time of a delete
sees the delete, even when a compaction ran in between; 0 drops a key's tombstone at the
first compaction that reads it.

`validate()` raises `InvalidPolicies` naming the field and its range; `to_pb()` validates
first, so an out-of-range value never reaches protobuf's own ValueError.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from enum import IntEnum
from typing import Any

from shadowtopic.core.errors import InvalidArgument, InvalidPolicies
from shadowtopic.pb.v1 import common_pb2

#: hard ceiling of one message (gRPC's frame limit is set above it)
MAX_MESSAGE_SIZE = 5 << 20
#: messages in one produce request (the broker appends a request in one event-loop step)
MAX_BATCH_MESSAGES = 100_000
_DAY = 86_400

#: field -> (lowest, highest) allowed value, both inclusive
RANGES: dict[str, tuple[int, int]] = {
    "retention_time_seconds": (-1, 100 * 365 * _DAY),
    "retention_size_bytes": (-1, 1 << 60),
    "max_message_size": (1, MAX_MESSAGE_SIZE),
    "compaction_threshold_bytes": (0, 1 << 60),
    "delete_retention_seconds": (0, 100 * 365 * _DAY),
    "replicator_auto_reset_backlog_entries": (0, 1 << 60),
    "ledger_max_entries": (1, 1_000_000_000),
    "ledger_max_bytes": (1, 4 << 30),
    "ledger_max_age_seconds": (1, 365 * _DAY),
    "max_producers": (0, 1_000_000),
    "max_subscriptions": (0, 1_000_000),
    "max_consumers": (0, 1_000_000),

    "message_ttl_seconds": (0, 100 * 365 * _DAY),
    "backlog_quota_size_bytes": (-1, 1 << 60),
    "backlog_quota_age_seconds": (-1, 100 * 365 * _DAY),
    "subscription_expiration_seconds": (0, 100 * 365 * _DAY),
    "backlog_quota_action": (1, 3),
}

#: the policies that are booleans (every other field has a range in RANGES)
BOOL_FIELDS = ("retain_null_key", "retention_keeps_shadow_backlog")


class BacklogQuotaAction(IntEnum):
    """What a broker does while a topic's backlog quota is exceeded (the values of the
    protobuf enum `BacklogQuotaAction`; `name_of` / `parse` give the names users write)."""
    PRODUCER_REQUEST_HOLD = common_pb2.BACKLOG_QUOTA_PRODUCER_REQUEST_HOLD
    PRODUCER_EXCEPTION = common_pb2.BACKLOG_QUOTA_PRODUCER_EXCEPTION
    CONSUMER_BACKLOG_EVICTION = common_pb2.BACKLOG_QUOTA_CONSUMER_BACKLOG_EVICTION

    @property
    def label(self) -> str:
        """Pulsar's name: producer_request_hold, producer_exception, ..."""
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> BacklogQuotaAction:
        """An action from its name (any case, `-` or `_`); ValueError otherwise."""
        try:
            return cls[text.strip().upper().replace("-", "_")]
        except KeyError:
            raise ValueError(f"'{text}' is not a backlog quota action (one of "
                             f"{', '.join(a.label for a in cls)})") from None

#: a topic has 0 (non-partitioned) .. MAX_PARTITIONS partitions
MAX_PARTITIONS = 1024
#: user properties of a topic: at most this many, keys and values together this many bytes
MAX_PROPERTIES = 128
MAX_PROPERTIES_BYTES = 16 << 10


@dataclass(frozen=True)
class Policies:
    retention_time_seconds: int | None = None
    retention_size_bytes: int | None = None
    max_message_size: int | None = None
    compaction_threshold_bytes: int | None = None
    retain_null_key: bool | None = None
    replicator_auto_reset_backlog_entries: int | None = None
    ledger_max_entries: int | None = None
    ledger_max_bytes: int | None = None
    ledger_max_age_seconds: int | None = None
    max_producers: int | None = None
    max_subscriptions: int | None = None
    max_consumers: int | None = None
    retention_keeps_shadow_backlog: bool | None = None
    delete_retention_seconds: int | None = None
    message_ttl_seconds: int | None = None
    backlog_quota_size_bytes: int | None = None
    backlog_quota_age_seconds: int | None = None
    backlog_quota_action: int | None = None  # a BacklogQuotaAction
    subscription_expiration_seconds: int | None = None

    @classmethod
    def from_pb(cls, pb: common_pb2.Policies) -> Policies:
        out = {f.name: getattr(pb, f.name) for f in fields(cls) if pb.HasField(f.name)}
        action = out.pop("backlog_quota_action", None)
        if action in BacklogQuotaAction._value2member_map_:  # else (unspecified): the default
            out["backlog_quota_action"] = BacklogQuotaAction(action)
        return cls(**out)

    def to_pb(self) -> common_pb2.Policies:
        """The protobuf form (validated first: `InvalidPolicies`, never a ValueError)."""
        return common_pb2.Policies(**self.validate().as_dict())

    def as_dict(self) -> dict[str, Any]:
        """The fields that are set, by name: keyword arguments for `Policies`, `replace` and
        the protobuf message (a value's type, int or bool, depends on its field)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}

    def merged(self, update: Policies) -> Policies:
        """These policies with every field `update` sets replaced."""
        return replace(self, **update.as_dict())

    def effective(self, namespace: Policies | None = None) -> Policies:
        """The policies that apply: DEFAULTS <- `namespace`'s <- these (a topic's own)."""
        return DEFAULTS.merged(namespace or Policies()).merged(self)

    def without(self, names: Iterable[str]) -> Policies:
        """These policies with the fields `names` unset; `InvalidPolicies` for a name that is
        no policy."""
        unknown = sorted(set(names) - set(FIELD_NAMES))
        if unknown:
            raise InvalidPolicies(f"no such policy: {', '.join(unknown)} (one of "
                                  f"{', '.join(FIELD_NAMES)})")
        return replace(self, **{n: None for n in names})

    def validate(self) -> Policies:
        """Self, when every set field is of its type and within `RANGES`."""
        for name, value in self.as_dict().items():
            if name in BOOL_FIELDS:
                if not isinstance(value, bool):
                    raise InvalidPolicies(f"{name} must be true or false, got {value!r}")
                continue
            low, high = RANGES[name]
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidPolicies(f"{name} must be an integer in {low}..{high}, "
                                      f"got {value!r}")
            if not low <= value <= high:
                raise InvalidPolicies(f"{name} must be in {low}..{high}, got {value}")
        return self


#: every policy's name (the protobuf field names)
FIELD_NAMES = tuple(f.name for f in fields(Policies))

DEFAULTS = Policies(
    retention_time_seconds=-1, retention_size_bytes=-1, max_message_size=1 << 20,
    compaction_threshold_bytes=0, retain_null_key=True, replicator_auto_reset_backlog_entries=0,
    ledger_max_entries=200_000, ledger_max_bytes=64 << 20, ledger_max_age_seconds=4 * 3600,
    max_producers=0, max_subscriptions=0, max_consumers=0,
    retention_keeps_shadow_backlog=False, delete_retention_seconds=_DAY,
    message_ttl_seconds=0, backlog_quota_size_bytes=-1, backlog_quota_age_seconds=-1,
    backlog_quota_action=BacklogQuotaAction.PRODUCER_REQUEST_HOLD,
    subscription_expiration_seconds=0,
)


def validate_partitions(partitions: object) -> int:
    """`partitions` when it is an integer in 0..MAX_PARTITIONS, else `InvalidArgument`."""
    if (not isinstance(partitions, int) or isinstance(partitions, bool)
            or not 0 <= partitions <= MAX_PARTITIONS):
        raise InvalidArgument(f"partitions must be an integer in 0..{MAX_PARTITIONS} "
                              f"(0 = non-partitioned), got {partitions!r}")
    return partitions


def validate_properties(properties: object) -> dict[str, str]:
    """`properties` when it maps strings to strings within MAX_PROPERTIES entries and
    MAX_PROPERTIES_BYTES bytes (UTF-8 keys and values), else `InvalidArgument`."""
    if not isinstance(properties, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in properties.items()):
        raise InvalidArgument("properties must map strings to strings")
    if len(properties) > MAX_PROPERTIES:
        raise InvalidArgument(f"properties: at most {MAX_PROPERTIES} entries, "
                              f"got {len(properties)}")
    try:
        size = sum(len(k.encode()) + len(v.encode()) for k, v in properties.items())
    except UnicodeEncodeError:
        raise InvalidArgument("properties must be valid unicode (no lone surrogates)") from None
    if size > MAX_PROPERTIES_BYTES:
        raise InvalidArgument(f"properties: at most {MAX_PROPERTIES_BYTES} bytes of keys and "
                              f"values, got {size}")
    return properties
