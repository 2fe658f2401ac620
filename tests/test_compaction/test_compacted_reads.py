"""Compacted reads against the reference: random put / delete / keyless sequences, compacted
at random points (each compaction building on the previous one, swapped into the view while
it is read), and readers from random start ids through `CompactedView` (over the in-memory
ledger twin and a real `CompactedLedger` of Parquet files): every read equals what the
reference semantics give for that start."""
from __future__ import annotations

import random

import pytest

from shadowtopic.compaction import reference
from shadowtopic.compaction.ledger import CompactedLedger
from shadowtopic.compaction.plan import make_plan
from shadowtopic.compaction.reference import Row, compact
from shadowtopic.compaction.view import CompactedView
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.memory_view import MemoryView
from shadowtopic.ledger.storage import Storage
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

TOPIC = TopicName("t", "ns", "compact-me")  # the topic of the `ledgers` fixture


def expected(rows: list[Row], retain: bool, horizon: tuple[int, int] | None,
             tail: list[Row], start: tuple[int, int]) -> list[tuple[int, int]]:
    """Ids a compacted reader from `start` (inclusive) reads: the reference's survivors up
    to the horizon, then every raw entry after it."""
    prefix = compact(rows, retain) if horizon is not None else []
    ids = [(r.ledger_id, r.entry_id) for r in prefix] + \
        [(r.ledger_id, r.entry_id) for r in tail]
    return [i for i in ids if i >= start]


async def read_all(view: CompactedView, start: MessageId, batch: int) -> list[tuple[int, int]]:
    out = []
    pos = view.valid_position(start)
    while pos < view.next_position():
        got = await view.read(pos, batch, 1 << 20)
        if not got:
            break
        out += [(e.ledger_id, e.entry_id) for e in got]
        pos = view.valid_position(MessageId(got[-1].ledger_id, got[-1].entry_id + 1))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_random_compacted_reads_equal_the_reference(tmp_path, ledgers, seed, arun):
    rnd = random.Random(seed)
    retain = seed % 2 == 0
    st = Storage(str(tmp_path))
    led = ledgers(st)
    lst: list = []  # the MemoryView's ledgers: (id, [(publish_ms, raw)], sealed)
    pointer = None
    compacted_rows: list[Row] = []
    horizon = None

    def add_ledger() -> None:
        items = []
        for _ in range(rnd.randint(1, 40)):
            roll = rnd.random()
            key = None if roll < 0.15 else f"k{rnd.randint(0, 9)}"
            items.append((key, b"" if 0.15 <= roll < 0.35 else f"v{rnd.random():.5f}".encode()))
        led.seal(items)
        n = len(items)
        raws = [r.raw for r in led.rows[-n:]]
        lst.append((led.next_id - 1, [(0, raw) for raw in raws], True))

    async def check() -> None:
        tail = [r for r in led.rows if horizon is None or (r.ledger_id, r.entry_id) > horizon]
        ids = [(r.ledger_id, r.entry_id) for r in led.rows]
        for _ in range(8):
            s = rnd.choice(ids + [(0, 0), (ids[-1][0], ids[-1][1] + 1)])
            got = await read_all(view, MessageId(*s), rnd.randint(1, 7))
            want = expected(compacted_rows, retain, horizon, tail, s)
            assert got == want, (s, horizon)
            assert view.entries_between(MessageId(*s), view.next_position()) == len(want)
        last = view.last_confirmed()
        want = expected(compacted_rows, retain, horizon, tail, (0, 0))
        assert (last.ledger_id, last.entry_id) == want[-1] if want else last is None

    add_ledger()
    mem = MemoryView(ledgers=lst, next_id=2)
    view = CompactedView(mem)

    async def main() -> None:
        nonlocal pointer, compacted_rows, horizon
        for step in range(5):
            for _ in range(rnd.randint(1, 3)):
                add_ledger()
            if rnd.random() < 0.8:  # compact up to the newest ledger
                h = MessageId(led.next_id - 1, len(lst[-1][1]) - 1)
                plan = make_plan(TOPIC, f"j{step}", led.list, h, pointer, retain)
                m = reference.run(plan, st, f"c/j{step}")
                pointer = mpb.CompactionPointer(manifest=m, horizon=m.horizon, job_id=m.job_id)
                view.swap(pointer, CompactedLedger(st, m))
                compacted_rows = list(led.rows)
                horizon = (h.ledger_id, h.entry_id)
            await check()

    arun(main())


def test_a_broken_pointer_fails_prefix_reads_only(tmp_path, ledgers, arun):
    st = Storage(str(tmp_path))
    led = ledgers(st)
    led.seal([("k", b"v")])
    mem = MemoryView(ledgers=[(1, [(0, led.rows[0].raw)], True), (2, [(0, b"tail")], False)],
                     next_id=3)
    view = CompactedView(mem)
    ptr = mpb.CompactionPointer(job_id="x", horizon=MessageId(1, 0).to_pb())
    try:
        CompactedLedger(st, mpb.CompactedManifest(files=[mpb.CompactedFile(path="c/x/gone")]))
    except errors.DataLoss as exc:
        view.swap(ptr, None, exc)
    else:
        raise AssertionError("a missing file opened")

    async def main() -> None:
        with pytest.raises(errors.DataLoss):
            await view.read(view.valid_position(MessageId(0, 0)), 10, 1 << 20)
        tail = await view.read(MessageId(2, 0), 10, 1 << 20)
        assert [e.raw for e in tail] == [b"tail"]
        assert [e.raw for e in await mem.read(MessageId(1, 0), 10, 1 << 20)][:1] == \
            [led.rows[0].raw]

    arun(main())
