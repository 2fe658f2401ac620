"""`CompactedLedger` (compaction/ledger.py) and `CompactedView` (compaction/view.py) over the
in-memory ledger twin (`MemoryView`), with compacted ledgers written per the format by the test
kit (tests/support/compacted_ledgers.py) from its PIP-14 reference. Nothing here uses the
compaction job (tested in tests/test_compaction)."""
from __future__ import annotations

import asyncio
import random
from concurrent.futures import Future

import pytest
from support.compacted_ledgers import (
    BIG,
    TOPIC,
    Topic,
    compact,
    pip14,
    write_compacted,
)
from support.fakes import Count, Outbox

from shadowtopic.compaction.ledger import CompactedLedger
from shadowtopic.compaction.view import CompactedView
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.policies import Policies
from shadowtopic.cursors.store import Fence, MemoryCursorStore
from shadowtopic.ledger.memory_view import MemoryView
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import common_pb2
from shadowtopic.read.positions import EARLIEST, Start
from shadowtopic.subscriptions import (
    EXCLUSIVE,
    FAILOVER,
    KEY_SHARED,
    SHARED,
    TopicSubscriptions,
)


def want(topic: Topic, horizons: list[tuple[int, int]] | tuple[int, int], start=(0, 0),
         retain_null_key: bool = True) -> list[tuple[int, int]]:
    """Ids a compacted reader from `start` reads: the survivors, then the raw tail."""
    h = horizons
    return [r.id for r in pip14(topic.rows, h, retain_null_key) if r.id >= start] + \
        [r.id for r in topic.rows if r.id > h and r.id >= start]


async def read_all(view, start: MessageId, batch: int = 1000, max_bytes: int = BIG,
                   between=None) -> list[tuple[int, int]]:
    """Read by id from `start` as the read engine does (valid_position, read, move past the
    last entry); `between(ids)` is called after each read."""
    out: list[tuple[int, int]] = []
    pos = view.valid_position(start)
    while pos < view.next_position():
        got = await view.read(pos, batch, max_bytes)
        if not got:
            break
        out += [(e.ledger_id, e.entry_id) for e in got]
        if between is not None:
            await between(out)
        pos = view.valid_position(MessageId(got[-1].ledger_id, got[-1].entry_id + 1))
    return out


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


@pytest.fixture
def storage(tmp_path) -> Storage:
    return Storage(str(tmp_path / "storage"))


async def view_of(topic: Topic, storage: Storage, pointer=None) -> CompactedView:
    view = CompactedView(topic.mem, storage=storage)
    if pointer is not None:
        await view.update(pointer)
    return view


# ---- the compacted ledger ---------------------------------------------------------------------

def test_ledger_finds_and_reads_across_files_and_row_groups_of_any_size(storage):
    t = Topic()
    for lid in range(3):
        t.produce([(f"k{i % 7}", f"v{lid}.{i}") for i in range(20)])
        t.roll()
    rows = pip14(t.rows, t.last())
    for files, group in [(1, 1), (2, 3), (3, 5), (4, 1024)]:
        ptr = write_compacted(storage, f"j{files}", rows, t.last(), files=files,
                              group_rows=group)
        led = CompactedLedger(storage, ptr.manifest)
        assert len(led) == len(rows) == 7
        assert [led.id_at(i) for i in range(len(led))] == [r.id for r in rows]
        assert led.first_id() == rows[0].id and led.last_id() == rows[-1].id
        for r in t.rows:  # first survivor at or after every id
            i = led.find(*r.id)
            assert i == next((j for j, s in enumerate(rows) if s.id >= r.id), len(rows))
            assert led.count_between(r.id, (4, 0)) == len(rows) - i
            assert led.count_between((0, 0), r.id) == i
        for i in range(len(rows)):
            for n in (1, 2, 5, 10):
                got = led.read(i, n, BIG)
                assert [(lid, eid, pub, raw) for lid, eid, pub, raw in got] == \
                    [(r.ledger_id, r.entry_id, r.publish_ms, r.raw) for r in rows[i:i + n]]
        one = led.read(0, 10, 1)  # a byte budget still gives one entry
        assert len(one) == 1
        led.close()


def test_ledger_open_fails_on_a_missing_file_or_a_bad_checksum(storage):
    t = Topic()
    t.produce([("a", "1"), ("b", "2")])
    ptr = compact(storage, t, "j")
    gone = mpb.CompactedManifest()
    gone.CopyFrom(ptr.manifest)
    gone.files[0].path += ".gone"
    with pytest.raises(errors.DataLoss, match="part-00000.parquet.gone"):
        CompactedLedger(storage, gone)
    bad = mpb.CompactedManifest()
    bad.CopyFrom(ptr.manifest)
    bad.files[0].crc32c ^= 1
    with pytest.raises(errors.ChecksumError):
        CompactedLedger(storage, bad)
    CompactedLedger(storage, ptr.manifest).close()  # the real one opens


# ---- the view: K1 K3 K4 K5 -------------------------------------------------------------------

def test_latest_value_per_key_with_its_original_id(storage):
    """K1 (and K3: the raw view still holds every message)."""
    async def main():
        t = Topic()
        ids = t.produce([("k", "v1"), ("k", "v2"), ("k", "v3")])
        view = await view_of(t, storage, compact(storage, t, "j1"))
        got = await view.read(view.valid_position(MessageId(0, 0)), 100, BIG)
        assert [(e.ledger_id, e.entry_id) for e in got] == [ids[2]]
        assert common_pb2.Message.FromString(got[0].raw).payload == b"v3"
        assert [(e.ledger_id, e.entry_id) for e in await t.mem.read(MessageId(0, 0), 100, BIG)
                ] == ids
        assert view.first_position() == MessageId(*ids[2])
        assert view.entries_between(MessageId(0, 0), view.next_position()) == 1
    run(main())


def test_tombstones_delete_and_a_readded_key_shows_only_its_new_value(storage):
    """K4."""
    async def main():
        t = Topic()
        ids = t.produce([("a", "1"), ("a", ""), ("b", "1"), ("b", ""), ("b", "2"), ("c", "x"),
                         ("c", "")])
        view = await view_of(t, storage, compact(storage, t, "j1"))
        assert await read_all(view, MessageId(0, 0)) == [ids[4]]
        assert view.last_confirmed() == MessageId(*ids[4])
    run(main())


@pytest.mark.parametrize("retain", [True, False])
def test_keyless_messages_stay_in_place_or_are_dropped(storage, retain):
    """K5: the view serves what the ledger holds, keyless rows at their ids."""
    async def main():
        t = Topic()
        ids = t.produce([(None, "n1"), ("k", "v1"), (None, "n2"), ("k", "v2"), (None, "n3")])
        view = await view_of(t, storage, compact(storage, t, "j1", retain_null_key=retain))
        expect = [ids[0], ids[2], ids[3], ids[4]] if retain else [ids[3]]
        assert await read_all(view, MessageId(0, 0), batch=2) == expect
    run(main())


# ---- K7 K8 K9 ----------------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [1, 2, 3, 1000])
def test_reader_crosses_the_horizon_without_gap_or_duplicate(storage, batch):
    """K7: the compacted prefix, then the raw entries after the horizon (the horizon in the
    middle of a ledger: the rest of that ledger first), then what is produced later; a read
    with room left goes on past the horizon in the same call."""
    async def main():
        t = Topic()
        t.produce([(f"k{i % 3}", f"a{i}") for i in range(6)])
        t.roll()
        t.produce([(f"k{i % 3}", f"b{i}") for i in range(4)])
        horizon = (2, 1)
        view = await view_of(t, storage, compact(storage, t, "j1", horizon=horizon))
        assert await read_all(view, MessageId(0, 0), batch) == want(t, horizon)
        one = await view.read(view.valid_position(MessageId(0, 0)), 100, BIG)
        assert [(e.ledger_id, e.entry_id) for e in one] == want(t, horizon)  # in one call
        t.roll()
        t.produce([("k0", "late"), ("k9", "")])  # produced after the compaction
        got = await read_all(view, MessageId(0, 0), batch)
        assert got == want(t, horizon) and got[-2:] == [(3, 0), (3, 1)]
        assert len(set(got)) == len(got) and got == sorted(got)
        assert view.entries_between(MessageId(0, 0), view.next_position()) == len(got)
    run(main())


def test_start_at_a_compacted_away_id_lands_on_the_next_survivor(storage):
    """K8: a start (or seek) at a compacted-away id lands on the next surviving id; beyond
    the last compacted entry it goes on in the raw ledgers after the horizon."""
    async def main():
        t = Topic()
        ids = t.produce([("a", "1"), ("b", "1"), ("a", "2"), ("c", "1"), ("c", ""),
                         ("b", "")])
        view = await view_of(t, storage, compact(storage, t, "j1"))
        assert view.valid_position(MessageId(*ids[0])) == MessageId(*ids[2])
        assert view.valid_position(MessageId(*ids[1])) == MessageId(*ids[2])
        assert view.valid_position(MessageId(*ids[2])) == MessageId(*ids[2])
        # beyond the last compacted entry, nothing after the horizon yet: the tail
        assert view.valid_position(MessageId(*ids[3])) == view.next_position()
        assert await read_all(view, MessageId(*ids[3])) == []
        t.roll()
        more = t.produce([("d", "1")])
        assert view.valid_position(MessageId(*ids[3])) == MessageId(*more[0])
        assert await read_all(view, MessageId(*ids[3])) == more
        assert await read_all(view, MessageId(*ids[1])) == [ids[2]] + more
        # ids a client may send past 32-bit entries or int64 positions: past the prefix
        assert view.valid_position(MessageId(ids[0][0], 1 << 40)) == MessageId(*more[0])
        assert view.valid_position(MessageId(0, (1 << 63) - 1)) == MessageId(*ids[2])
        assert await read_all(view, MessageId(ids[0][0], (1 << 63) - 1)) == more
    run(main())


def test_last_id_when_the_newest_messages_were_tombstones(storage):
    """K9: the last id a compacted reader can read is the last survivor, so a loop reading
    until it has read the last id ends; once raw entries follow the horizon, the newest."""
    async def main():
        t = Topic()
        ids = t.produce([("a", "1"), ("b", "1"), ("b", ""), ("c", "1"), ("c", "")])
        view = await view_of(t, storage, compact(storage, t, "j1"))
        assert t.mem.last_confirmed() == MessageId(*ids[4])
        last = view.last_confirmed()
        assert last == MessageId(*ids[0])
        pos, seen = view.valid_position(MessageId(0, 0)), []
        while not seen or MessageId(*seen[-1]) < last:  # has_message_available
            got = await view.read(pos, 1, BIG)
            assert got, "the loop would wait for ever"
            seen.append((got[0].ledger_id, got[0].entry_id))
            pos = view.valid_position(MessageId(seen[-1][0], seen[-1][1] + 1))
        assert seen == [ids[0]]
        more = t.produce([("c", "")])  # a tombstone after the horizon is a raw entry
        assert view.last_confirmed() == MessageId(*more[0])
        # everything compacted away and nothing after the horizon: no message at all
        t2 = Topic()
        t2.produce([("a", "1"), ("a", "")])
        v2 = await view_of(t2, storage, compact(storage, t2, "j2"))
        assert v2.last_confirmed() is None and v2.first_position() is None
        assert await read_all(v2, MessageId(0, 0)) == []
    run(main())


def test_position_at_time_searches_the_compacted_prefix(storage):
    async def main():
        t = Topic()
        ids = t.produce([("a", "1"), ("a", "2"), ("b", "1")])  # published 1000, 1001, 1002
        view = await view_of(t, storage, compact(storage, t, "j1"))
        assert await view.position_at_time(0) == MessageId(*ids[1])
        assert await view.position_at_time(1000) == MessageId(*ids[1])
        assert await view.position_at_time(1002) == MessageId(*ids[2])
        assert await view.position_at_time(10 ** 15) == view.next_position()
    run(main())


def test_without_a_pointer_it_is_the_raw_view(storage):
    async def main():
        t = Topic()
        ids = t.produce([("k", "1"), ("k", "2")])
        view = await view_of(t, storage)
        assert await read_all(view, MessageId(0, 0)) == ids
        assert view.last_confirmed() == t.mem.last_confirmed()
        await view.update(compact(storage, t, "j1"))
        assert await read_all(view, MessageId(0, 0)) == [ids[1]]
        await view.update(None)  # the pointer is gone: raw again
        assert await read_all(view, MessageId(0, 0)) == ids
    run(main())


# ---- K15 K17 -------------------------------------------------------------------------------

def test_trimming_raw_ledgers_before_the_horizon_keeps_the_compacted_prefix(storage):
    """K15: retention or truncate of the raw ledgers at or before the horizon does not touch
    the compacted view; a reader in the prefix is not moved."""
    async def main():
        t = Topic()
        ids = t.produce([(f"k{i % 2}", f"v{i}") for i in range(4)])
        t.roll()
        ids += t.produce([("k0", "w")])
        t.roll()
        view = await view_of(t, storage, compact(storage, t, "j1"))
        before = await read_all(view, MessageId(0, 0))
        assert before == [ids[3], ids[4]]

        class Listener:
            trimmed = entries = 0

            def on_entries(self):
                self.entries += 1

            def on_trimmed(self, trimmed):
                self.trimmed += 1

            def on_closed(self, reason):
                pass
        lis = Listener()
        view.add_listener(lis)
        t.mem.trim()  # both sealed ledgers go
        assert lis.trimmed == 1
        assert await t.mem.read(MessageId(0, 0), 10, BIG) == []
        assert view.valid_position(MessageId(*ids[3])) == MessageId(*ids[3])
        assert await read_all(view, MessageId(0, 0)) == before
        assert view.first_position() == MessageId(*ids[3])
        more = t.produce([("k1", "new")])
        assert await read_all(view, MessageId(0, 0)) == before + more
        t.mem.close()
        again = CompactedView(t.mem.reopened(), storage=storage)  # a reload of the topic
        await again.update(compact(storage, t, "j2", horizon=ids[4]))
        assert await read_all(again, MessageId(0, 0)) == before + more
    run(main())


def test_a_pointer_to_a_missing_file_fails_compacted_reads_only(storage):
    """K17: reads at or before the horizon fail with DATA_LOSS (naming the file); reads after
    it and the raw view work; a good pointer later heals the view."""
    async def main():
        t = Topic()
        ids = t.produce([("k", "v1"), ("k", "v2")])
        t.roll()
        good = compact(storage, t, "j1")
        bad = mpb.CompactionPointer()
        bad.CopyFrom(good)
        bad.manifest.files[0].path += ".gone"
        view = await view_of(t, storage, bad)
        assert isinstance(view.broken, errors.DataLoss)
        with pytest.raises(errors.DataLoss, match="gone"):
            await view.read(view.valid_position(MessageId(0, 0)), 10, BIG)
        with pytest.raises(errors.DataLoss):  # GetLastMessageId(read_compacted): no quiet end
            view.last_readable()
        more = t.produce([("k", "v3")])
        assert view.last_readable() == MessageId(*more[0])  # a reader then fails reading
        with pytest.raises(errors.DataLoss):
            await view.read(view.valid_position(MessageId(0, 0)), 10, BIG)
        assert [(e.ledger_id, e.entry_id) for e in await view.read(MessageId(*more[0]), 10, BIG)
                ] == more
        assert [(e.ledger_id, e.entry_id) for e in await t.mem.read(MessageId(0, 0), 10, BIG)
                ] == ids + more
        await view.update(good)
        assert view.broken is None
        assert await read_all(view, MessageId(0, 0)) == [ids[1]] + more
        assert view.last_readable() == MessageId(*more[0])
    run(main())


# ---- pointers swapped while reading -----------------------------------------------------------

def test_a_new_pointer_reaches_readers_by_id(storage):
    """A reader part-way through the first compacted ledger goes on, by id, in the next one
    (a later horizon): no gap, no duplicate id; listeners are woken by the swap."""
    async def main():
        t = Topic()
        t.produce([(f"k{i % 4}", f"a{i}") for i in range(12)])
        t.roll()
        h1 = t.last()
        p1 = compact(storage, t, "j1")
        t.produce([(f"k{i % 4}", f"b{i}") for i in range(8)] + [("k0", "")])
        view = await view_of(t, storage, p1)
        woken = []

        class Listener:
            def on_entries(self):
                woken.append(1)

            def on_trimmed(self, trimmed):
                pass

            def on_closed(self, reason):
                pass
        view.add_listener(Listener())
        swapped = False

        async def between(out):
            nonlocal swapped
            if not swapped and len(out) >= 2:
                swapped = True
                await view.update(compact(storage, t, "j2"))
        got = await read_all(view, MessageId(0, 0), batch=2, between=between)
        assert swapped and woken
        first = want(t, h1)[:2]
        assert got[:2] == first
        assert got[2:] == [i for i in want(t, t.last()) if i > first[-1]]
    run(main())


class SwapInside:
    """An executor that runs the read in place and swaps the view's pointer while it runs
    (as a pointer landing while an executor thread reads)."""

    def __init__(self):
        self.swap = None

    def submit(self, fn, *args):
        fut = Future()
        result = fn(*args)
        if self.swap is not None:
            self.swap, swap = None, self.swap
            swap()
        fut.set_result(result)
        return fut


@pytest.mark.parametrize("to", ["later", "none"])
def test_a_swap_during_a_read_gives_no_gap(storage, to):
    """The read that ran on the old ledger continues into the raw entries after the OLD
    horizon (the new horizon would skip survivors between the two)."""
    async def main():
        t = Topic()
        t.produce([("a", "1"), ("b", "1"), ("a", "2")])
        h1 = t.last()
        p1 = compact(storage, t, "j1")
        t.roll()
        t.produce([("c", "1"), ("d", "1"), ("c", "2")])
        p2 = compact(storage, t, "j2")
        t.roll()
        t.produce([("e", "1")])
        ex = SwapInside()
        view = CompactedView(t.mem, ex, storage=storage)
        view.swap(p1, CompactedLedger(storage, p1.manifest))
        ex.swap = (lambda: view.swap(p2, CompactedLedger(storage, p2.manifest))) \
            if to == "later" else (lambda: view.swap(None, None))
        got = await view.read(MessageId(0, 0), 100, BIG)
        assert ex.swap is None
        assert [(e.ledger_id, e.entry_id) for e in got] == want(t, h1)
    run(main())


# ---- randomized against the reference ---------------------------------------------------------

@pytest.mark.parametrize("seed", range(8))
def test_random_compacted_reads_equal_the_reference(storage, seed):
    rnd = random.Random(seed)

    async def main():
        t = Topic()
        view = await view_of(t, storage)
        horizon = None
        retain = rnd.random() < 0.5
        for step in range(6):
            for _ in range(rnd.randint(1, 3)):
                items = []
                for _ in range(rnd.randint(1, 25)):
                    roll = rnd.random()
                    key = None if roll < 0.15 else f"k{rnd.randint(0, 6)}"
                    items.append((key, "" if 0.15 <= roll < 0.35 else f"v{rnd.random():.4f}"))
                t.produce(items)
                if rnd.random() < 0.7:
                    t.roll()
            if rnd.random() < 0.8:  # a compaction up to a random id (often mid-ledger)
                h = rnd.choice(t.rows[len(t.rows) // 2:]).id
                if horizon is None or h > horizon:
                    horizon = h
                    await view.update(compact(storage, t, f"j{step}", horizon=h,
                                              retain_null_key=retain,
                                              files=rnd.randint(1, 3),
                                              group_rows=rnd.randint(1, 6)))
            ids = [r.id for r in t.rows]
            for _ in range(10):
                s = rnd.choice(ids + [(0, 0), (ids[-1][0], ids[-1][1] + 1), (ids[-1][0] + 5, 0)])
                expect = want(t, horizon, s, retain) if horizon else \
                    [i for i in ids if i >= s]
                got = await read_all(view, MessageId(*s), rnd.randint(1, 9),
                                     rnd.choice([BIG, 1, 40, 200]))
                assert got == expect, (seed, step, s, horizon)
                assert view.entries_between(MessageId(*s), view.next_position()) == len(expect)
            full = want(t, horizon, (0, 0), retain) if horizon else ids
            last = view.last_confirmed()
            assert (last.ledger_id, last.entry_id) == full[-1] if full else last is None
            first = view.first_position()
            assert (first.ledger_id, first.entry_id) == full[0] if full else first is None
    run(main())


# ---- durable subscriptions reading the compacted view -----------------------------------------

async def settle():
    for _ in range(30):
        await asyncio.sleep(0.01)


async def subscriptions(view: CompactedView, mem: MemoryView,
                        meta: MemoryStore | None = None, reload: bool = False
                        ) -> TopicSubscriptions:
    """TopicSubscriptions over `mem` serving read_compacted from `view`; `reload`: as a
    broker loads them (the view opened only when a stored subscription reads it)."""
    meta = meta or MemoryStore()
    own = keys.ownership("c", TOPIC)
    value = mpb.Ownership(broker_id="b", epoch=1).SerializeToString()
    await meta.put(own, value)
    opened = []

    async def open_view():
        opened.append(view)
        return view
    ts = await TopicSubscriptions(TOPIC, mem, meta, MemoryCursorStore(meta, {}),
                                  Fence(own, value), Policies, Count(), 0.05).load(open_view)
    assert opened == ([view] if ts.compacted is not None else [])
    if not reload:
        ts.use_compacted(view)
    return ts


def test_compacted_subscription_acks_across_gaps_and_outlives_raw_trims(storage):
    """A read_compacted subscription: its cursor moves over compacted-away ids (acking each
    survivor leaves no holes), it resumes after a raw trim of the ledgers before the horizon
    at its own position (nothing compacted skipped), and retention need not keep the raw
    ledgers it reads from the compacted ledger."""
    async def main():
        t = Topic()
        t.produce([(f"k{i % 5}", f"v{i}") for i in range(15)])
        t.roll()
        t.produce([("k0", "w0"), ("z", "1"), ("k2", "w2"), ("z", ""), ("y", "1"), ("y", "2")])
        t.roll()  # survivors 1:11 1:13 1:14 2:0 2:2 2:5: gaps between them
        view = await view_of(t, storage, compact(storage, t, "j1"))
        ts = await subscriptions(view, t.mem)
        out = Outbox()
        c, _, _ = await ts.subscribe(out, 1, "s", EXCLUSIVE, Start(EARLIEST),
                                     read_compacted=True)
        ts.flow(c, 3)
        await settle()
        survivors = want(t, t.last())
        assert out.ids(1) == survivors[:3]
        sub = ts.get("s")
        ts.ack(c, [MessageId(*i) for i in out.ids(1)], cumulative=False)
        assert sub.cursor.mark_delete == MessageId(*survivors[2]) and sub.cursor.holes == 0
        assert ts.backlog(sub) == len(survivors) - 3
        assert ts.oldest_needed() is None or ts.oldest_needed() > MessageId(*t.last())
        ts.close_consumer(c)
        t.mem.trim(2)  # retention deletes the raw ledgers before the horizon
        more = t.produce([("k0", "new")])
        out2 = Outbox()
        c2, _, pos = await ts.subscribe(out2, 2, "s", EXCLUSIVE, Start(EARLIEST),
                                        read_compacted=True)
        assert pos == MessageId(*survivors[3])
        ts.flow(c2, 100)
        await settle()
        assert out2.ids(2) == survivors[3:] + more
        assert not out.errors and not out2.errors
    run(main())


@pytest.mark.parametrize("type_", [SHARED, KEY_SHARED])
def test_read_compacted_needs_an_exclusive_or_failover_subscription(storage, type_):
    async def main():
        t = Topic()
        t.produce([("k", "1"), ("k", "2")])
        view = await view_of(t, storage, compact(storage, t, "j1"))
        ts = await subscriptions(view, t.mem)
        with pytest.raises(errors.InvalidArgument, match="Exclusive or Failover"):
            await ts.subscribe(Outbox(), 1, "s", type_, Start(EARLIEST), read_compacted=True)
        assert "s" not in ts.subs
        out = Outbox()
        c, _, _ = await ts.subscribe(out, 1, "f", FAILOVER, Start(EARLIEST),
                                     read_compacted=True)
        with pytest.raises(errors.ConsumerBusy):  # its consumers all read compacted
            await ts.subscribe(Outbox(), 2, "f", FAILOVER, Start(EARLIEST))
        ts.flow(c, 10)
        await settle()
        assert out.ids(1) == [t.rows[1].id]
    run(main())


def test_admin_operations_on_a_compacted_subscription_use_its_view(storage):
    """Peek, skip, backlog and reset of a read_compacted subscription count and land in the
    compacted view (a reset at a compacted-away id lands on the next survivor)."""
    async def main():
        t = Topic()
        ids = t.produce([("a", "1"), ("b", "1"), ("a", "2"), ("c", "1"), ("b", "2"),
                         ("c", "")])
        view = await view_of(t, storage, compact(storage, t, "j1"))
        survivors = want(t, t.last())
        assert survivors == [ids[2], ids[4]]
        ts = await subscriptions(view, t.mem)
        c, _, pos = await ts.subscribe(Outbox(), 1, "s", EXCLUSIVE, Start(EARLIEST),
                                       read_compacted=True)
        assert pos == MessageId(*ids[2])
        sub = ts.get("s")
        assert ts.backlog(sub) == 2
        assert [(e.ledger_id, e.entry_id) for e in await ts.peek("s", 10)] == survivors
        change = await ts.skip("s", 1, dry_run=False)
        assert change.acked == 1 and change.backlog == 1
        assert change.mark_delete == MessageId(*ids[2])
        position, _ = await ts.reset_cursor("s", Start.at(MessageId(*ids[2])), dry_run=False)
        assert position == MessageId(*ids[4])  # after a2: b1..a2 are gone, b2 is next
        position, _ = await ts.reset_cursor("s", Start.at(MessageId(*ids[0]), True), False)
        assert position == MessageId(*ids[2])
        change = await ts.clear_backlog("s", dry_run=False)
        assert change.backlog == 0 and change.acked == 2
        ts.close_consumer(c)
    run(main())


def test_read_compacted_is_stored_with_the_subscription(storage):
    """A subscription keeps reading the compacted view across a reload with no consumer
    attached (its backlog and peek are the compacted view's); a first consumer that reads
    the other way changes what is stored; a topic whose subscriptions all read the raw
    view does not open the compacted one at load."""
    async def main():
        t = Topic()
        ids = t.produce([("a", "1"), ("b", "1"), ("a", "2"), ("c", "1"), ("b", "2"),
                         ("c", "")])
        view = await view_of(t, storage, compact(storage, t, "j1"))
        store = MemoryStore()
        ts = await subscriptions(view, t.mem, store)
        c, _, _ = await ts.subscribe(Outbox(), 1, "s", EXCLUSIVE, Start(EARLIEST),
                                     read_compacted=True)
        ts.close_consumer(c)
        await ts.close()

        again = await subscriptions(view, t.mem, store, reload=True)
        assert again.compacted is view
        sub = again.get("s")
        assert sub.compacted and again.backlog(sub) == 2
        assert [(e.ledger_id, e.entry_id) for e in await again.peek("s", 10)] == \
            [ids[2], ids[4]]
        c, _, pos = await again.subscribe(Outbox(), 2, "s", EXCLUSIVE, Start(EARLIEST))
        assert not sub.compacted and pos == MessageId(*ids[2])  # where it was
        again.close_consumer(c)
        await again.close()

        plain = await subscriptions(view, t.mem, store, reload=True)
        assert plain.compacted is None  # nothing stored reads it: not opened
        assert not plain.get("s").compacted
        assert plain.backlog(plain.get("s")) == 4  # ids[2:] in the raw view
        await plain.close()
    run(main())
