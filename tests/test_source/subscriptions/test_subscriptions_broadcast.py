"""Broadcast paths of the subscription engine (issue 8): one ack for many subscriptions
(`TopicSubscriptions.ack_many`, what a Connect `Ack` with `also` handles becomes), a whole
dispatch group moving at once, and a read in flight that crosses a consumer change. On the
ManagedLedger and the in-memory view. Harness and helpers from test_subscriptions.py."""
from __future__ import annotations

import asyncio

from support.fakes import Outbox
from support.subscriptions_harness import Harness, msgs, settle, sub

from shadowtopic.core import errors
from shadowtopic.cursors.state import pack
from shadowtopic.subscriptions import FAILOVER, SHARED


def run(coro, timeout: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_one_ack_for_many_subscriptions_moves_each_cursor_and_reports_failures(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        out = Outbox()
        cs = [await sub(ts, out, i, f"s{i}") for i in range(50)]
        shared = await sub(ts, out, 100, "shared", SHARED)
        await h.append(msgs(3))
        await settle()
        assert all(out.payloads(i) == [b"m0", b"m1", b"m2"] for i in range(50))
        first = pack(h.view.first_position())
        gone = cs[7]
        ts.close_consumer(gone)
        failed = ts.ack_many(cs + [shared], [first], False)
        assert [c for c, _ in failed] == [gone]
        assert isinstance(failed[0][1], errors.AlreadyClosed)
        for c in cs + [shared]:
            if c is not gone:
                assert c.sub.cursor.mark_delete == h.view.first_position(), c.sub.name
        assert ts.subs["s7"].cursor.mark_delete != h.view.first_position()
        # the Shared subscription took the general path: its held entry is released
        assert pack(h.view.first_position()) not in shared.pending
        # an ack of the third entry leaves a hole; then the second closes it
        third = first + 2
        assert not ts.ack_many(cs[:3], [third], False)
        assert cs[0].sub.cursor.holes == 1
        assert not ts.ack_many(cs[:3], [first + 1], False)
        assert cs[0].sub.cursor.holes == 0 and pack(cs[0].sub.cursor.mark_delete) == third
        # acks of ids not written yet are refused, per consumer
        future = pack(h.view.next_position()) + 5
        failed = ts.ack_many(cs[:2], [future], False)
        assert len(failed) == 2 and all(isinstance(e, errors.InvalidArgument) for _, e in failed)
        # every changed cursor is saved by the flusher
        await ts.flusher.flush_now()
        ts2 = await h.open()
        assert ts2.subs["s0"].cursor.mark_delete == cs[0].sub.cursor.mark_delete
        assert ts2.subs["s9"].cursor.mark_delete == h.view.first_position()
    run(main())


def test_a_broadcast_group_moves_as_one_and_keeps_every_member(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        out = Outbox()
        for i in range(200):
            await sub(ts, out, i, f"s{i}")
        await h.append(msgs(1))
        await settle()
        groups = ts.readers.groups
        assert len(groups) == 1 and len(next(iter(groups.values()))) == 200
        # a member behind (no permits) keeps its place; the others move on together
        late = await sub(ts, out, 999, "late", permits=0)
        await h.append(msgs(2, "n"))
        await settle()
        assert sum(len(g) for g in groups.values()) == 201
        assert late.sub.position == h.view.first_position()
        ts.flow(late, 10)
        await settle()
        assert len(groups) == 1 and len(next(iter(groups.values()))) == 201
        assert out.payloads(999) == [b"m0", b"n0", b"n1"]
        assert all(out.payloads(i) == [b"m0", b"n0", b"n1"] for i in range(200))
    run(main())


def test_a_failover_switch_during_a_read_sends_nothing_without_permits(kind, tmp_path):
    """The active consumer leaves while a read is in flight; the standby that takes over has
    no permits yet: the read must not be delivered to it (TopicReaders.changes)."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(3))
        out = Outbox()
        a = await sub(ts, out, 1, "x", FAILOVER, permits=0, consumer_name="a", priority=0)
        b = await sub(ts, out, 2, "x", FAILOVER, permits=0, consumer_name="b", priority=1)
        real_read = h.view.read
        entered = asyncio.Event()
        go = asyncio.Event()

        async def slow_read(*args):
            entered.set()
            await go.wait()
            return await real_read(*args)

        h.view.read = slow_read
        ts.flow(a, 10)
        await entered.wait()
        before = ts.readers.changes
        ts.close_consumer(a)          # b becomes active, with no permits
        assert ts.readers.changes > before
        h.view.read = real_read
        go.set()
        await settle()
        assert out.payloads(1) == [] and out.payloads(2) == []
        ts.flow(b, 10)
        await settle()
        assert out.payloads(2) == [b"m0", b"m1", b"m2"]
    run(main())
