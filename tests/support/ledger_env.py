"""A managed ledger over the in-memory metadata store and a local storage root, and the
append / read-all helpers of the ledger unit suites."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import wal
from shadowtopic.ledger.managed import LedgerConfig, ManagedLedger
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

TOPIC = TopicName.parse("persistent://t/ns/ledger")


def batch(n: int, start: int = 0):
    raws = [f"m{start + i}".encode() for i in range(n)]
    return raws, wal.request_bytes(raws), sum(map(len, raws))


class Env:
    def __init__(self, tmp_path):
        self.store = MemoryStore()
        self.storage = Storage(str(tmp_path / "storage"))
        self.executor = ThreadPoolExecutor(4)
        self.epoch = 0

    async def open(self, lease_ok=lambda: True, seal_ahead="always", **cfg) -> ManagedLedger:
        self.epoch += 1
        own_key = keys.ownership("c", TOPIC)
        value = mpb.Ownership(broker_id="b", epoch=self.epoch).SerializeToString()
        await self.store.put(own_key, value)
        return await ManagedLedger.open(TOPIC, self.store, self.storage, own_key, value,
                                        self.epoch, self.executor, LedgerConfig(**cfg),
                                        lease_ok=lease_ok, seal_ahead=seal_ahead)


async def append(ml, n, start=0):
    raws, request, size = batch(n, start)
    return await ml.append(raws, request, size)


async def read_all(ml):
    out, pos = [], MessageId(0, 0)
    while True:
        got = await ml.read(pos, 1000, 1 << 30)
        if not got:
            return out
        out += got
        pos = MessageId(got[-1].ledger_id, got[-1].entry_id + 1)
