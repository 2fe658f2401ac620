"""Admin client: topics, policies, stats, ledgers. Returns domain types and plain dicts
(stats print with Pulsar's camelCase names, through protobuf's JSON mapping)."""
from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict

from source.client.connection import Connection
from source.core.message_id import MessageId
from source.core.names import canonical
from source.core.policies import Policies, validate_partitions, validate_properties
from source.pb.v1 import admin_pb2 as apb
from source.pb.v1 import common_pb2


@dataclass(frozen=True)
class TopicMetadata:
    topic: str
    kind: str                 # "source" | "shadow"
    partitions: int
    source: str = ""
    properties: dict[str, str] = field(default_factory=dict)
    policies: Policies = field(default_factory=Policies)

    @classmethod
    def from_pb(cls, pb: apb.TopicMetadata) -> "TopicMetadata":
        return cls(topic=pb.topic, kind=apb.TopicKind.Name(pb.kind).lower(),
                   partitions=pb.partitions, source=pb.source, properties=dict(pb.properties),
                   policies=Policies.from_pb(pb.policies))

    def to_dict(self) -> dict:
        return {"topic": self.topic, "kind": self.kind, "partitions": self.partitions,
                "source": self.source, "properties": self.properties,
                "policies": self.policies.as_dict()}


_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}


def to_dict(msg) -> dict:
    """protobuf's JSON mapping, except that 64-bit counters stay numbers (as Pulsar prints
    them) instead of strings."""
    return _numbers(msg.DESCRIPTOR, MessageToDict(msg, always_print_fields_with_no_presence=True))


def _numbers(desc, data: dict) -> dict:
    for f in desc.fields:
        if f.json_name not in data:
            continue
        v = data[f.json_name]
        if f.type in _INT64:
            data[f.json_name] = [int(x) for x in v] if isinstance(v, list) else int(v)
        elif f.message_type is not None:
            if f.message_type.GetOptions().map_entry:
                vf = f.message_type.fields_by_name["value"]
                if vf.message_type is not None:
                    for k in v:
                        _numbers(vf.message_type, v[k])
                elif vf.type in _INT64:
                    data[f.json_name] = {k: int(x) for k, x in v.items()}
            elif isinstance(v, list):
                for x in v:
                    _numbers(f.message_type, x)
            elif isinstance(v, dict):
                _numbers(f.message_type, v)
    return data


class Admin:
    def __init__(self, conn: Connection):
        self._c = conn
        self._stub = conn.admin

    def create_topic(self, topic: str, partitions: int = 0, policies: Policies | None = None,
                     properties: dict[str, str] | None = None) -> TopicMetadata:
        """Raises InvalidTopicName / InvalidArgument / InvalidPolicies before sending when an
        argument is out of range (see source.core.policies for the ranges)."""
        req = apb.CreateTopicRequest(topic=canonical(topic),
                                     partitions=validate_partitions(partitions),
                                     policies=(policies or Policies()).to_pb(),
                                     properties=validate_properties(properties or {}))
        return TopicMetadata.from_pb(self._c.call(self._stub.CreateTopic, req))

    def delete_topic(self, topic: str, force: bool = False) -> None:
        self._c.call(self._stub.DeleteTopic, apb.DeleteTopicRequest(topic=canonical(topic),
                                                                    force=force))

    def list_topics(self, namespace: str = "") -> list[TopicMetadata]:
        out, token = [], ""
        while True:
            resp = self._c.call(self._stub.ListTopics, apb.ListTopicsRequest(
                namespace=namespace, page=common_pb2.PageRequest(page_token=token)))
            out += [TopicMetadata.from_pb(t) for t in resp.topics]
            token = resp.next_page_token
            if not token:
                return out

    def get_topic(self, topic: str) -> TopicMetadata:
        return TopicMetadata.from_pb(self._c.call(
            self._stub.GetTopicMetadata, apb.TopicRequest(topic=canonical(topic))))

    def get_policies(self, topic: str) -> Policies:
        return Policies.from_pb(self._c.call(self._stub.GetPolicies,
                                             apb.TopicRequest(topic=canonical(topic))))

    def set_policies(self, topic: str, policies: Policies) -> Policies:
        return Policies.from_pb(self._c.call(self._stub.SetPolicies, apb.SetPoliciesRequest(
            topic=canonical(topic), policies=policies.to_pb())))

    def stats(self, topic: str) -> dict:
        return to_dict(self._c.call(self._stub.GetTopicStats,
                                    apb.TopicRequest(topic=canonical(topic))))

    def internal_stats(self, topic: str) -> dict:
        return to_dict(self._c.call(self._stub.GetInternalStats,
                                    apb.TopicRequest(topic=canonical(topic))))

    def lookup(self, topic: str) -> dict:
        return to_dict(self._c.call(self._stub.Lookup, apb.TopicRequest(topic=canonical(topic))))

    def roll_ledger(self, topic: str) -> dict:
        return to_dict(self._c.call(self._stub.RollLedger,
                                    apb.TopicRequest(topic=canonical(topic))))

    def truncate(self, topic: str) -> dict:
        return to_dict(self._c.call(self._stub.Truncate, apb.TopicRequest(topic=canonical(topic))))

    def last_message_id(self, topic: str) -> MessageId | None:
        """The newest message's id, or None when the topic holds no message."""
        pb = self._c.call(self._stub.GetLastMessageId,
                          apb.GetLastMessageIdRequest(topic=canonical(topic)))
        return MessageId.from_pb(pb) if pb.ledger_id else None
