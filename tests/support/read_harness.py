"""The read engine's harness over each kind of ledger view (a managed ledger, the in-memory view,
a shadow following a managed source): the unit suites of the read engine and of the shadow
run the same tests on each (KINDS)."""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import wal
from shadowtopic.ledger.managed import LedgerConfig, ManagedLedger
from shadowtopic.ledger.memory_view import MemoryView
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.read.engine import ReadEngine
from shadowtopic.shadow.ledger import ShadowLedger
from support.fakes import Count

TOPIC = TopicName.parse("persistent://t/ns/engine")
SOURCE = TopicName.parse("persistent://t/ns/engine-source")  # the "shadow" kind's source
KINDS = ["managed", "memory", "shadow"]  # every LedgerView the suites run on (`kind`)


class ManagedDriver:
    """The same driving calls on a real ManagedLedger."""

    def __init__(self, tmp_path, topic: TopicName = TOPIC):
        self.topic = topic
        self.store = MemoryStore()
        self.root = str(tmp_path / "storage")
        self.storage = Storage(self.root)
        self.executor = ThreadPoolExecutor(4)
        self.epoch = 0

    async def open(self) -> ManagedLedger:
        self.epoch += 1
        own_key = keys.ownership("c", self.topic)
        value = mpb.Ownership(broker_id="b", epoch=self.epoch).SerializeToString()
        await self.store.put(own_key, value)
        return await ManagedLedger.open(self.topic, self.store, self.storage, own_key, value,
                                        self.epoch, self.executor, LedgerConfig())


class ShadowDriver:
    """The same driving calls on a source ManagedLedger (SOURCE), read through a shadow's
    ShadowLedger (TOPIC) on the same MemoryStore and storage root (its own Storage object,
    as another broker has it). The driver plays the replicator: after each append it passes
    the batch's last id to `on_replicated`, and a newly opened shadow is told the source's
    last confirmed id (the replicator's heartbeat after a reconnect). A driving call returns
    once the shadow shows what the source shows (as an append on the source returns once
    the entries are readable); one that never does fails the test."""

    def __init__(self, tmp_path):
        self.managed = ManagedDriver(tmp_path, SOURCE)
        self.store, self.executor = self.managed.store, self.managed.executor
        self.source: ManagedLedger | None = None

    async def open(self) -> ShadowLedger:
        """A new ShadowLedger of TOPIC (the source is opened once, on the first call)."""
        if self.source is None:
            self.source = await self.managed.open()
        sl = await ShadowLedger.open(TOPIC, SOURCE, self.store, Storage(self.managed.root),
                                     self.executor, retry_delay=0.05)
        last = self.source.last_confirmed()
        if last is not None:
            sl.on_replicated(last)
        await self.caught_up(sl)
        return sl

    async def append(self, shadow: ShadowLedger, raws: list[bytes]) -> None:
        lid, first = await self.source.append(raws, wal.request_bytes(raws),
                                              sum(map(len, raws)))
        shadow.on_replicated(MessageId(lid, first + len(raws) - 1))
        await self.caught_up(shadow)

    async def caught_up(self, shadow: ShadowLedger, timeout: float = 5.0) -> None:
        """Until the shadow holds the source's current ledger list and shows its ledgers,
        last confirmed id and next id (a closed shadow is left as it is)."""
        def same() -> bool:
            return ([r[:3] for r in shadow.ranges()] == [r[:3] for r in self.source.ranges()]
                    and shadow.last_confirmed() == self.source.last_confirmed()
                    and shadow.next_position() == self.source.next_position())

        deadline = time.monotonic() + timeout
        while shadow.closed is None:
            kv = await self.store.get(keys.ledgers(SOURCE))
            if (kv is None or shadow.list_revision >= kv.mod_revision) and same():
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the shadow did not catch up with its source: shadow "
                    f"{shadow.ranges()} last {shadow.last_confirmed()} next "
                    f"{shadow.next_position()}; source {self.source.ranges()} last "
                    f"{self.source.last_confirmed()} next {self.source.next_position()}")
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        if self.source is not None and self.source.closed is None:
            await self.source.close()


class Harness:
    """A view of any kind plus `append` / `roll` / `trim_first` / `reload` on it. For the
    shadow, appends, rolls and trims happen on its source, and a reload is the shadow's
    (the ShadowLedger is closed and a new one opened; the source stays)."""

    def __init__(self, kind, tmp_path):
        self.kind = kind
        self.driver = {"managed": ManagedDriver, "shadow": ShadowDriver,
                       "memory": lambda _: None}[kind](tmp_path)
        self.shadow = self.driver if kind == "shadow" else None
        self.view = None
        self.reads = 0
        self.counters = Count()

    async def start(self):
        self.view = await self.driver.open() if self.driver else MemoryView()
        real_read = self.view.read

        async def counted(*args):
            self.reads += 1
            return await real_read(*args)

        self.view.read = counted
        self.engine = ReadEngine(self.resolve, lambda topic: self.counters)
        return self

    async def resolve(self, topic):
        if self.view.closed is not None:  # a reload: a new view of the same entries
            old = self.view
            if self.driver:
                self.view = await self.driver.open()
            else:
                self.view = old.reopened()
        return self.view

    async def append(self, raws):
        if self.shadow:
            await self.shadow.append(self.view, raws)
        elif self.driver:
            await self.view.append(raws, wal.request_bytes(raws), sum(map(len, raws)))
        else:
            self.view.append(raws)

    async def roll(self):
        if self.shadow:
            await self.shadow.source.roll()
            await self.shadow.caught_up(self.view)
        elif self.driver:
            await self.view.roll()
        else:
            self.view.roll()

    async def trim_first(self):
        """Delete every sealed ledger."""
        if self.shadow:
            await self.shadow.source.truncate()
            await self.shadow.caught_up(self.view)
        elif self.driver:
            await self.view.truncate()
        else:
            self.view.roll()
            self.view.trim()

    async def reload(self):
        if self.driver:
            await self.view.close()
        else:
            self.view.close()

    async def close(self):
        if self.driver:
            if self.view.closed is None:
                await self.view.close()
            if self.shadow:
                await self.shadow.close()
            self.driver.executor.shutdown(wait=True)


async def until(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def run(kind, tmp_path, body, timeout=30):
    async def main():
        h = await Harness(kind, tmp_path).start()
        try:
            await body(h)
        finally:
            await h.close()
    asyncio.run(asyncio.wait_for(main(), timeout))


def msgs(a, b):
    return [f"m{i}".encode() for i in range(a, b)]
