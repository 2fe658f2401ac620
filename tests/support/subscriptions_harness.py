"""The subscriptions' harness (TopicSubscriptions over a managed ledger or the in-memory view)
and its helpers, shared by the subscription unit suites."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import Policies
from shadowtopic.cursors.snapshot import SnapshotCursorStore
from shadowtopic.cursors.store import Fence, MemoryCursorStore
from shadowtopic.ledger import wal
from shadowtopic.ledger.managed import LedgerConfig, ManagedLedger
from shadowtopic.ledger.memory_view import MemoryView
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import common_pb2
from shadowtopic.read.positions import EARLIEST, Start
from shadowtopic.subscriptions import (
    EXCLUSIVE,
    TopicSubscriptions,
)
from support.fakes import Count

TOPIC = TopicName.parse("persistent://t/ns/subs")


def raw(payload: str, key: str | None = None) -> bytes:
    m = common_pb2.Message(payload=payload.encode())
    if key is not None:
        m.key = key.encode()
    return m.SerializeToString()


class Harness:
    """TopicSubscriptions over the in-memory view (`kind` "memory") or the source's
    ManagedLedger ("managed"), reopened as a broker would after a restart. A suite may
    subclass it for its own topic, in-memory view class or policies."""

    topic = TOPIC
    memory_view: type[MemoryView] = MemoryView

    def __init__(self, kind: str, tmp_path):
        self.kind = kind
        self.tmp = tmp_path
        self.meta = MemoryStore()
        self.storage = Storage(str(tmp_path / "storage"))
        self.executor = ThreadPoolExecutor(4)
        self.cursor_data: dict = {}
        self.policies = Policies()
        self.epoch = 0
        self.view = None
        self.ts: TopicSubscriptions | None = None

    async def open(self) -> TopicSubscriptions:
        """(Re)load: a new view of the same entries and a new engine over the stores."""
        self.epoch += 1
        own = keys.ownership("c", self.topic)
        value = mpb.Ownership(broker_id="b", epoch=self.epoch).SerializeToString()
        await self.meta.put(own, value)
        if self.kind == "memory":
            self.view = self.view.reopened() if self.view is not None else self.memory_view()
            store = MemoryCursorStore(self.meta, self.cursor_data)
        else:
            if self.view is not None:
                await self.view.close()
            self.view = await ManagedLedger.open(self.topic, self.meta, self.storage, own, value,
                                                 self.epoch, self.executor, LedgerConfig())
            store = SnapshotCursorStore(self.meta, self.storage, self.executor)
        self.ts = await TopicSubscriptions(self.topic, self.view, self.meta, store,
                                           Fence(own, value), lambda: self.policies, Count(),
                                           0.05).load()
        return self.ts

    async def append(self, raws: list[bytes]) -> None:
        if self.kind == "memory":
            self.view.append(raws)
        else:
            await self.view.append(raws, wal.request_bytes(raws), sum(map(len, raws)))

    async def roll(self) -> None:
        if self.kind == "memory":
            self.view.roll()
        else:
            await self.view.roll()

    async def close(self, ts: TopicSubscriptions) -> None:
        await ts.close()
        if self.kind != "memory":
            await self.view.close()
        self.executor.shutdown()

    async def crash(self) -> None:
        """Stop without flushing (kill -9): only what a flush saved survives."""
        self.ts.flusher._closed = True
        self.ts.flusher._stop.set()


async def settle(rounds: int = 30):
    """Let dispatch run (generously: the machine is shared and other work may be running)."""
    for _ in range(rounds):
        await asyncio.sleep(0.01)


FROM_EARLIEST = Start(EARLIEST)


async def sub(ts, outbox, handle, name, type_=EXCLUSIVE, start=FROM_EARLIEST, permits=1000,
              **kw):
    c, created, pos = await ts.subscribe(outbox, handle, name, type_, start, **kw)
    if permits:
        ts.flow(c, permits)
    return c


def run(coro):
    return asyncio.run(coro)


def msgs(n, prefix="m"):
    return [raw(f"{prefix}{i}") for i in range(n)]
