"""The subscription engine (source/subscriptions/) in-process, over the LedgerView seam: every
test runs on the source's ManagedLedger (metadata twin, real files) and on the in-memory
MemoryView, with the in-memory cursor store and the snapshot store on real files."""
from __future__ import annotations

import asyncio

import pytest
from support.fakes import Outbox
from support.subscriptions_harness import Harness, msgs, raw, run, settle, sub

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.policies import Policies
from shadowtopic.pb.v1 import common_pb2
from shadowtopic.read.positions import EARLIEST, LATEST, PUBLISH_TIME, Start
from shadowtopic.subscriptions import (
    EXCLUSIVE,
    FAILOVER,
    KEY_SHARED,
    SHARED,
    ActiveChanged,
    CursorMoved,
)

# ---- types ------------------------------------------------------------------------------

def test_exclusive_delivers_in_order_and_refuses_a_second_consumer(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(5))
        out = Outbox()
        await sub(ts, out, 1, "s")
        await settle()
        assert out.payloads(1) == [f"m{i}".encode() for i in range(5)]
        with pytest.raises(errors.ConsumerBusy):
            await ts.subscribe(Outbox(), 2, "s", EXCLUSIVE, Start(EARLIEST))
        with pytest.raises(errors.ConsumerBusy):  # another type while consumers are attached
            await ts.subscribe(Outbox(), 2, "s", SHARED, Start(EARLIEST))
        await h.append(msgs(3, "n"))
        await settle()
        assert out.payloads(1)[5:] == [b"n0", b"n1", b"n2"]
    run(main())


def test_latest_starts_after_what_exists(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(3))
        out = Outbox()
        await sub(ts, out, 1, "s", start=Start(LATEST))
        await h.append([raw("new")])
        await settle()
        assert out.payloads(1) == [b"new"]
    run(main())


def test_shared_spreads_and_redelivers_a_dead_consumers_unacked_with_counts(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        out = Outbox()
        a = await sub(ts, out, 1, "s", SHARED, permits=30)
        b = await sub(ts, out, 2, "s", SHARED, permits=30)
        await h.append(msgs(40))
        await settle()
        got_a, got_b = out.ids(1), out.ids(2)
        assert got_a and got_b and len(got_a) + len(got_b) == 40
        assert not set(got_a) & set(got_b)
        ts.ack(b, [MessageId(*i) for i in got_b], False)
        ts.ack(a, [MessageId(*i) for i in got_a[:5]], False)
        ts.close_consumer(a)           # a dies: its 5.. unacked go to b, counted
        ts.flow(b, 100)
        await settle()
        again = out.entries(2)[len(got_b):]
        assert [(e.ledger_id, e.entry_id) for e in again] == got_a[5:]
        assert all(e.redelivery_count == 1 for e in again)
        with pytest.raises(errors.NotAllowed):
            ts.ack(b, [MessageId(*got_a[-1])], True)
        ts.ack(b, [MessageId(e.ledger_id, e.entry_id) for e in again], False)
        assert ts.backlog(ts.get("s")) == 0
    run(main())


def test_failover_promotes_the_standby_from_the_first_unacked(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        out = Outbox()
        a = await sub(ts, out, 1, "s", FAILOVER, consumer_name="a")
        await sub(ts, out, 2, "s", FAILOVER, consumer_name="b")
        assert (1, ActiveChanged(True)) in out.notices and (2, ActiveChanged(False)) in out.notices
        await h.append(msgs(10))
        await settle()
        assert len(out.ids(1)) == 10 and not out.ids(2)
        ts.ack(a, [MessageId(*out.ids(1)[3])], True)   # 0..3 acked
        ts.close_consumer(a)
        await settle()
        assert (2, ActiveChanged(True)) in out.notices
        assert out.ids(2) == out.ids(1)[4:]
        assert all(e.redelivery_count == 1 for e in out.entries(2))
    run(main())


def test_key_shared_keeps_each_key_on_one_consumer(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        out = Outbox()
        cs = [await sub(ts, out, i, "s", KEY_SHARED, consumer_name=f"c{i}") for i in (1, 2, 3)]
        await h.append([raw(f"v{i}", key=f"k{i % 17}") for i in range(200)])
        await settle()
        owner = {}
        total = 0
        for h_ in (1, 2, 3):
            for e in out.entries(h_):
                key = common_pb2.Message.FromString(e.raw).key
                assert owner.setdefault(key, h_) == h_
                total += 1
        assert total == 200 and len(set(owner.values())) >= 2
        stats = ts.stats()["s"]
        ranges = [c["key_hash_ranges"] for c in stats["consumers"]]
        assert all(ranges)
        assert cs
    run(main())


def test_key_shared_holds_a_joiners_keys_until_earlier_messages_are_acked(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        out = Outbox()
        a = await sub(ts, out, 1, "s", KEY_SHARED, consumer_name="a")
        await h.append([raw(f"v{i}", key=f"k{i}") for i in range(50)])
        await settle()
        assert len(out.ids(1)) == 50
        b = await sub(ts, out, 2, "s", KEY_SHARED, consumer_name="b")
        await h.append([raw(f"w{i}", key=f"k{i}") for i in range(50)])
        await settle()
        assert not out.ids(2)  # a still holds unacked messages of keys b now owns
        ts.ack(a, [MessageId(*i) for i in out.ids(1)], False)
        await settle()
        assert out.ids(2)  # released once everything before b joined is acked
        seen = {}
        for handle in (1, 2):
            for e in out.entries(handle)[50 if handle == 1 else 0:]:
                seen.setdefault(common_pb2.Message.FromString(e.raw).key, set()).add(handle)
        assert b is not None and len(seen) > 1
    run(main())


def test_the_first_consumer_after_none_decides_the_type(kind, tmp_path):
    """A subscription is of its consumers' type: once the last one has left, the next one
    may be of another type (as in Pulsar), and gets what was left unacknowledged, counted
    as redelivered; each type's rules hold from then on."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(3))
        out = Outbox()
        a = await sub(ts, out, 1, "s", SHARED)
        await settle()
        assert len(out.ids(1)) == 3
        ts.close_consumer(a)                         # leaves with 3 unacknowledged
        b = await sub(ts, out, 2, "s", EXCLUSIVE)
        await settle()
        assert ts.stats()["s"]["type"] == EXCLUSIVE
        assert out.ids(2) == out.ids(1)
        assert [e.redelivery_count for e in out.entries(2)] == [1, 1, 1]
        with pytest.raises(errors.ConsumerBusy):   # Exclusive now: no second consumer
            await ts.subscribe(Outbox(), 3, "s", SHARED, Start(EARLIEST))
        ts.ack(b, [MessageId(*out.ids(2)[-1])], True)  # cumulative: allowed on Exclusive
        assert ts.backlog(ts.get("s")) == 0
        ts.close_consumer(b)
        ks = [await sub(ts, out, i, "s", KEY_SHARED, consumer_name=f"c{i}") for i in (4, 5)]
        await h.append([raw(f"v{i}", key=f"k{i % 17}") for i in range(50)])
        await settle()
        assert ts.stats()["s"]["type"] == KEY_SHARED
        owner = {}
        for handle in (4, 5):
            for e in out.entries(handle):
                key = common_pb2.Message.FromString(e.raw).key
                assert owner.setdefault(key, handle) == handle
        assert len(out.ids(4)) + len(out.ids(5)) == 50
        first = MessageId(*(out.ids(4) + out.ids(5))[0])
        with pytest.raises(errors.NotAllowed):       # no cumulative ack on Key_Shared
            ts.ack(ks[0], [first], True)
    run(main())


# ---- acks, nacks, restart ------------------------------------------------------------------

def test_nack_redelivers_after_the_delay(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        out = Outbox()
        c = await sub(ts, out, 1, "sh", SHARED)
        x = await sub(ts, out, 2, "ex", EXCLUSIVE)
        await h.append(msgs(4))
        await settle()
        ts.nack(c, [MessageId(*out.ids(1)[1])], 50)
        ts.nack(x, [MessageId(*out.ids(2)[2])], 50)
        await settle(2)
        assert len(out.ids(1)) == 4 and len(out.ids(2)) == 4
        await asyncio.sleep(0.1)
        await settle()
        assert out.ids(1)[4:] == [out.ids(1)[1]] and out.entries(1)[4].redelivery_count == 1
        # exclusive rewinds to the first unacked; the consumer is told to drop what it holds
        # and has no permits until it flows again
        first = MessageId(*out.ids(2)[0])
        assert (2, CursorMoved(first, False, True)) in out.notices
        assert len(out.ids(2)) == 4
        ts.flow(x, 10)
        await settle()
        assert out.ids(2)[4:] == out.ids(2)[:4]
        # only the nacked entry counts a redelivery (C3a); the rewind brings the rest uncounted
        assert [e.redelivery_count for e in out.entries(2)[4:]] == [0, 0, 1, 0]
    run(main())


def test_cursors_survive_a_crash_with_holes_and_exact_backlogs(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(10))
        await h.roll()
        await h.append(msgs(10, "b"))
        out = Outbox()
        c = await sub(ts, out, 1, "s")
        await settle()
        ids = out.ids(1)
        assert len(ids) == 20
        ts.ack(c, [MessageId(*ids[i]) for i in (0, 1, 2, 5, 6, 12)], False)
        sub_ = ts.get("s")
        assert ts.backlog(sub_) == 14
        await ts.flusher.flush_now()
        ts.ack(c, [MessageId(*ids[i]) for i in (3, 4)], False)   # never flushed
        await h.crash()
        ts = await h.open()
        again = Outbox()
        await sub(ts, again, 1, "s")
        await settle()
        want = [ids[i] for i in range(20) if i not in (0, 1, 2, 5, 6, 12)]
        assert again.ids(1) == want
        assert ts.backlog(ts.get("s")) == 14
    run(main())


def test_seek_and_reset_clamp_and_tell_consumers(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(6))
        out = Outbox()
        a = await sub(ts, out, 1, "s", SHARED)
        await sub(ts, out, 2, "s", SHARED)
        await settle()
        ids = sorted(out.ids(1) + out.ids(2))
        pos, clamped = await ts.seek(a, Start.at(MessageId(*ids[2]), True))
        assert (pos.ledger_id, pos.entry_id) == ids[2] and not clamped
        assert (1, CursorMoved(pos, False, False)) in out.notices
        assert (2, CursorMoved(pos, False, True)) in out.notices
        assert ts.backlog(ts.get("s")) == 4
        pos, clamped = await ts.reset_cursor("s", Start.at(MessageId(999, 0), True), False)
        assert clamped and pos == h.view.next_position()
        assert ts.backlog(ts.get("s")) == 0
        pos, clamped = await ts.reset_cursor("s", Start.at(MessageId(0, 0), True), True)
        assert clamped and ts.backlog(ts.get("s")) == 0   # dry run changed nothing
        pos, clamped = await ts.reset_cursor("s", Start(PUBLISH_TIME, publish_ms=1), False)
        assert clamped and ts.backlog(ts.get("s")) == 6
    run(main())


def test_skip_clear_backlog_peek_and_delete(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(10))
        await ts.create("s", Start(EARLIEST))
        with pytest.raises(errors.SubscriptionAlreadyExists):
            await ts.create("s", Start(EARLIEST))
        peeked = await ts.peek("s", 3)
        assert [common_pb2.Message.FromString(e.raw).payload for e in peeked] == [b"m0", b"m1",
                                                                                   b"m2"]
        ch = await ts.skip("s", 4, dry_run=True)
        assert ch.acked == 4 and ch.backlog == 6 and ts.backlog(ts.get("s")) == 10
        ch = await ts.skip("s", 4, dry_run=False)
        assert ch.backlog == 6 and ts.backlog(ts.get("s")) == 6
        assert common_pb2.Message.FromString((await ts.peek("s", 1))[0].raw).payload == b"m4"
        ch = await ts.clear_backlog("s", dry_run=False)
        assert ch.acked == 6 and ts.backlog(ts.get("s")) == 0
        out = Outbox()
        await sub(ts, out, 1, "s")
        with pytest.raises(errors.ConsumerBusy):
            await ts.delete("s", force=False, dry_run=False)
        ch = await ts.delete("s", force=True, dry_run=False)
        assert ch.consumers == 1 and "s" not in ts.subs
        assert out.errors and isinstance(out.errors[0][1], errors.SubscriptionNotFound)
        with pytest.raises(errors.SubscriptionNotFound):
            ts.get("s")
        ts2 = await h.open()
        assert "s" not in ts2.subs   # the delete is durable
    run(main())


def test_limits_and_trimmed_ledgers(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        h.policies = Policies(max_subscriptions=2, max_consumers=1)
        ts = await h.open()
        await h.append(msgs(5))
        await h.roll()
        await h.append(msgs(2, "x"))
        await ts.create("a", Start(EARLIEST))
        await sub(ts, Outbox(), 1, "b", SHARED, permits=0)
        with pytest.raises(errors.TooManySubscriptions):
            await ts.create("c", Start(EARLIEST))
        with pytest.raises(errors.TooManyConsumers):
            await ts.subscribe(Outbox(), 2, "b", SHARED, Start(EARLIEST))
        assert ts.oldest_needed() is not None and ts.oldest_needed().entry_id == 0
        first_ledger = h.view.ranges()[0].ledger_id
        assert ts.oldest_needed().ledger_id == first_ledger
        if kind == "managed":  # retention keeps what a subscription has not acknowledged
            assert await h.view.apply_retention(0, -1, ts.oldest_needed()) == (0, 0)
            await ts.clear_backlog("a", False)
            await ts.skip("b", 5, False)
            assert await h.view.apply_retention(0, -1, ts.oldest_needed()) == (1, 5)
            assert ts.get("a").skipped == 0 and ts.backlog(ts.get("b")) == 2
        else:              # trimming what they had not read (truncate) skips it, counted
            h.view.trim(1)
            assert ts.get("a").skipped == 5 and ts.backlog(ts.get("a")) == 2
    run(main())
