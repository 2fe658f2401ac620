"""`OpenedLedgers` (compaction/opened.py): the views of one source on a broker open its
compacted ledger once and read its row groups once; and `CompactedLedger.read`'s limits over
the cached groups (compaction/ledger.py)."""
from __future__ import annotations

import asyncio
import gc
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.compacted_ledgers import BIG, Topic, compact, pip14, write_compacted

from shadowtopic.compaction.ledger import CompactedLedger
from shadowtopic.compaction.opened import OpenedLedgers
from shadowtopic.compaction.view import CompactedView, open_ledger
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.ledger.storage import Storage


@pytest.fixture
def storage(tmp_path) -> Storage:
    return Storage(str(tmp_path / "storage"))


def topic_of(n: int, keys: int, seed: int = 1) -> Topic:
    rnd = random.Random(seed)
    t = Topic()
    for lid in range(3):
        t.produce([(f"k{rnd.randrange(keys)}", "v" * rnd.randrange(1, 40) + f"{lid}.{i}")
                   for i in range(n)])
        t.roll()
    return t


async def settled() -> None:
    """Let the loop run the wakeups still holding a finished open's future, then collect."""
    for _ in range(3):
        await asyncio.sleep(0)
    gc.collect()


class CountingOpen:
    """`open_ledger`, counted, and held until `release` (to overlap the opens)."""

    def __init__(self):
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, storage, manifest) -> CompactedLedger:
        self.calls += 1
        self.gate.wait(10)
        return open_ledger(storage, manifest)


def test_views_of_one_source_share_one_open_ledger_and_its_row_groups(storage):
    """Five views (a source and four shadows on one broker) on the same pointer: one open,
    one ledger, and a row group read by one view is not read again by the others."""
    t = topic_of(40, 25)
    ptr = compact(storage, t, "j1", group_rows=4)

    async def go():
        with ThreadPoolExecutor(2) as ex:
            opens = CountingOpen()
            opens.gate.clear()  # all five ask while the first open is under way
            ledgers = OpenedLedgers(storage, ex, opens)
            views = [CompactedView(t.mem, ex, storage, ledgers=ledgers) for _ in range(5)]
            updates = [asyncio.create_task(v.update(ptr)) for v in views]
            await asyncio.sleep(0.05)
            opens.gate.set()
            await asyncio.gather(*updates)
            assert opens.calls == 1 and ledgers.opens == 1 and len(ledgers) == 1
            assert all(v.ledger is views[0].ledger for v in views)
            first = await views[0].read(MessageId(0, 0), 3, BIG)
            ledger = views[0].ledger
            assert ledger is not None
            group = ledger._files[0].groups[0]
            for v in views[1:]:
                assert await v.read(MessageId(0, 0), 3, BIG) == first
                assert ledger._files[0].groups[0] is group  # not read again
            assert [(e.ledger_id, e.entry_id) for e in first] == \
                [r.id for r in pip14(t.rows, t.last())][:3]
            # a new pointer: the old ledger goes with its last view, the new one opens once
            ptr2 = compact(storage, t, "j2", group_rows=4)
            for v in views:
                await v.update(ptr2)
            del ledger, group, first
            await settled()
            assert opens.calls == 2 and len(ledgers) == 1
            for v in views:
                await v.update(None)
            await settled()
            assert len(ledgers) == 0
    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_failed_open_fails_every_asker_and_is_not_kept(storage):
    t = topic_of(10, 5)
    ptr = compact(storage, t, "j1")
    ptr.manifest.files[0].crc32c ^= 1  # the file no longer matches its manifest

    async def go():
        with ThreadPoolExecutor(2) as ex:
            opens = CountingOpen()
            ledgers = OpenedLedgers(storage, ex, opens)
            got = await asyncio.gather(ledgers.open(ptr.manifest), ledgers.open(ptr.manifest),
                                       return_exceptions=True)
            assert all(isinstance(g, errors.ChecksumError) for g in got)
            assert opens.calls == 1 and len(ledgers) == 0
            with pytest.raises(errors.ChecksumError):
                await ledgers.open(ptr.manifest)
            assert opens.calls == 2  # tried again, not remembered as failed
    asyncio.run(asyncio.wait_for(go(), 30))


def test_one_asker_cancelled_does_not_fail_the_others(storage):
    t = topic_of(10, 5)
    ptr = compact(storage, t, "j1")

    async def go():
        with ThreadPoolExecutor(2) as ex:
            opens = CountingOpen()
            opens.gate.clear()
            ledgers = OpenedLedgers(storage, ex, opens)
            first = asyncio.create_task(ledgers.open(ptr.manifest))
            second = asyncio.create_task(ledgers.open(ptr.manifest))
            await asyncio.sleep(0.05)
            first.cancel()
            opens.gate.set()
            ledger = await second
            assert len(ledger) == len(pip14(t.rows, t.last())) and opens.calls == 1
    asyncio.run(asyncio.wait_for(go(), 30))


def test_read_stops_at_the_entry_that_reaches_the_byte_budget(storage):
    """Against the plain rule (take entries until their bytes reach the budget, at least
    one), over groups of several sizes, from every row, with random limits."""
    t = topic_of(60, 40, seed=3)
    rows = pip14(t.rows, t.last())
    rnd = random.Random(7)
    for files, group in [(1, 1), (2, 3), (3, 7), (1, 1000)]:
        ptr = write_compacted(storage, f"j{files}-{group}", rows, t.last(), files=files,
                              group_rows=group)
        led = CompactedLedger(storage, ptr.manifest)
        for i in range(len(rows)):
            for _ in range(5):
                n, budget = rnd.randrange(1, 30), rnd.choice([1, 10, 60, 200, 1000, BIG])
                want, size = [], 0
                for r in rows[i:i + n]:
                    want.append((r.ledger_id, r.entry_id, r.publish_ms, r.raw))
                    size += len(r.raw)
                    if size >= budget:
                        break
                assert [tuple(e) for e in led.read(i, n, budget)] == want, (i, n, budget)
        led.close()
