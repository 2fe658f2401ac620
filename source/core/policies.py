"""Topic policies: the domain type, defaults, validation and protobuf conversion.

Stored per topic as only the fields a user set (`TopicInfo.policies`); `effective()` fills in
the defaults. Sizes are bytes, times seconds; -1 means "no limit" for retention.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from source.core.errors import InvalidPolicies
from source.pb.v1 import common_pb2


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

    @classmethod
    def from_pb(cls, pb: common_pb2.Policies) -> "Policies":
        return cls(**{f.name: getattr(pb, f.name) for f in fields(cls) if pb.HasField(f.name)})

    def to_pb(self) -> common_pb2.Policies:
        return common_pb2.Policies(**{k: v for k, v in self.as_dict().items()})

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}

    def merged(self, update: "Policies") -> "Policies":
        """These policies with every field `update` sets replaced."""
        return replace(self, **update.as_dict())

    def effective(self) -> "Policies":
        return DEFAULTS.merged(self)

    def validate(self) -> "Policies":
        for name in ("retention_time_seconds", "retention_size_bytes"):
            v = getattr(self, name)
            if v is not None and v < -1:
                raise InvalidPolicies(f"{name} must be -1 (unlimited) or >= 0, got {v}")
        for name in ("compaction_threshold_bytes", "replicator_auto_reset_backlog_entries"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise InvalidPolicies(f"{name} must be >= 0, got {v}")
        if self.max_message_size is not None and not 1 <= self.max_message_size <= MAX_MESSAGE_SIZE:
            raise InvalidPolicies(f"max_message_size must be in 1..{MAX_MESSAGE_SIZE}")
        for name in ("ledger_max_entries", "ledger_max_bytes", "ledger_max_age_seconds"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise InvalidPolicies(f"{name} must be >= 1, got {v}")
        return self


#: hard ceiling of one message (gRPC's frame limit is set above it)
MAX_MESSAGE_SIZE = 5 << 20

DEFAULTS = Policies(
    retention_time_seconds=-1, retention_size_bytes=-1, max_message_size=1 << 20,
    compaction_threshold_bytes=0, retain_null_key=True, replicator_auto_reset_backlog_entries=0,
    ledger_max_entries=200_000, ledger_max_bytes=64 << 20, ledger_max_age_seconds=4 * 3600,
    max_producers=0, max_subscriptions=0,
)
