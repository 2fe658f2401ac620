"""`CursorFlusher.persist` (issue 29): a cursor change whose answer says done is written at
once, alone (not with the topic's other dirty cursors), concurrent calls share writes, and
a flush holding an older state of the same cursor can never land after it."""
from __future__ import annotations

import asyncio
import uuid

import pytest

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.cursors import (
    CursorFlusher,
    CursorState,
    CursorStore,
    Fence,
    MemoryCursorStore,
    SnapshotCursorStore,
)
from shadowtopic.cursors.snapshot import URGENT_DEFER
from shadowtopic.cursors.store import records
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import MemoryStore, keys
from shadowtopic.pb.storage.v1 import cursors_pb2 as cpb

pytestmark = pytest.mark.timeout(60)
M = MessageId


class Gated(CursorStore):
    """A store whose saves wait at `gate` (open by default) after reading their states, as
    the real stores read them: before their first await. `writes` lists what each save
    read, in the order the saves started; `fail` fails the next few saves."""

    def __init__(self, inner: CursorStore):
        self.inner = inner
        self.gate = asyncio.Event()
        self.gate.set()
        self.writes: list[dict] = []
        self.urgent: list[bool] = []
        self.fail = 0

    async def load(self, topic):
        return await self.inner.load(topic)

    async def save(self, topic, changes, fence, *, urgent=False):
        recs = records(changes)
        self.writes.append(recs)
        self.urgent.append(urgent)
        await self.gate.wait()
        if self.fail:
            self.fail -= 1
            raise errors.StorageFull("cursor storage is full")
        await self.inner.save(topic, {n: None if r is None else CursorState.from_record(r)
                                      for n, r in recs.items()}, fence)

    async def delete(self, topic, fence):
        await self.inner.delete(topic, fence)


async def setup(interval: float = 3600.0):
    metadata = MemoryStore()
    topic = TopicName.parse(f"persistent://t/ns/p-{uuid.uuid4().hex[:8]}")
    fence = Fence(keys.ownership("test", topic), b"owner-1")
    await metadata.put(fence.key, fence.value)
    data: dict = {}
    store = Gated(MemoryCursorStore(metadata, data))
    flusher = CursorFlusher(store, topic, fence, interval=interval).start()
    return store, flusher, lambda: MemoryCursorStore(metadata, data).load(topic), metadata


def test_persist_writes_that_cursor_alone_and_leaves_it_clean(arun):
    async def main():
        store, flusher, disk, _ = await setup()
        a, b = CursorState.starting_at(M(1, 0)), CursorState.starting_at(M(1, 0))
        a.ack_cumulative(M(1, 4))
        b.ack_cumulative(M(1, 9))
        flusher.mark("a", a)             # an acknowledgement: batched
        flusher.mark("b", b)
        b.seek(M(1, 2))                  # then a reset of b, answered once persisted
        await flusher.persist("b", b)
        assert [list(w) for w in store.writes] == [["b"]]   # one cursor, not the topic's
        assert await disk() == {"b": b}
        assert flusher.pending == 1      # a still waits for the flush; b is clean
        b.ack_cumulative(M(1, 3))        # changed after its write: dirty again
        flusher.mark("b", b)
        await flusher.flush_now()
        assert await disk() == {"a": a, "b": b}
        assert store.urgent == [True, False]    # the store may put off its compaction
        await flusher.close()
    arun(main())


def test_concurrent_persists_share_writes(arun):
    async def main():
        store, flusher, disk, _ = await setup()
        cursors = {f"s{i}": CursorState.starting_at(M(1, i)) for i in range(50)}
        store.gate.clear()               # the first write waits: the others pile up
        first = asyncio.create_task(flusher.persist("s0", cursors["s0"]))
        await asyncio.sleep(0.01)
        rest = [asyncio.create_task(flusher.persist(n, c)) for n, c in cursors.items()
                if n != "s0"]
        await asyncio.sleep(0.01)
        assert not any(t.done() for t in [first, *rest])
        store.gate.set()
        await asyncio.gather(first, *rest)
        assert [len(w) for w in store.writes] == [1, 49]    # two writes for 50 calls
        assert await disk() == cursors
        assert flusher.persists == 2 and flusher.pending == 0
        await flusher.close()
    arun(main())


def test_a_flush_in_flight_with_an_older_state_never_lands_after_a_persist(arun):
    """A flush read the cursor's acknowledged state and is still writing when a reset of the
    same cursor is persisted: the reset's write goes after it, so the reset is what stays."""
    async def main():
        store, flusher, disk, _ = await setup()
        state = CursorState.starting_at(M(1, 0))
        state.ack_cumulative(M(1, 19))
        flusher.mark("s", state)
        store.gate.clear()
        flush = asyncio.create_task(flusher.flush_now())
        await asyncio.sleep(0.01)
        assert store.writes[0]["s"][:2] == (1, 19)          # the flush holds the old state
        state.seek(M(1, 5))              # the reset
        reset = asyncio.create_task(flusher.persist("s", state))
        await asyncio.sleep(0.01)
        assert not reset.done()          # it waits for the flush in flight, then writes
        store.gate.set()
        await asyncio.gather(flush, reset)
        assert [w["s"][:2] for w in store.writes] == [(1, 19), (1, 4)]
        assert (await disk())["s"].mark_delete == M(1, 4)   # next read: 1:5
        await flusher.close()
    arun(main())


def test_a_failed_persist_raises_and_the_flush_retries_it(arun):
    async def main():
        store, flusher, disk, metadata = await setup()
        state = CursorState.starting_at(M(1, 3))
        store.fail = 1
        with pytest.raises(errors.StorageFull):
            await flusher.persist("s", state)
        assert flusher.pending == 1      # kept dirty: saved with the next flush
        await flusher.flush_now()
        assert await disk() == {"s": state}
        await metadata.put(flusher.fence.key, b"another-owner")
        with pytest.raises(errors.Fenced):
            await flusher.persist("s", state)
        with pytest.raises(errors.Fenced):   # and stays fenced
            await flusher.persist("s", state)
    arun(main())


def test_urgent_saves_put_off_the_compaction_that_rewrites_every_cursor(arun, tmp_path):
    """A reset of one subscription among many writes one small delta, not the full file of
    every cursor: urgent saves compact only past compact_every * URGENT_DEFER deltas; the
    next batched save compacts as before."""
    async def main():
        metadata = MemoryStore()
        topic = TopicName.parse("persistent://t/ns/compact")
        fence = Fence(keys.ownership("test", topic), b"owner-1")
        await metadata.put(fence.key, fence.value)
        store = SnapshotCursorStore(metadata, Storage(str(tmp_path)), compact_every=2)
        model = {f"s{i}": CursorState.starting_at(M(1, i)) for i in range(200)}
        await store.save(topic, model, fence)

        async def deltas() -> int:
            kv = await metadata.get(keys.cursors(topic))
            return len(cpb.CursorPointer.FromString(kv.value).deltas)

        for i in range(2 * URGENT_DEFER):
            model["s0"] = CursorState.starting_at(M(2, i))
            await store.save(topic, {"s0": model["s0"]}, fence, urgent=True)
            assert await deltas() == i + 1
        model["s0"] = CursorState.starting_at(M(3, 0))
        await store.save(topic, {"s0": model["s0"]}, fence, urgent=True)
        assert await deltas() == 0                      # the cap: compacted after all
        for i, want in enumerate([1, 2, 0]):            # batched: compacts past 2, as before
            model["s1"] = CursorState.starting_at(M(4, i))
            await store.save(topic, {"s1": model["s1"]}, fence)
            assert await deltas() == want
        assert await SnapshotCursorStore(metadata, Storage(str(tmp_path))).load(topic) == model
    arun(main())


def test_unsaved_counts_the_cursors_of_the_save_under_way(arun):
    """`unsaved` (internal stats' cursorsUnsaved): a cursor stays unsaved until the flush
    holding it is written, not just taken off the dirty list (a test that waits for it to
    be 0 knows a kill -9 now loses no acknowledgement)."""
    async def main():
        store, flusher, disk, _ = await setup()
        state = CursorState.starting_at(M(1, 0))
        state.ack_cumulative(M(1, 9))
        flusher.mark("s", state)
        assert flusher.unsaved == 1
        store.gate.clear()
        flush = asyncio.create_task(flusher.flush_now())
        await asyncio.sleep(0.01)
        assert flusher.pending == 0 and flusher.unsaved == 1    # taken, not yet written
        store.gate.set()
        await flush
        assert flusher.unsaved == 0 and await disk() == {"s": state}
        store.fail = 1
        flusher.mark("s", state)
        with pytest.raises(errors.StorageFull):
            await flusher.flush_now()
        assert flusher.unsaved == 1      # a failed save leaves it unsaved
        await flusher.close()
    arun(main())
