"""The read engine over the LedgerView seam, in-process: the same tests run on every
`LedgerView` a broker serves or tests use, driven alike, and must see the same reads:
- "managed": the source's ManagedLedger (metadata memory twin, real files);
- "memory": the in-memory MemoryView (source/ledger/memory_view.py);
- "shadow": a shadow's ShadowLedger (shadow/ledger.py) over a source ManagedLedger on the
  same MemoryStore and storage root; the driving calls go to the source, the shadow follows
  its ledger list and is told each confirmed id as the replicator would."""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from shadowtopic.shadow.ledger import ShadowLedger
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import wal
from shadowtopic.ledger.managed import LedgerConfig, ManagedLedger
from shadowtopic.ledger.memory_view import MemoryView
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import common_pb2
from shadowtopic.read.engine import ReadEngine
from shadowtopic.read.positions import EARLIEST, LATEST, PUBLISH_TIME, Start

TOPIC = TopicName.parse("persistent://t/ns/engine")
SOURCE = TopicName.parse("persistent://t/ns/engine-source")  # the "shadow" kind's source

#: every LedgerView the suite runs on (the `kind` fixture)
KINDS = ["managed", "memory", "shadow"]


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


# ---- an outbox that records frames --------------------------------------------------------

class RecordingOutbox:
    def __init__(self, room: bool = True):
        self.room = room
        self.frames: list[tuple[list[int], list[common_pb2.EncodedEntry]]] = []
        self.errors: list[tuple[int, errors.ShadowTopicError]] = []
        self._waiting: list = []

    def has_room(self) -> bool:
        return self.room

    def call_when_room(self, callback) -> None:
        self._waiting.append(callback)

    def drain(self) -> None:
        self.room = True
        waiting, self._waiting = self._waiting, []
        for cb in waiting:
            cb()

    def send_entries(self, handles, encoded, size):
        self.frames.append((list(handles), [common_pb2.EncodedEntry.FromString(e)
                                             for e in encoded]))

    def send_error(self, handle, error):
        self.errors.append((handle, error))

    def got(self, handle: int) -> list[bytes]:
        return [e.raw for handles, entries in self.frames if handle in handles for e in entries]


class Count:
    def __init__(self):
        self.msgs = 0

    def add_out(self, msgs, size):
        self.msgs += msgs


# ---- harness ------------------------------------------------------------------------------

@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


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


# ---- tests --------------------------------------------------------------------------------

def test_readers_at_one_position_share_each_read_and_frame(kind, tmp_path):
    async def body(h):
        await h.append(msgs(0, 300))
        a, b = RecordingOutbox(), RecordingOutbox()
        readers = []
        for handle in range(1, 11):
            r, last = await h.engine.open(a if handle <= 5 else b, handle, TOPIC, Start())
            readers.append(r)
        assert last.entry_id == 299
        for r in readers:
            h.engine.flow(r, 1000)
        await until(lambda: all(len(o.got(r.handle)) == 300
                                for o, r in [(a, readers[0]), (b, readers[9])]))
        for r in readers:
            out = a if r.handle <= 5 else b
            assert out.got(r.handle) == msgs(0, 300)
        assert h.reads <= 3, "each entry should be read once for all ten readers"
        assert {tuple(sorted(hs)) for hs, _ in a.frames} == {(1, 2, 3, 4, 5)}
        assert {tuple(sorted(hs)) for hs, _ in b.frames} == {(6, 7, 8, 9, 10)}
        assert h.counters.msgs == 3000

    run(kind, tmp_path, body)


def test_flow_permits_bound_what_is_sent(kind, tmp_path):
    async def body(h):
        await h.append(msgs(0, 50))
        out = RecordingOutbox()
        r, _ = await h.engine.open(out, 1, TOPIC, Start())
        h.engine.flow(r, 7)
        await until(lambda: len(out.got(1)) == 7)
        await asyncio.sleep(0.05)
        assert out.got(1) == msgs(0, 7)
        h.engine.flow(r, 100)
        await until(lambda: len(out.got(1)) == 50)
        await h.append(msgs(50, 60))  # the tail: woken by the view, no polling
        await until(lambda: len(out.got(1)) == 60)
        assert out.got(1) == msgs(0, 60)

    run(kind, tmp_path, body)


def test_start_positions_and_seek(kind, tmp_path):
    async def body(h):
        await h.append(msgs(0, 10))
        await h.roll()
        t_mid = int(time.time() * 1000) + 5
        await asyncio.sleep(0.02)
        await h.append(msgs(10, 20))
        ids = [(e.ledger_id, e.entry_id) for e in await h.view.read(MessageId(0, 0), 100, 1 << 20)]
        out = RecordingOutbox()
        fifth = MessageId(*ids[5])
        starts = {1: Start(), 2: Start(LATEST), 3: Start.at(fifth), 4: Start.at(fifth, True),
                  5: Start(PUBLISH_TIME, publish_ms=t_mid),
                  6: Start.at(MessageId(*ids[9]))}  # exclusive at a ledger's end
        readers = {}
        for handle, start in starts.items():
            readers[handle], _ = await h.engine.open(out, handle, TOPIC, start)
            h.engine.flow(readers[handle], 100)
        await h.append(msgs(20, 21))
        await until(lambda: len(out.got(1)) == 21 and len(out.got(2)) == 1)
        await until(lambda: len(out.got(6)) == 11)
        assert out.got(2) == msgs(20, 21)
        assert out.got(3) == msgs(6, 21) and out.got(4) == msgs(5, 21)
        assert out.got(5) == msgs(10, 21) and out.got(6) == msgs(10, 21)
        landed = await h.engine.seek(readers[1], Start.at(MessageId(*ids[15]), True))
        assert landed == MessageId(*ids[15])
        await h.append(msgs(21, 22))
        await until(lambda: len(out.got(1)) == 21 + 7)
        assert out.got(1)[21:] == msgs(15, 22)

    run(kind, tmp_path, body)


def test_a_stalled_outbox_does_not_hold_up_the_others(kind, tmp_path):
    async def body(h):
        stalled, live = RecordingOutbox(room=False), RecordingOutbox()
        rs, _ = await h.engine.open(stalled, 1, TOPIC, Start())
        rl, _ = await h.engine.open(live, 2, TOPIC, Start())
        h.engine.flow(rs, 10_000)
        h.engine.flow(rl, 10_000)
        for i in range(0, 2000, 100):
            await h.append(msgs(i, i + 100))
        await until(lambda: len(live.got(2)) == 2000)
        assert stalled.frames == []  # nothing was queued for it while it had no room
        stalled.drain()
        await until(lambda: len(stalled.got(1)) == 2000)
        assert stalled.got(1) == live.got(2) == msgs(0, 2000)

    run(kind, tmp_path, body)


class Budget:
    """Memory shared by many outboxes, as the broker's ClientMemory: room while under
    `limit`; a release wakes every outbox that waits."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.waiting: list = []

    def release(self) -> None:
        self.used = 0
        waiting, self.waiting = self.waiting, []
        for cb in waiting:
            cb()


class BudgetOutbox(RecordingOutbox):
    def __init__(self, budget: Budget):
        super().__init__()
        self.budget = budget
        self.raws: list[bytes] = []

    def has_room(self) -> bool:
        return self.budget.used < self.budget.limit

    def call_when_room(self, callback) -> None:
        self.budget.waiting.append(callback)

    def send_entries(self, handles, encoded, size):
        self.budget.used += size
        self.budget.peak = max(self.budget.peak, self.budget.used)
        self.raws += [common_pb2.EncodedEntry.FromString(e).raw for e in encoded]


def test_one_read_for_many_outboxes_stops_at_the_shared_memory_cap(kind, tmp_path):
    """Each outbox copies a read into a frame of its own: a read for 40 readers of 40
    streams queues 40 copies. Past FLUSH_BYTES the rest are asked again, so the broker's
    client memory is passed by at most FLUSH_BYTES (not 40 x 2 MiB)."""
    from shadowtopic.read.engine import FLUSH_BYTES, MAX_FRAME_BYTES

    async def body(h):
        payloads = [bytes([i]) * (100 << 10) for i in range(40)]  # 4 MiB: two reads
        await h.append(payloads)
        budget = Budget(limit=4 << 20)
        outs = [BudgetOutbox(budget) for _ in range(40)]
        for i, out in enumerate(outs):
            r, _ = await h.engine.open(out, 1, TOPIC, Start())
            h.engine.flow(r, 1000)
        for _ in range(200):  # the budget drains until every reader has everything
            await asyncio.sleep(0.01)
            if all(len(o.raws) == 40 for o in outs):
                break
            budget.release()
        assert [o.raws for o in outs] == [payloads] * 40
        assert budget.peak <= budget.limit + FLUSH_BYTES + MAX_FRAME_BYTES, budget.peak

    run(kind, tmp_path, body)


def test_trimmed_ledgers_move_readers_to_the_next_entry(kind, tmp_path):
    async def body(h):
        await h.append(msgs(0, 10))
        out = RecordingOutbox()
        r, _ = await h.engine.open(out, 1, TOPIC, Start())
        await h.trim_first()
        await h.append(msgs(10, 15))
        h.engine.flow(r, 100)
        await until(lambda: len(out.got(1)) == 5)
        assert out.got(1) == msgs(10, 15)

    run(kind, tmp_path, body)


def test_readers_follow_a_reload_of_the_topic(kind, tmp_path):
    async def body(h):
        await h.append(msgs(0, 5))
        out = RecordingOutbox()
        r, _ = await h.engine.open(out, 1, TOPIC, Start())
        h.engine.flow(r, 100)
        await until(lambda: len(out.got(1)) == 5)
        await h.reload()
        await until(lambda: r.topic is not None and r.topic.view is h.view
                    and h.view.closed is None)
        await h.append(msgs(5, 8))
        await until(lambda: len(out.got(1)) == 8)
        assert out.got(1) == msgs(0, 8) and out.errors == []
        h.engine.close(r)
        with pytest.raises(errors.AlreadyClosed):
            await h.engine.seek(r, Start())

    run(kind, tmp_path, body)


def test_a_failed_reload_reports_the_error_on_each_handle(kind, tmp_path):
    async def body(h):
        out = RecordingOutbox()
        r1, _ = await h.engine.open(out, 1, TOPIC, Start())
        r2, _ = await h.engine.open(out, 2, TOPIC, Start())

        async def gone(topic):
            raise errors.TopicNotFound(f"{topic} was deleted")

        h.engine._resolve = gone
        await h.reload()
        await until(lambda: len(out.errors) == 2)
        assert {handle for handle, _ in out.errors} == {1, 2}
        assert all(isinstance(e, errors.TopicNotFound) for _, e in out.errors)

    run(kind, tmp_path, body)


def test_every_view_gives_the_same_reads(tmp_path):
    """The in-memory view, the ManagedLedger and a ShadowLedger of it, driven alike,
    deliver the same entries."""
    seen = {}
    for kind in KINDS:
        async def body(h, kind=kind):
            out = RecordingOutbox()
            r, _ = await h.engine.open(out, 1, TOPIC, Start(EARLIEST))
            h.engine.flow(r, 1000)
            for i in range(5):
                await h.append(msgs(i * 20, i * 20 + 20))
                if i % 2:
                    await h.roll()
            await until(lambda: len(out.got(1)) == 100)
            seen[kind] = [(e.entry_id, e.raw) for _, entries in out.frames for e in entries]
        run(kind, tmp_path / kind, body)
    assert seen["managed"] == seen["memory"] == seen["shadow"]
