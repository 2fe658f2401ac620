"""A reader caught up at the tail of a source topic gets every entry across rollovers: after
the switch to a new ledger, the old ledger's writer still confirms what was queued for it,
and a dispatch in that window (a flow is enough) once moved the reader to the new ledger's
first entry, past the old ledger's last entries (found by the shadow issue's second reader)."""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from support.fakes import Count, Outbox

from shadowtopic.core.names import TopicName
from shadowtopic.ledger import wal as walmod
from shadowtopic.ledger.managed import LedgerConfig, ManagedLedger
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.read.engine import ReadEngine
from shadowtopic.read.positions import EARLIEST, Start


def test_a_tail_reader_misses_nothing_when_ledgers_roll(tmp_path, monkeypatch):
    real = walmod.WalFile.write_sync

    def slow(self, data):  # a slow fsync widens the window between switch and drain
        time.sleep(0.005)
        return real(self, data)

    monkeypatch.setattr(walmod.WalFile, "write_sync", slow)

    async def main():
        store = MemoryStore()
        topic = TopicName.parse("persistent://t/ns/roll-race")
        own = keys.ownership("c", topic)
        await store.put(own, b"v")
        ml = await ManagedLedger.open(topic, store, Storage(str(tmp_path)), own, b"v", 1,
                                      ThreadPoolExecutor(4), LedgerConfig(max_entries=10))

        async def resolve(_t):
            return ml

        engine = ReadEngine(resolve, lambda _t: Count())
        out = Outbox(raise_errors=True)
        reader, _ = await engine.open(out, 1, topic, Start(EARLIEST))
        engine.flow(reader, 10 ** 6)

        async def flows():  # a client's flow commands wake dispatch in any window
            while True:
                engine.flow(reader, 1)
                await asyncio.sleep(0.001)

        flowing = asyncio.create_task(flows())

        async def one(i):
            raws = [b"m%d" % i]
            return await ml.append(raws, walmod.request_bytes(raws), len(raws[0]))

        acked = await asyncio.gather(*[one(i) for i in range(200)])
        deadline = time.monotonic() + 20
        while len(out.ids()) < len(acked) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        flowing.cancel()
        assert len(ml.ledgers()) >= 10  # it did roll, many times
        assert sorted(out.ids()) == sorted(acked)
        assert out.ids() == sorted(out.ids())  # in order
        await ml.close()

    asyncio.run(asyncio.wait_for(main(), 60))
