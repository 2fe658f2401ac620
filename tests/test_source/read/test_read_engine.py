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

import pytest
from support.fakes import Outbox
from support.read_harness import (
    KINDS,
    TOPIC,
    msgs,
    run,
    until,
)

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.read.positions import EARLIEST, LATEST, PUBLISH_TIME, Start

# ---- harness ------------------------------------------------------------------------------

@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


# ---- tests --------------------------------------------------------------------------------

def test_readers_at_one_position_share_each_read_and_frame(kind, tmp_path):
    async def body(h):
        await h.append(msgs(0, 300))
        a, b = Outbox(), Outbox()
        readers = []
        for handle in range(1, 11):
            r, last = await h.engine.open(a if handle <= 5 else b, handle, TOPIC, Start())
            readers.append(r)
        assert last.entry_id == 299
        for r in readers:
            h.engine.flow(r, 1000)
        await until(lambda: all(len(o.raws(r.handle)) == 300
                                for o, r in [(a, readers[0]), (b, readers[9])]))
        for r in readers:
            out = a if r.handle <= 5 else b
            assert out.raws(r.handle) == msgs(0, 300)
        assert h.reads <= 3, "each entry should be read once for all ten readers"
        assert {tuple(sorted(hs)) for hs, _ in a.frames} == {(1, 2, 3, 4, 5)}
        assert {tuple(sorted(hs)) for hs, _ in b.frames} == {(6, 7, 8, 9, 10)}
        assert h.counters.msgs == 3000

    run(kind, tmp_path, body)


def test_flow_permits_bound_what_is_sent(kind, tmp_path):
    async def body(h):
        await h.append(msgs(0, 50))
        out = Outbox()
        r, _ = await h.engine.open(out, 1, TOPIC, Start())
        h.engine.flow(r, 7)
        await until(lambda: len(out.raws(1)) == 7)
        await asyncio.sleep(0.05)
        assert out.raws(1) == msgs(0, 7)
        h.engine.flow(r, 100)
        await until(lambda: len(out.raws(1)) == 50)
        await h.append(msgs(50, 60))  # the tail: woken by the view, no polling
        await until(lambda: len(out.raws(1)) == 60)
        assert out.raws(1) == msgs(0, 60)

    run(kind, tmp_path, body)


def test_start_positions_and_seek(kind, tmp_path):
    async def body(h):
        await h.append(msgs(0, 10))
        await h.roll()
        t_mid = int(time.time() * 1000) + 5
        await asyncio.sleep(0.02)
        await h.append(msgs(10, 20))
        ids = [(e.ledger_id, e.entry_id) for e in await h.view.read(MessageId(0, 0), 100, 1 << 20)]
        out = Outbox()
        fifth = MessageId(*ids[5])
        starts = {1: Start(), 2: Start(LATEST), 3: Start.at(fifth), 4: Start.at(fifth, True),
                  5: Start(PUBLISH_TIME, publish_ms=t_mid),
                  6: Start.at(MessageId(*ids[9]))}  # exclusive at a ledger's end
        readers = {}
        for handle, start in starts.items():
            readers[handle], _ = await h.engine.open(out, handle, TOPIC, start)
            h.engine.flow(readers[handle], 100)
        await h.append(msgs(20, 21))
        await until(lambda: len(out.raws(1)) == 21 and len(out.raws(2)) == 1)
        await until(lambda: len(out.raws(6)) == 11)
        assert out.raws(2) == msgs(20, 21)
        assert out.raws(3) == msgs(6, 21) and out.raws(4) == msgs(5, 21)
        assert out.raws(5) == msgs(10, 21) and out.raws(6) == msgs(10, 21)
        landed = await h.engine.seek(readers[1], Start.at(MessageId(*ids[15]), True))
        assert landed == MessageId(*ids[15])
        await h.append(msgs(21, 22))
        await until(lambda: len(out.raws(1)) == 21 + 7)
        assert out.raws(1)[21:] == msgs(15, 22)

    run(kind, tmp_path, body)


def test_a_stalled_outbox_does_not_hold_up_the_others(kind, tmp_path):
    async def body(h):
        stalled, live = Outbox(room=False), Outbox()
        rs, _ = await h.engine.open(stalled, 1, TOPIC, Start())
        rl, _ = await h.engine.open(live, 2, TOPIC, Start())
        h.engine.flow(rs, 10_000)
        h.engine.flow(rl, 10_000)
        for i in range(0, 2000, 100):
            await h.append(msgs(i, i + 100))
        await until(lambda: len(live.raws(2)) == 2000)
        assert stalled.frames == []  # nothing was queued for it while it had no room
        stalled.drain()
        await until(lambda: len(stalled.raws(1)) == 2000)
        assert stalled.raws(1) == live.raws(2) == msgs(0, 2000)

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


class BudgetOutbox(Outbox):
    """An outbox whose room is a budget shared with the other outboxes."""

    def __init__(self, budget: Budget):
        super().__init__()
        self.budget = budget

    def has_room(self) -> bool:
        return self.budget.used < self.budget.limit

    def call_when_room(self, callback) -> None:
        self.budget.waiting.append(callback)

    def send_entries(self, handles, encoded, size):
        super().send_entries(handles, encoded, size)
        self.budget.used += size
        self.budget.peak = max(self.budget.peak, self.budget.used)


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
        for _i, out in enumerate(outs):
            r, _ = await h.engine.open(out, 1, TOPIC, Start())
            h.engine.flow(r, 1000)
        for _ in range(200):  # the budget drains until every reader has everything
            await asyncio.sleep(0.01)
            if all(len(o.raws()) == 40 for o in outs):
                break
            budget.release()
        assert [o.raws() for o in outs] == [payloads] * 40
        assert budget.peak <= budget.limit + FLUSH_BYTES + MAX_FRAME_BYTES, budget.peak

    run(kind, tmp_path, body)


def test_trimmed_ledgers_move_readers_to_the_next_entry(kind, tmp_path):
    async def body(h):
        await h.append(msgs(0, 10))
        out = Outbox()
        r, _ = await h.engine.open(out, 1, TOPIC, Start())
        await h.trim_first()
        await h.append(msgs(10, 15))
        h.engine.flow(r, 100)
        await until(lambda: len(out.raws(1)) == 5)
        assert out.raws(1) == msgs(10, 15)

    run(kind, tmp_path, body)


def test_readers_follow_a_reload_of_the_topic(kind, tmp_path):
    async def body(h):
        await h.append(msgs(0, 5))
        out = Outbox()
        r, _ = await h.engine.open(out, 1, TOPIC, Start())
        h.engine.flow(r, 100)
        await until(lambda: len(out.raws(1)) == 5)
        await h.reload()
        await until(lambda: r.topic is not None and r.topic.view is h.view
                    and h.view.closed is None)
        await h.append(msgs(5, 8))
        await until(lambda: len(out.raws(1)) == 8)
        assert out.raws(1) == msgs(0, 8) and out.errors == []
        h.engine.close(r)
        with pytest.raises(errors.AlreadyClosed):
            await h.engine.seek(r, Start())

    run(kind, tmp_path, body)


def test_a_failed_reload_reports_the_error_on_each_handle(kind, tmp_path):
    async def body(h):
        out = Outbox()
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
            out = Outbox()
            r, _ = await h.engine.open(out, 1, TOPIC, Start(EARLIEST))
            h.engine.flow(r, 1000)
            for i in range(5):
                await h.append(msgs(i * 20, i * 20 + 20))
                if i % 2:
                    await h.roll()
            await until(lambda: len(out.raws(1)) == 100)
            seen[kind] = [(e.entry_id, e.raw) for _, entries in out.frames for e in entries]
        run(kind, tmp_path / kind, body)
    assert seen["managed"] == seen["memory"] == seen["shadow"]
