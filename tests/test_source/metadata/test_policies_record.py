"""Policies in etcd are the storage message storage.v1.Policies (a namespace's record and
TopicInfo.policies; source/metadata/policies_record.py). Both were written as the API message
shadowtopic.v1.Policies before: those records must parse with every field as it was and write
back as the same bytes."""
from __future__ import annotations

import asyncio

from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import BacklogQuotaAction, Policies
from shadowtopic.metadata import MemoryStore, keys, namespace_policies
from shadowtopic.metadata.policies_record import from_record, to_record
from shadowtopic.metadata.topic_info import decode_info, effective_policies
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import common_pb2

TOPIC = TopicName.parse("persistent://t/ns/old")


def every_field_set() -> common_pb2.Policies:
    """An old record: the API message, every field set (none to its default value)."""
    old = common_pb2.Policies(
        retention_time_seconds=101, retention_size_bytes=102, max_message_size=103,
        compaction_threshold_bytes=104, retain_null_key=False,
        replicator_auto_reset_backlog_entries=106, ledger_max_entries=107,
        ledger_max_bytes=108, ledger_max_age_seconds=109, max_producers=110,
        max_subscriptions=111, max_consumers=112, retention_keeps_shadow_backlog=True,
        delete_retention_seconds=114, message_ttl_seconds=115, backlog_quota_size_bytes=116,
        backlog_quota_age_seconds=117,
        backlog_quota_action=common_pb2.BACKLOG_QUOTA_CONSUMER_BACKLOG_EVICTION,
        subscription_expiration_seconds=119)
    unset = [f.name for f in old.DESCRIPTOR.fields if not old.HasField(f.name)]
    assert not unset, f"the old record leaves fields unset: {unset}"
    return old


def old_topic_info(policies: common_pb2.Policies) -> bytes:
    """A TopicInfo as the old code wrote it, its field 5 the API message: protobuf writes
    fields in number order, so that is the fields before 5, then 5, then those after it."""
    before = mpb.TopicInfo(name=str(TOPIC), kind=mpb.SOURCE, source="",
                           properties={"k": "v"}).SerializeToString(deterministic=True)
    after = mpb.TopicInfo(partitions=3, partition_index=-1,
                          created_ms=1_700_000_000_000).SerializeToString(deterministic=True)
    body = policies.SerializeToString(deterministic=True)
    assert len(body) < 128  # its length is one varint byte
    return before + bytes([5 << 3 | 2, len(body)]) + body + after


def test_the_storage_message_has_the_api_messages_fields_and_actions():
    def shape(descriptor):
        return {(f.name, f.number, f.type, f.has_presence) for f in descriptor.fields}
    assert shape(mpb.Policies.DESCRIPTOR) == shape(common_pb2.Policies.DESCRIPTOR)
    def actions(enum):
        return {v.number: v.name for v in enum.DESCRIPTOR.values}
    assert actions(mpb.BacklogQuotaAction) == actions(common_pb2.BacklogQuotaAction)
    # etcd holds no API message any more
    assert mpb.TopicInfo.DESCRIPTOR.fields_by_name["policies"].message_type \
        is mpb.Policies.DESCRIPTOR


def test_an_old_record_parses_with_every_field_equal_and_writes_back_the_same_bytes():
    old = every_field_set()
    data = old.SerializeToString(deterministic=True)
    record = mpb.Policies.FromString(data)
    assert record.SerializeToString(deterministic=True) == data  # nothing left unknown
    policies = from_record(record)
    assert policies == Policies.from_pb(old)
    assert None not in vars(policies).values()
    assert policies.backlog_quota_action is BacklogQuotaAction.CONSUMER_BACKLOG_EVICTION
    assert to_record(policies).SerializeToString(deterministic=True) == data


def test_an_old_namespace_record_in_etcd_reads_and_is_rewritten_as_it_was():
    old = every_field_set()
    data = old.SerializeToString(deterministic=True)
    async def main():
        store = MemoryStore()
        key = keys.namespace_policies("t/ns")
        await store.put(key, data)
        read = await namespace_policies.read(store, "t/ns")
        # an update that changes nothing rewrites the record: the same bytes
        written = await namespace_policies.update(store, "t/ns", Policies())
        kv = await store.get(key)
        assert kv is not None
        return read, written, kv.value
    read, written, value = asyncio.run(main())
    assert read == written == Policies.from_pb(old)
    assert value == data


def test_an_old_topic_info_parses_with_its_policies_and_writes_back_the_same_bytes():
    old = every_field_set()
    data = old_topic_info(old)
    info = decode_info(data)
    assert from_record(info.policies) == Policies.from_pb(old)
    assert (info.name, dict(info.properties), info.partitions) == (str(TOPIC), {"k": "v"}, 3)
    assert info.SerializeToString(deterministic=True) == data
    # and a record the new code writes is the bytes the old code wrote
    new = mpb.TopicInfo(name=str(TOPIC), kind=mpb.SOURCE, properties={"k": "v"},
                        policies=to_record(Policies.from_pb(old)), partitions=3,
                        partition_index=-1, created_ms=1_700_000_000_000)
    assert new.SerializeToString(deterministic=True) == data

    async def main():
        store = MemoryStore()
        await store.put(keys.topic_info(TOPIC), data)
        return await effective_policies(store, TOPIC)
    assert asyncio.run(main()) == Policies.from_pb(old)  # every field the topic's own
