"""C3a: a redelivery count counts only what the application received and gave back (a nack
names it), so a dead-letter policy never acts on a message the application never saw
(source/subscriptions/subscription.py, "What a redelivery counts"). Every case runs on the
in-memory view and on the source's ManagedLedger (the `kind` fixture)."""
from __future__ import annotations

import pytest
from support.fakes import Outbox
from support.subscriptions_harness import Harness, msgs, raw, run, settle, sub

from shadowtopic.core.message_id import MessageId
from shadowtopic.subscriptions import EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED, CursorMoved


def counts(out: Outbox, handle: int, since: int = 0) -> dict[tuple[int, int], int]:
    """(ledger, entry) -> redelivery count of what `handle` was sent from `since` on."""
    return {(e.ledger_id, e.entry_id): e.redelivery_count
            for e in out.entries(handle)[since:]}


@pytest.mark.parametrize("type_", [EXCLUSIVE, FAILOVER])
def test_c3a_a_nack_on_a_single_active_subscription_counts_only_its_id(kind, tmp_path, type_):
    """The 26-message case: 50 entries sit in the consumer's receiver queue, the application
    received one and nacks it. The rewind redelivers all 50 in order; only the nacked one
    counts, and a second nack of it counts it twice."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(50))
        out = Outbox()
        c = await sub(ts, out, 1, "s", type_)
        await settle()
        ids = out.ids(1)
        assert len(ids) == 50
        ts.nack(c, [MessageId(*ids[7])], 0)
        assert (1, CursorMoved(MessageId(*ids[0]), False, True)) in out.notices
        ts.flow(c, 1000)
        await settle()
        again = counts(out, 1, 50)
        assert list(again) == ids                       # everything again, in order
        assert again[ids[7]] == 1
        assert [n for i, n in again.items() if i != ids[7]] == [0] * 49
        ts.nack(c, [MessageId(*ids[7])], 0)
        ts.flow(c, 1000)
        await settle()
        third = counts(out, 1, 100)
        assert third[ids[7]] == 2 and sum(third.values()) == 2
    run(main())


def test_c3a_a_nack_of_an_acknowledged_or_unsent_id_counts_nothing(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(10))
        out = Outbox()
        c = await sub(ts, out, 1, "s", EXCLUSIVE, permits=5)
        await settle()
        ids = out.ids(1)
        assert len(ids) == 5
        ts.ack(c, [MessageId(*ids[2])], False)
        # acknowledged, and never sent (entry 8 is still to come)
        ts.nack(c, [MessageId(*ids[2]), MessageId(ids[0][0], 8)], 0)
        ts.flow(c, 100)
        await settle()
        assert sum(counts(out, 1, 5).values()) == 0
        assert len(out.ids(1)) == 5 + 9   # 0..9 but the acked one
    run(main())


@pytest.mark.parametrize("type_", [EXCLUSIVE, SHARED, KEY_SHARED])
def test_c3a_redeliver_all_counts_nothing(kind, tmp_path, type_):
    """A redeliver-all request redelivers everything the consumer holds unacknowledged,
    uncounted: the broker cannot tell which of them its application saw."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append([raw(f"m{i}", key=f"k{i % 3}") for i in range(20)])
        out = Outbox()
        c = await sub(ts, out, 1, "s", type_)
        await settle()
        ids = out.ids(1)
        assert len(ids) == 20
        ts.ack(c, [MessageId(*ids[0])], False)
        ts.redeliver(c)
        ts.flow(c, 1000)
        await settle()
        again = counts(out, 1, 20)
        assert sorted(again) == ids[1:]
        assert set(again.values()) == {0}
    run(main())


@pytest.mark.parametrize("type_", [SHARED, KEY_SHARED])
def test_c3a_a_shared_nack_counts_only_the_nacked_ids(kind, tmp_path, type_):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append([raw(f"m{i}", key=f"k{i % 3}") for i in range(30)])
        out = Outbox()
        c = await sub(ts, out, 1, "s", type_)
        await settle()
        ids = out.ids(1)
        assert len(ids) == 30
        nacked = [ids[3], ids[17]]
        ts.nack(c, [MessageId(*i) for i in nacked], 0)
        await settle()
        again = counts(out, 1, 30)
        assert again == {nacked[0]: 1, nacked[1]: 1}   # only those come again, counted
        ts.nack(c, [MessageId(*nacked[1])], 0)
        await settle()
        assert counts(out, 1, 32) == {nacked[1]: 2}
    run(main())


def test_c3a_a_failover_consumer_that_loses_its_place_counts_nothing_one_that_leaves_does(
        kind, tmp_path):
    """A better failover consumer takes the active one's place: the old one is alive and gave
    nothing back, so what it held comes to the new one uncounted. When that one leaves, what
    it was sent counts (it may have died on it), for the next one."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(6))
        out = Outbox()
        await sub(ts, out, 1, "s", FAILOVER, consumer_name="b", priority=1)
        await settle()
        assert len(out.ids(1)) == 6
        better = await sub(ts, out, 2, "s", FAILOVER, consumer_name="a", priority=0)
        await settle()
        assert out.ids(2) == out.ids(1) and set(counts(out, 2).values()) == {0}
        ts.close_consumer(better)
        ts.flow(ts.get("s").dispatcher.active, 1000)
        await settle()
        assert counts(out, 1, 6) == {i: 1 for i in out.ids(1)[:6]}
    run(main())
