"""Policies as etcd stores them: the storage message `storage.v1.Policies`, a topic's own in
`TopicInfo.policies` and a namespace's under `keys.namespace_policies`, holding only the
fields a user set. It has the field numbers and types of the API message
`shadowtopic.v1.Policies`, which records were written as before it existed, so those parse
as they are; an API rename is no etcd migration. This module converts between the record and
the domain type `Policies` (which converts to and from the API message itself), so neither the
client nor the core sees a storage message.
"""
from __future__ import annotations

from shadowtopic.core.policies import Policies
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import common_pb2


def from_record(record: mpb.Policies) -> Policies:
    """The policies `record` sets (an unspecified backlog quota action counts as unset)."""
    set_fields = {f.name: getattr(record, f.name) for f in record.DESCRIPTOR.fields
                  if record.HasField(f.name)}
    return Policies.from_pb(common_pb2.Policies(**set_fields))


def to_record(policies: Policies) -> mpb.Policies:
    """The record of the fields `policies` sets (validated first: `InvalidPolicies`)."""
    return mpb.Policies(**policies.validate().as_dict())
