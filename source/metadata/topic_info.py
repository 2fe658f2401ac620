"""A topic's record in etcd (`keys.topic_info`, a `TopicInfo`): reading it, and the policies
that apply to a topic, since a partition follows its parent's and every topic its
namespace's; its generation (which incarnation of the name it is). The brokers and the
compaction worker read topics through here."""
from __future__ import annotations

from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import Policies
from shadowtopic.metadata import keys, namespace_policies
from shadowtopic.metadata.base import MetadataStore
from shadowtopic.metadata.policies_record import from_record
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

SOURCE, SHADOW = mpb.TopicKind.SOURCE, mpb.TopicKind.SHADOW

#: the broker role that serves each kind of topic (brokers register their roles)
ROLES = {SOURCE: "source", SHADOW: "shadow"}


def role_of(info: mpb.TopicInfo) -> str:
    """The role of the brokers that serve the topic `info` describes."""
    return ROLES[info.kind]


def decode_info(data: bytes) -> mpb.TopicInfo:
    info = mpb.TopicInfo.FromString(data)
    if info.kind == mpb.TopicKind.TOPIC_KIND_UNSPECIFIED:
        info.kind = SOURCE  # written before TopicKind had a zero value of its own
    return info


async def read_info(store: MetadataStore, topic: TopicName) -> mpb.TopicInfo:
    """`topic`'s record; `TopicNotFound` when there is none."""
    kv = await store.get(keys.topic_info(topic))
    if kv is None:
        raise errors.TopicNotFound(f"topic {topic} does not exist")
    return decode_info(kv.value)


async def read_incarnation(store: MetadataStore, topic: TopicName) -> tuple[mpb.TopicInfo, int]:
    """`topic`'s record and its generation: the etcd create revision of its info key, new
    for every incarnation (a topic deleted and created again under the same name has
    another). `TopicNotFound` when there is none."""
    kv = await store.get(keys.topic_info(topic))
    if kv is None:
        raise errors.TopicNotFound(f"topic {topic} does not exist")
    return decode_info(kv.value), kv.create_revision


async def generation_of(store: MetadataStore, topic: TopicName) -> int:
    """The generation of `topic` now (0: it does not exist)."""
    kv = await store.get(keys.topic_info(topic))
    return 0 if kv is None else kv.create_revision


async def effective_policies(store: MetadataStore, topic: TopicName) -> Policies:
    """The policies that apply to `topic`: field by field its own (a partition's are its
    parent's), else its namespace's (source/metadata/namespace_policies.py), else the
    default. `TopicNotFound` when the topic, or a partition's parent, is gone."""
    info = await read_info(store, topic)
    if info.partition_of:
        info = await read_info(store, TopicName.parse(info.partition_of))
    namespace = await namespace_policies.read(store, topic.namespace_name)
    return from_record(info.policies).effective(namespace)
