"""A new shadow's replicator (shadow/replicator.py) starts at the source's tail with nothing
to send: its stream's first batch still goes at once, so the shadow learns the source's last
confirmed id (and serves the whole history) without waiting a heartbeat interval."""
from __future__ import annotations

import asyncio

import grpc

from shadowtopic.core.names import TopicName
from shadowtopic.ledger.memory_view import MemoryView
from shadowtopic.metadata import MemoryStore, keys
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import replication_pb2, replication_pb2_grpc
from shadowtopic.shadow import replicator as repmod
from shadowtopic.shadow.replicator import ShadowReplicator

SOURCE = TopicName.parse("persistent://t/ns/src")
SHADOW = TopicName.parse("persistent://t/ns/src-shadow")
CLUSTER = "c"


class Receiver(replication_pb2_grpc.ReplicationServicer):
    """Records every batch and acks it."""

    def __init__(self):
        self.batches: list[replication_pb2.ReplicateBatch] = []
        self.got = asyncio.Event()

    async def Replicate(self, request_iterator, context):
        async for batch in request_iterator:
            self.batches.append(batch)
            self.got.set()
            yield replication_pb2.ReplicateAck(batch_id=batch.batch_id)


def test_the_first_batch_of_a_shadow_at_the_tail_goes_at_once(monkeypatch, arun):
    monkeypatch.setattr(repmod, "HEARTBEAT_S", 60.0)  # far past this test's deadline

    async def main():
        server = grpc.aio.server()
        receiver = Receiver()
        replication_pb2_grpc.add_ReplicationServicer_to_server(receiver, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        store = MemoryStore()
        own = mpb.Ownership(broker_id="b", broker_url=f"127.0.0.1:{port}", epoch=3)
        await store.put(keys.ownership(CLUSTER, SHADOW), own.SerializeToString())
        view = MemoryView(ledgers_of=SOURCE)
        view.append([b"m0", b"m1", b"m2"])  # the history: the shadow reads it from storage
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        rep = ShadowReplicator(SOURCE, SHADOW, view, store, CLUSTER,
                               lambda: ("k", b"v", 3), lambda: 0, lambda url: channel)
        rep.start()
        try:
            await asyncio.wait_for(receiver.got.wait(), 10)  # not a heartbeat later
            first = receiver.batches[0]
            assert first.shadow == str(SHADOW) and first.source_epoch == 3
            last = view.last_confirmed()
            assert (first.last_confirmed.ledger_id, first.last_confirmed.entry_id) == \
                (last.ledger_id, last.entry_id)
            assert not first.entries  # nothing past the tail to send
        finally:
            await rep.stop()
            await channel.close()
            await server.stop(None)
            await store.close()

    arun(main(), timeout=30)
