"""What the worker collects (compaction/jobs.py `Worker.collect`, compaction/commit.py): never
the output of a job that publishes while the collection reads what to keep (a clean-clone
run of K19 lost a job's output that way: the pointer was read before the job published and
its request after, when the publish had deleted it)."""
from __future__ import annotations

import os

from shadowtopic.compaction.jobs import Worker
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import Delete, Put, keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

TOPIC = TopicName.parse("persistent://public/default/t")
CLUSTER = "c1"


def _pointer(job_id: str) -> bytes:
    return mpb.CompactionPointer(
        job_id=job_id,
        manifest_path=f"{Storage.compacted_rel(TOPIC, job_id)}/manifest.json",
    ).SerializeToString()


class PublishesWhileRead(MemoryStore):
    """A store where job j2 publishes (the pointer moves to it and its request goes, in one
    transaction, as commit.publish does) right after the first read of the pointer."""

    published = False

    async def get(self, key: str):
        kv = await super().get(key)
        if key == keys.compaction(TOPIC) and not self.published:
            self.published = True
            await self.txn([], [Put(keys.compaction(TOPIC), _pointer("j2")),
                                 Delete(keys.compaction_request(CLUSTER, TOPIC))])
        return kv


def test_a_job_that_publishes_during_a_collection_keeps_its_output(tmp_path, arun):
    storage = Storage(str(tmp_path / "storage"))
    for job in ("j0", "j1", "j2"):  # j0: replaced long ago; j1: the pointer; j2: running
        d = storage.full(Storage.compacted_rel(TOPIC, job))
        os.makedirs(d)
        with open(os.path.join(d, "part-00000.parquet"), "wb") as f:
            f.write(b"x")

    async def main():
        store = PublishesWhileRead()
        await store.put(keys.compaction(TOPIC), _pointer("j1"))
        await store.put(keys.compaction_request(CLUSTER, TOPIC),
                        mpb.CompactionRequest(job_id="j2").SerializeToString())
        worker = Worker(store, None, CLUSTER, "w1", grace=0.0)
        try:
            deleted = await worker.collect(TOPIC, storage)
        finally:
            await worker.close()
        assert store.published
        return deleted

    deleted = arun(main())
    assert deleted == [Storage.compacted_rel(TOPIC, "j0")]
    assert os.path.isdir(storage.full(Storage.compacted_rel(TOPIC, "j2")))
