"""Listing topics (source/broker/topic_admin.py) over a metadata store that holds a record
that is not a TopicInfo: the others are still listed."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from shadowtopic.broker.topic_admin import TopicAdmin
from shadowtopic.core.names import TopicName
from shadowtopic.metadata import MemoryStore, keys
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb


def test_a_record_that_is_no_topic_info_does_not_hide_the_others():
    async def main():
        store = MemoryStore()
        good = TopicName.parse("persistent://t/ns/good")
        await store.put(keys.topic_info(good), mpb.TopicInfo(name=str(good)).SerializeToString())
        await store.put(keys.topic_info(TopicName.parse("persistent://t/ns/bad")),
                        b"first incarnation")  # what a test once left in a shared etcd
        admin = TopicAdmin(SimpleNamespace(store=store), [])
        return [i.name for i in await admin.list(None)]
    assert asyncio.run(main()) == [str(TopicName.parse("persistent://t/ns/good"))]
