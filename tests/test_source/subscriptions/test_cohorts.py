"""Cohorts (source/subscriptions/cohorts.py): subscriptions at one position share one
cursor, split when some of them acknowledge differently and merge back when positions meet.

The model test drives 1,000 subscriptions of one topic with random acknowledgements (one
Ack for many, as a broadcast's grouped listener sends; one consumer's own acks, individual
and cumulative; resets; consumers leaving and coming back) and compares every cursor, after
every step, with a model that keeps a plain cursor per subscription. Then the flushed
cursors load exactly, as cohorts again. Over the in-memory view and the ManagedLedger (the
snapshot cursor store's files). Harness from support/subscriptions_harness.py."""
from __future__ import annotations

import asyncio
import random

from support.fakes import Outbox
from support.subscriptions_harness import Harness, msgs, sub

from shadowtopic.core.message_id import MessageId
from shadowtopic.cursors.state import CursorState, next_after_in, pack, unpack
from shadowtopic.read.positions import MESSAGE_ID, Start

N_SUBS = 1000
N_ENTRIES = 40
STEPS = 300


def run(coro, timeout: float = 120.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def acked(state: CursorState) -> tuple:
    """What a cursor acknowledges (its record without the last activity)."""
    return state.to_record()[:3]


def check(ts, model: dict[str, CursorState]) -> None:
    """Every cursor equals its model; every cohort is consistent with its members."""
    wrong = [n for n, s in ts.subs.items() if acked(s.cursor) != acked(model[n])]
    assert not wrong, (f"{len(wrong)} cursors differ from the model, e.g. {wrong[0]}: "
                       f"{ts.subs[wrong[0]].cursor} != {model[wrong[0]]}")
    for co in ts.cohorts.cohorts():
        assert len(co.members) >= 2
        for m in co.members:
            assert m.cohort is co and m.cursor is co.state, m.name
    for s in ts.subs.values():
        # last activity is each subscription's own: 0 while it has a consumer
        assert (s.cursor.last_active == 0) == bool(s.consumers), s.name
        if s.cohort is not None:
            assert s in s.cohort.members and s.cursor is s.cohort.state, s.name


def test_cohorts_follow_a_cursor_per_subscription_under_random_acks(kind, tmp_path):
    async def main():
        rng = random.Random(34)
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(N_ENTRIES // 2))
        await h.roll()  # a ledger end for cursors to cross
        await h.append(msgs(N_ENTRIES - N_ENTRIES // 2, "n"))
        out = Outbox()
        consumers = {}
        for i in range(N_SUBS):
            consumers[f"s{i}"] = await sub(ts, out, i, f"s{i}", permits=0)
        names = list(consumers)
        view = ts.view
        na = next_after_in(view)
        ids = []
        p = view.first_position()
        while p < view.next_position():
            ids.append(p)
            p = na(p)
        model = {n: CursorState.starting_at(ids[0]) for n in names}
        check(ts, model)
        assert len(ts.cohorts.cohorts()) == 1  # attached at one position: one cohort
        handle = N_SUBS
        splits = merges = 0
        for _step in range(STEPS):
            op = rng.random()
            if op < 0.55:  # one Ack for many (a grouped listener): the next entry of most
                lead = model[rng.choice(names)].read_position(na)
                if lead >= view.next_position():
                    lead = rng.choice(ids)
                share = rng.choice((1.0, 1.0, 0.9, 0.5, 0.1))
                who = [n for n in names if rng.random() < share]
                before = len(ts.cohorts.cohorts())
                assert not ts.ack_many([consumers[n] for n in who], [pack(lead)], False)
                for n in who:
                    model[n].ack_packed([pack(lead)], na)
                after = len(ts.cohorts.cohorts())
                splits += after > before
                merges += after < before
            elif op < 0.75:  # one consumer acknowledges ids of its own, individually
                n = rng.choice(names)
                got = rng.sample(ids, rng.randint(1, 4))
                ts.ack(consumers[n], got, False)
                model[n].ack_packed([pack(m) for m in got], na)
            elif op < 0.85:  # ... or cumulatively, some of them together
                who = rng.sample(names, rng.randint(1, 50))
                upto = rng.choice(ids)
                assert not ts.ack_many([consumers[n] for n in who], [pack(upto)], True)
                for n in who:
                    model[n].ack_cumulative(upto, na)
            elif op < 0.92:  # a reset (admin), durable before it answers
                n = rng.choice(names)
                to = rng.choice(ids[: len(ids) // 2])
                await ts.reset_cursor(n, Start(MESSAGE_ID, message_id=to, inclusive=True),
                                      dry_run=False)
                model[n].seek(to)
                model[n].normalize(na)
            else:  # a consumer leaves and another comes (its last activity changes twice)
                n = rng.choice(names)
                ts.close_consumer(consumers[n])
                consumers[n] = await sub(ts, out, handle, n, permits=0)
                handle += 1
            check(ts, model)
        assert splits and merges, (splits, merges)
        # everyone acknowledges everything: one cohort again
        last = ids[-1]
        assert not ts.ack_many(list(consumers.values()), [pack(last)], True)
        for n in names:
            model[n].ack_cumulative(last, na)
        check(ts, model)
        groups = ts.cohorts.cohorts()
        assert len(groups) == 1 and len(groups[0].members) == N_SUBS
        # flushed and loaded again: exact, and one cursor object for all
        await ts.flusher.flush_now()
        ts2 = await h.open()
        check(ts2, model)
        assert len({id(s.cursor) for s in ts2.subs.values()}) == 1
    run(main())


def test_a_cohort_split_by_an_ack_saves_both_sides(kind, tmp_path):
    """Half a cohort acknowledges: the flushed cursors after a restart are the two halves'
    (never the moving half's position for the other half, nor the reverse)."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(5))
        out = Outbox()
        cs = [await sub(ts, out, i, f"s{i}", permits=0) for i in range(10)]
        first = h.view.first_position()
        assert not ts.ack_many(cs, [pack(first)], False)
        await ts.flusher.flush_now()
        assert not ts.ack_many(cs[:5], [pack(first) + 1], False)  # half moves on
        assert not ts.ack_many(cs[5:], [pack(first) + 3], False)  # the other half: a hole
        await ts.flusher.flush_now()
        await h.crash()
        ts2 = await h.open()
        for i in range(5):
            assert ts2.subs[f"s{i}"].cursor.mark_delete == unpack(pack(first) + 1)
            assert ts2.subs[f"s{i}"].cursor.holes == 0
        for i in range(5, 10):
            assert ts2.subs[f"s{i}"].cursor.mark_delete == first
            assert ts2.subs[f"s{i}"].cursor.ranges == [(MessageId(first.ledger_id, 3),) * 2]
        # the first half loads as one cohort; cursors with holes never meet (rule 3)
        assert [len(c.members) for c in ts2.cohorts.cohorts()] == [5]
        assert ts2.subs["s0"].cohort is ts2.subs["s4"].cohort is not None
        assert ts2.subs["s5"].cohort is None
    run(main())


def test_cursors_saved_before_cohorts_and_last_activity_load_as_cohorts(tmp_path):
    """A snapshot written before cohorts (and before last activity was persisted: every
    row's last_active 0) loads with the cursors exact; equal ones share one cursor (they
    all count from one load time, so they stay equal)."""
    async def main():
        h = Harness("memory", tmp_path)
        ts = await h.open()
        await h.append(msgs(4))
        out = Outbox()
        cs = [await sub(ts, out, i, f"s{i}", permits=0) for i in range(30)]
        first = h.view.first_position()
        for i, c in enumerate(cs):  # three positions, ten subscriptions each
            ts.ack(c, [unpack(pack(first) + k) for k in range(i % 3)], False)
        await ts.flusher.flush_now()
        await h.crash()
        stored = h.cursor_data[h.topic]
        for name, rec in stored.items():  # as an older broker wrote them
            stored[name] = (rec[0], rec[1], rec[2], 0)
        ts2 = await h.open()
        for i in range(30):
            cur = ts2.subs[f"s{i}"].cursor
            assert (pack(cur.mark_delete), cur.holes) == (pack(first) + i % 3 - 1, 0)
        assert sorted(len(c.members) for c in ts2.cohorts.cohorts()) == [10, 10, 10]
        assert len({s.cursor.last_active for s in ts2.subs.values()}) == 1
    run(main())
