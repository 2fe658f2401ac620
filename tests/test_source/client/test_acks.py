"""The client's ack grouping into ranges and its ack receipts (source/client/acks.py, issue
30; the broker's side: tests/test_source/broker/test_ack_ranges.py)."""
from __future__ import annotations

import random
import threading

import pytest

from shadowtopic.client.acks import (
    ACKS,
    AckReceipts,
    PendingAcks,
    coalesce,
    wait_for_receipt,
)
from shadowtopic.core import errors
from shadowtopic.core.message_id import MAX_ACK_RANGE
from shadowtopic.pb.v1 import consumer_pb2


def p(ledger: int, entry: int) -> int:
    return (ledger << 64) + entry


def expand(ranges: list[tuple[int, int, int]]) -> list[int]:
    return [p(ledger, e) for ledger, a, b in ranges for e in range(a, b + 1)]


# ---- coalescing (a pure function) ------------------------------------------------------------

def test_consecutive_entries_of_a_ledger_become_one_range_and_gaps_split_them():
    # acks 1, 2, 3, 5, 6 of ledger 7, given out of order, one twice; then ledger 8's 0 and 1
    got = coalesce([p(7, 5), p(7, 1), p(8, 0), p(7, 3), p(7, 2), p(7, 6), p(7, 3), p(8, 1)])
    assert got == [(7, 1, 3), (7, 5, 6), (8, 0, 1)]


def test_the_last_entry_of_a_ledger_and_the_first_of_the_next_stay_apart():
    assert coalesce([p(3, 9), p(4, 0)]) == [(3, 9, 9), (4, 0, 0)]
    top = (1 << 63) - 1  # the highest entry id
    assert coalesce([p(3, top), p(4, 0)]) == [(3, top, top), (4, 0, 0)]
    assert coalesce([]) == []


def test_a_long_run_is_split_at_the_limit():
    assert coalesce([p(1, e) for e in range(10)], limit=4) == [(1, 0, 3), (1, 4, 7), (1, 8, 9)]
    run = coalesce(range(p(2, 0), p(2, MAX_ACK_RANGE + 5)))
    assert run == [(2, 0, MAX_ACK_RANGE - 1), (2, MAX_ACK_RANGE, MAX_ACK_RANGE + 4)]


def test_coalescing_keeps_exactly_the_acked_set():
    rnd = random.Random(30)
    for _ in range(300):
        ps = [p(rnd.randrange(1, 4), rnd.randrange(40)) for _ in range(rnd.randrange(1, 60))]
        ranges = coalesce(ps, limit=rnd.choice([1, 3, 1000]))
        assert expand(ranges) == sorted(set(ps))  # sorted, each id once
        assert all(a <= b for _ledger, a, b in ranges)


# ---- grouping per handle ---------------------------------------------------------------------

def test_pending_acks_send_one_ack_of_ranges_per_handle_and_share_equal_ones():
    acks = PendingAcks()
    assert acks.add(1, 5, 0) is True       # the first since the last expansion: a marker
    assert acks.add(1, 5, 1) is False
    for h in (2, 3):                        # one broadcast message acked by two handles
        acks.add(h, 5, 9)
    acks.add(1, 5, 3)
    flow = consumer_pb2.ClientCommand(handle=4, flow=consumer_pb2.Flow(permits=1))
    out = acks.expand([flow, ACKS])
    assert out[0] is flow
    by_handle = {c.handle: c for c in out[1:]}
    assert set(by_handle) == {1, 2}
    one = by_handle[1].ack
    assert not one.ids and not one.request_id
    ranges = [(r.ledger_id, r.first_entry, r.last_entry) for r in one.ranges]
    assert ranges == [(5, 0, 1), (5, 3, 3)]
    assert list(by_handle[2].also) == [3]
    assert acks.expand([ACKS]) == []        # taken: nothing twice
    assert acks.add(1, 5, 4) is True


# ---- receipts --------------------------------------------------------------------------------

def test_a_receipt_callback_is_called_once_with_its_answer():
    receipts = AckReceipts()
    heard: list = []
    rid = receipts.add(7, heard.append)
    other = receipts.add(8, heard.append)
    assert rid != other and rid > 0
    assert receipts.answer(rid, None) is True
    assert receipts.answer(rid, None) is False          # answered already
    refused = errors.InvalidArgument("no")
    receipts.fail(refused, handle=8)
    receipts.fail(errors.AlreadyClosed("late"))         # nothing left to fail
    assert heard == [None, refused] and len(receipts) == 0


def test_a_failing_callback_does_not_stop_the_others():
    receipts = AckReceipts()
    heard: list = []

    def boom(_error):
        raise RuntimeError("user code")

    receipts.add(1, boom)
    receipts.add(1, heard.append)
    receipts.fail(errors.ConnectError("gone"), handle=1)
    assert [type(e) for e in heard] == [errors.ConnectError]


def test_waiting_for_a_receipt_returns_raises_or_times_out():
    wait_for_receipt(lambda done: threading.Timer(0.05, done, [None]).start(), 5, "ack")
    with pytest.raises(errors.InvalidMessageId):
        wait_for_receipt(lambda done: done(errors.InvalidMessageId("bad")), 5, "ack")
    with pytest.raises(errors.Timeout, match="no receipt"):
        wait_for_receipt(lambda done: None, 0.05, "ack")
