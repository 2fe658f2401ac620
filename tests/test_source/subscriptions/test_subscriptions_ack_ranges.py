"""Acknowledged ranges on the broker (issue 30): the checks of an `Ack`
(`consumer_service.acks_from_pb`), the cursor applying a range as one insertion
(`CursorState.ack_ranges`), and a Shared subscription releasing what a range covers, with
the backlog right across gaps (on the ManagedLedger and the in-memory view)."""
from __future__ import annotations

import asyncio
import random

import pytest
from support.fakes import Outbox
from support.subscriptions_harness import Harness, msgs, settle, sub

from shadowtopic.broker.consumer_service import MAX_ID, acks_from_pb
from shadowtopic.core import errors
from shadowtopic.core.message_id import MAX_ACK_RANGE, MessageId
from shadowtopic.cursors.state import CursorState
from shadowtopic.pb.v1 import common_pb2, consumer_pb2
from shadowtopic.subscriptions import SHARED


def p(ledger: int, entry: int) -> int:
    return (ledger << 64) + entry


def run(coro, timeout: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


# ---- the checks of an Ack --------------------------------------------------------------------

def ack(*ranges: tuple[int, int, int], ids: tuple[tuple[int, int], ...] = ()) -> consumer_pb2.Ack:
    return consumer_pb2.Ack(
        ids=[common_pb2.MessageIdData(ledger_id=ledger, entry_id=e) for ledger, e in ids],
        ranges=[consumer_pb2.AckRange(ledger_id=ledger, first_entry=a, last_entry=b)
                for ledger, a, b in ranges])


def test_the_broker_takes_ids_and_ranges_and_one_entry_ranges_as_ids():
    ps, ranges = acks_from_pb(ack((3, 0, 4), (3, 7, 7), ids=((2, 9),)))
    assert ps == [p(2, 9), p(3, 7)]
    assert ranges == [(p(3, 0), p(3, 4))]
    assert acks_from_pb(ack((1, 0, MAX_ACK_RANGE - 1))) == (
        [], [(p(1, 0), p(1, MAX_ACK_RANGE - 1))])


@pytest.mark.parametrize("bad, needle", [
    ((3, 5, 4), "first entry is after its last"),
    ((3, 0, 1 << 60), "more than"),                       # 2^60 entries: refused, not walked
    ((3, 0, MAX_ACK_RANGE), "more than"),                 # one past the bound
    ((MAX_ID + 1, 0, 1), "out of range"),
    ((3, 0, MAX_ID + 1), "out of range"),
])
def test_the_broker_refuses_a_bad_range_with_a_clear_error(bad, needle):
    with pytest.raises(errors.InvalidMessageId, match=needle):
        acks_from_pb(ack((3, 0, 1), bad))  # (the good range beside it is not applied either)


# ---- the cursor ------------------------------------------------------------------------------

def test_a_range_is_one_insertion_equal_to_acking_each_id():
    rnd = random.Random(30)
    for _ in range(300):
        by_ids = CursorState(MessageId(1, rnd.randrange(-1, 5)))
        by_ranges = by_ids.copy()
        for _ in range(rnd.randrange(1, 8)):
            ledger, a = rnd.randrange(1, 3), rnd.randrange(30)
            b = a + rnd.randrange(6)
            changed = by_ranges.ack_ranges([(p(ledger, a), p(ledger, b))])
            newly = by_ids.ack_packed(list(range(p(ledger, a), p(ledger, b) + 1)))
            assert changed == (newly > 0)
            assert by_ranges == by_ids, (by_ranges, by_ids)


def test_ranges_merge_move_the_mark_delete_and_say_what_is_acked_above_a_position():
    c = CursorState(MessageId(4, 0))
    assert not c.acked_from(p(4, 1))                        # nothing above the mark-delete
    assert c.ack_ranges([(p(4, 2), p(4, 3)), (p(4, 5), p(4, 6))])   # acks 2, 3, 5, 6
    assert c.ranges == [(MessageId(4, 2), MessageId(4, 3)), (MessageId(4, 5), MessageId(4, 6))]
    assert c.acked_from(p(4, 6)) and not c.acked_from(p(4, 7))
    assert not c.ack_ranges([(p(4, 2), p(4, 3)), (p(3, 0), p(4, 0))])  # nothing new
    assert c.ack_ranges([(p(4, 1), p(4, 1))]) and c.mark_delete == MessageId(4, 3)
    assert c.ack_ranges([(p(4, 4), p(4, 9))]) and c.mark_delete == MessageId(4, 9)
    assert c.holes == 0 and c.ack_ranges([(p(4, 10), p(4, 1 << 40))])  # one step, any length
    assert c.mark_delete == MessageId(4, 1 << 40)


# ---- a Shared subscription -------------------------------------------------------------------

def test_shared_ranges_release_what_they_cover_and_leave_the_gap_unacked(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        out = Outbox()
        c = await sub(ts, out, 1, "s", SHARED)
        await h.append(msgs(8))
        await settle()
        got = out.ids(1)
        assert len(got) == 8
        ledger, first = got[0]
        e = [first + i for i in range(8)]
        # acks 1, 2, 3, 5, 6 (of 0..7) as two ranges: 0, 4 and 7 stay unacknowledged
        ts.ack_packed(c, [], False, [(p(ledger, e[1]), p(ledger, e[3])),
                                     (p(ledger, e[5]), p(ledger, e[6]))])
        assert sorted(c.pending) == [p(ledger, e[0]), p(ledger, e[4]), p(ledger, e[7])]
        assert ts.backlog(c.sub) == 3
        # a range reaching past what is written: the written part is acked, the rest refused
        with pytest.raises(errors.InvalidArgument, match="not written yet"):
            ts.ack_packed(c, [], False, [(p(ledger, e[7]), p(ledger, e[7] + 100))])
        assert sorted(c.pending) == [p(ledger, e[0]), p(ledger, e[4])]
        assert ts.backlog(c.sub) == 2
        # the consumer leaves: only the gap's entries come again, to the next one
        ts.close_consumer(c)
        out2 = Outbox()
        await sub(ts, out2, 2, "s", SHARED)
        await settle()
        assert sorted(out2.ids(2)) == [(ledger, e[0]), (ledger, e[4])]
    run(main())
