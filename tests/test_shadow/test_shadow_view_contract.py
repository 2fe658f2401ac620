"""ShadowLedger against the view contract: what tests/test_source/read/test_read_engine.py does not
say directly.

- Listeners: every kind of view (the suite's `KINDS`) tells its listeners the same changes,
  once each, driven alike (the shadow's through its source).
- The shadow answers as its source: a source ManagedLedger driven at random (appends,
  rolls, truncation, retention of a prefix, the source reloaded by a new owner, the shadow
  reloaded, the replicator lagging) and a ShadowLedger of it on the same MemoryStore and
  storage root give the same answer to every `LedgerView` question once the shadow has
  been told the source's last confirmed id; before that, whatever it returns is a prefix
  of what the source returns.
- A reader of the shadow keeps its place when the source's owner changes.

Harness, drivers and helpers are the read engine suite's (tests/support/read_harness.py)."""
from __future__ import annotations

import asyncio
import random

import pytest
from support.fakes import Outbox
from support.read_harness import KINDS, TOPIC, ShadowDriver, msgs, run, until

from shadowtopic.core.message_id import MessageId
from shadowtopic.ledger import wal
from shadowtopic.read.positions import Start


class Heard:
    """A ViewListener that records what it heard."""

    def __init__(self):
        self.calls: list = []

    def on_entries(self):
        self.calls.append("entries")

    def on_trimmed(self, trimmed):
        self.calls.append(("trimmed", tuple((r.ledger_id, r.entries) for r in trimmed.ledgers)))

    def on_closed(self, reason):
        self.calls.append(("closed", type(reason).__name__))


# ---- listeners ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_listeners_hear_each_change_once(kind, tmp_path):
    """One `on_entries` per append (each one here is one group commit), none for a roll,
    one `on_trimmed` naming the trimmed ledgers and their entries, one `on_closed` on
    close; a removed listener hears nothing more."""
    async def body(h):
        heard, removed = Heard(), Heard()
        h.view.add_listener(heard)
        h.view.add_listener(removed)
        await h.append(msgs(0, 3))
        await h.append(msgs(3, 5))
        first = h.view.ranges()[0].ledger_id
        await h.roll()
        second = h.view.ranges()[-1].ledger_id
        await h.append(msgs(5, 9))
        h.view.remove_listener(removed)
        await h.trim_first()
        await h.append(msgs(9, 10))
        view = h.view
        await h.reload()
        await until(lambda: view.closed is not None)
        await asyncio.sleep(0.05)  # nothing more comes
        assert heard.calls == ["entries", "entries", "entries",
                               ("trimmed", ((first, 5), (second, 4))), "entries",
                               ("closed", "TopicNotOwned")]
        assert removed.calls == ["entries", "entries", "entries"]

    run(kind, tmp_path, body)


# ---- the shadow answers as its source --------------------------------------------------------

async def assert_same_answers(shadow, source, rng: random.Random, lids: set[int]) -> None:
    """Every LedgerView question, asked of the caught-up shadow and of its source."""
    assert [r[:3] for r in shadow.ranges()] == [r[:3] for r in source.ranges()]
    assert shadow.first_position() == source.first_position()
    assert shadow.last_confirmed() == source.last_confirmed()
    nxt = source.next_position()
    assert shadow.next_position() == nxt
    positions = {MessageId(0, 0), nxt, MessageId(nxt.ledger_id, nxt.entry_id + 1),
                 MessageId(nxt.ledger_id + 1, 0)}
    counts = {r.ledger_id: r.entries for r in source.ranges()}
    for lid in lids | set(counts):  # ledgers deleted meanwhile too
        n = counts.get(lid, 2)
        positions.update(MessageId(lid, e) for e in range(n + 2))
    positions = sorted(positions)
    for p in positions:
        assert shadow.valid_position(p) == source.valid_position(p), p
    for p in rng.sample(positions, min(len(positions), 25)) + [MessageId(0, 0)]:
        for max_entries, max_bytes in ((1, 1 << 20), (7, 1 << 20), (1000, 1 << 30), (50, 10)):
            got = await shadow.read(p, max_entries, max_bytes)
            want = await source.read(p, max_entries, max_bytes)
            assert got == want, (p, max_entries, max_bytes)
    for _ in range(40):
        a, b = sorted(rng.sample(positions, 2)) if len(positions) > 1 else (positions[0],) * 2
        assert shadow.entries_between(a, b) == source.entries_between(a, b), (a, b)
    everything = await source.read(MessageId(0, 0), 1 << 20, 1 << 40)
    times = sorted({e.publish_ms for e in everything})
    for t in [0, 1 << 62] + [t + d for t in times for d in (-1, 0, 1)]:
        assert await shadow.position_at_time(t) == await source.position_at_time(t), t


async def assert_prefix(shadow, source, positions) -> None:
    """What a shadow that was not told everything returns is what the source holds."""
    last, slast = shadow.last_confirmed(), source.last_confirmed()
    assert last is None or (slast is not None and last <= slast)
    for p in positions:
        got = await shadow.read(p, 1000, 1 << 30)
        want = await source.read(p, 1000, 1 << 30)
        assert got == want[:len(got)], p


@pytest.mark.parametrize("seed", range(6))
def test_the_shadow_answers_as_its_source(seed, tmp_path):
    rng = random.Random(seed)

    async def main():
        d = ShadowDriver(tmp_path)
        shadow = await d.open()
        heard_shadow, heard_source = Heard(), Heard()
        shadow.add_listener(heard_shadow)
        d.source.add_listener(heard_source)
        lids: set[int] = set()
        i = 0
        try:
            for _step in range(40):
                op = rng.choices(["append", "lagging", "roll", "truncate", "retention",
                                  "source reload", "shadow reload"],
                                 [10, 4, 3, 1, 2, 1, 1])[0]
                if op in ("append", "lagging"):
                    n = rng.randint(1, 30)
                    raws = msgs(i, i + n)
                    i += n
                    if op == "append":
                        await d.append(shadow, raws)
                    else:  # the replicator has not sent this batch yet
                        await d.source.append(raws, wal.request_bytes(raws),
                                              sum(map(len, raws)))
                        await assert_prefix(shadow, d.source,
                                            [MessageId(0, 0)] + [MessageId(r.ledger_id, 0)
                                                                 for r in d.source.ranges()])
                        continue
                elif op == "roll":
                    await d.source.roll()
                elif op == "truncate":
                    await d.source.truncate()
                elif op == "retention":
                    sealed = [r.ledger_id for r in d.source.ranges() if r.sealed]
                    if sealed:
                        keep = MessageId(rng.choice(sealed), 0)
                        await d.source.apply_retention(-1, 0, keep_from=keep)
                elif op == "source reload":  # the source's owner changes: recover and seal
                    await d.source.close()
                    d.source = await d.managed.open()
                    d.source.add_listener(heard_source)
                else:
                    await shadow.close()
                    shadow.remove_listener(heard_shadow)
                    shadow = await d.open()
                    shadow.add_listener(heard_shadow)
                last = d.source.last_confirmed()
                if last is not None:  # the replicator's next batch or heartbeat
                    shadow.on_replicated(last)
                await d.caught_up(shadow)
                lids.update(r.ledger_id for r in d.source.ranges())
                await assert_same_answers(shadow, d.source, rng, lids)
            trims = [c for c in heard_shadow.calls if c[0] == "trimmed"]
            assert trims == [c for c in heard_source.calls if c[0] == "trimmed"]
        finally:
            await shadow.close()
            await d.close()
            d.executor.shutdown(wait=True)

    asyncio.run(asyncio.wait_for(main(), 120))


# ---- a reader of the shadow across a change of the source's owner ----------------------------

def test_a_shadow_reader_keeps_its_place_when_the_source_changes_owner(tmp_path):
    """The source's open ledger is left OPEN by its owner, recovered and sealed by the next
    one, which opens a new ledger: the shadow (not reloaded) follows, and its reader gets
    every entry once, in order, with no error."""
    async def body(h):
        d = h.shadow
        await h.append(msgs(0, 5))
        out = Outbox()
        r, _ = await h.engine.open(out, 1, TOPIC, Start())
        h.engine.flow(r, 100)
        await until(lambda: len(out.raws(1)) == 5)
        await d.source.close()
        d.source = await d.managed.open()
        h.view.on_replicated(d.source.last_confirmed())  # the replicator's heartbeat
        await d.caught_up(h.view)
        assert [r.sealed for r in h.view.ranges()] == [True, False]
        await h.append(msgs(5, 8))
        await until(lambda: len(out.raws(1)) == 8)
        await asyncio.sleep(0.05)
        assert out.raws(1) == msgs(0, 8) and out.errors == []
        assert r.topic.view is h.view and h.view.closed is None

    run("shadow", tmp_path, body)
