"""Durable cursors, in memory: CursorState (acks, holes, the mark-delete position, backlog)
against a brute-force model over a small ledger layout, and its records. The stores that
persist them: tests/test_source/cursors/test_cursors.py."""
from __future__ import annotations

import random
import sys

import pytest

from shadowtopic.core.message_id import MessageId
from shadowtopic.cursors import CursorState, next_after_in
from shadowtopic.cursors.state import pack
from shadowtopic.ledger.ledger_reader import LedgerListReader
from shadowtopic.ledger.view import LedgerRange
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

pytestmark = pytest.mark.timeout(120)
M = MessageId


class FakeView:
    """The position half of a LedgerView over (ledger_id, entries) pairs, through the same
    LedgerListReader the real views use; the last ledger is the open one."""

    def __init__(self, layout: list[tuple[int, int]]):
        self.infos = [mpb.LedgerInfo(ledger_id=lid, entries=n, state=mpb.SEALED)
                      for lid, n in layout]
        self.reader = LedgerListReader(None, None, lambda: self.infos)

    def ids(self) -> list[MessageId]:
        return [M(i.ledger_id, e) for i in self.infos for e in range(i.entries)]

    def next_position(self) -> MessageId:
        return M(self.infos[-1].ledger_id, self.infos[-1].entries)

    def valid_position(self, position: MessageId) -> MessageId:
        return self.reader.valid_position(position, self.next_position())

    def entries_between(self, start: MessageId, end: MessageId) -> int:
        return self.reader.entries_between(start, end)

    def trim_front(self, n: int) -> list[LedgerRange]:
        gone, self.infos = self.infos[:n], self.infos[n:]
        return [LedgerRange(i.ledger_id, i.entries, True) for i in gone]


# ---- CursorState -----------------------------------------------------------------------------

def test_individual_acks_keep_merged_ranges():
    c = CursorState.starting_at(M(3, 0))
    assert c.ack([M(3, 5), M(3, 2), M(3, 3)]) == 3
    assert c.ranges == [(M(3, 2), M(3, 3)), (M(3, 5), M(3, 5))]
    assert c.ack([M(3, 4), M(3, 5)]) == 1                     # 5 was acked already
    assert c.ranges == [(M(3, 2), M(3, 5))] and c.holes == 1
    assert c.is_acked(M(3, 4)) and not c.is_acked(M(3, 1)) and not c.is_acked(M(3, 6))
    c.ack([M(3, 1), M(3, 0)])                                 # closes the hole at the front
    assert c.mark_delete == M(3, 5) and c.ranges == [] and c.holes == 0


def test_cumulative_ack_absorbs_ranges_and_never_moves_back():
    c = CursorState.starting_at(M(3, 0))
    c.ack([M(3, 4), M(3, 5), M(3, 9)])
    assert c.ack_cumulative(M(3, 3))                           # reaches the range 4..5
    assert c.mark_delete == M(3, 5) and c.ranges == [(M(3, 9), M(3, 9))]
    assert not c.ack_cumulative(M(3, 1))
    assert c.ack_cumulative(M(3, 7)) and c.ranges == [(M(3, 9), M(3, 9))]
    assert c.ack([M(3, 2), M(3, 7)]) == 0                     # below the mark-delete
    c.seek(M(3, 2))
    assert c.mark_delete == M(3, 1) and c.ranges == [] and not c.is_acked(M(3, 9))


def test_mark_delete_crosses_ledger_ends_only_with_the_layout():
    view = FakeView([(1, 3), (2, 0), (4, 2)])                  # ledger 2 is empty
    nxt = next_after_in(view)
    c = CursorState.starting_at(M(1, 0))
    assert c.mark_delete == M(1, -1) and str(c.mark_delete) == "1:-1"
    c.ack([M(1, 1), M(1, 2), M(4, 0)])
    assert c.ack([M(1, 0)]) == 1 and c.mark_delete == M(1, 2)  # no layout: stops at the end
    assert c.read_position(nxt) == M(4, 1)                     # layout: over ledger 2, 4:0
    assert c.mark_delete == M(4, 0) and c.ranges == []
    c.ack([M(4, 1)], nxt)
    assert c.read_position(nxt) == view.next_position() == M(4, 2)


def test_skip_trimmed_ledgers_counts_what_was_not_acked():
    view = FakeView([(1, 4), (2, 3), (5, 2)])
    c = CursorState.starting_at(M(1, 0))
    c.ack_cumulative(M(1, 0))
    c.ack([M(1, 2), M(2, 1), M(5, 1)])
    assert c.skip_trimmed(view.trim_front(2), next_after_in(view)) == 4  # 1:1 1:3 2:0 2:2
    assert c.read_position(next_after_in(view)) == M(5, 0)
    assert c.ranges == [(M(5, 1), M(5, 1))]
    assert c.backlog(view.entries_between, view.next_position()) == 1


@pytest.mark.parametrize("seed", range(12))
def test_backlog_and_acks_match_a_model(seed):
    """Random individual acks, cumulative acks, seeks, trims and restarts (record round
    trips): is_acked, backlog and read position always equal a brute-force model."""
    rnd = random.Random(seed)
    layout, lid = [], 1
    for _ in range(rnd.randint(2, 5)):
        lid += rnd.randint(1, 3)
        layout.append((lid, rnd.choice([0, 1, 3, 8])))
    view = FakeView(layout)
    nxt = next_after_in(view)
    c, acked = CursorState.starting_at(M(0, 0)), set()
    for _step in range(60):
        ids = view.ids()
        op = rnd.random()
        if ids and op < 0.55:
            picks = rnd.sample(ids, min(len(ids), rnd.randint(1, 3)))
            assert c.ack(picks, nxt) == len(set(picks) - acked)
            acked |= set(picks)
        elif ids and op < 0.75:
            upto = rnd.choice(ids)
            c.ack_cumulative(upto, nxt)
            acked |= {i for i in ids if i <= upto}
        elif ids and op < 0.85:
            to = rnd.choice(ids)
            c.seek(to)
            acked = {i for i in ids if i < to}
        elif op < 0.9 and len(view.infos) > 1:
            gone = view.trim_front(1)
            lost = [M(r.ledger_id, e) for r in gone for e in range(r.entries)]
            assert c.skip_trimmed(gone, nxt) == len(set(lost) - acked)
            acked -= set(lost)
        else:
            c = CursorState.from_record(c.to_record())     # restart
        ids = view.ids()
        assert [i for i in ids if c.is_acked(i)] == [i for i in ids if i in acked]
        assert c.backlog(view.entries_between, view.next_position()) == len(ids) - len(acked)
        unacked = [i for i in ids if i not in acked]
        assert c.read_position(nxt) == (unacked[0] if unacked else view.next_position())


def test_records_round_trip_and_reject_junk():
    c = CursorState.starting_at(M(7, 3))
    c.ack([M(7, 9), M(9, 0), M(9, 1), M(12, 5)])
    c.last_active = 1_700_000_000_123
    assert c.to_record() == (7, 2, (7, 9, 7, 9, 9, 0, 9, 1, 12, 5, 12, 5), 1_700_000_000_123)
    back = CursorState.from_record(c.to_record())
    assert back == c and back is not c and back.ranges == c.ranges
    assert back.last_active == 1_700_000_000_123 == c.copy().last_active
    back.last_active += 1                                      # part of the state
    assert back != c
    assert CursorState.from_record((4, -1, (), 0)).mark_delete == M(4, -1)
    for junk in [(7, 2, (7, 9, 7), 0), (7, 2, (7, 9, 7, 9, 7, 9, 7, 9), 0),
                 (7, 9, (7, 3, 7, 4), 0)]:
        with pytest.raises(ValueError):
            CursorState.from_record(junk)
    with pytest.raises(ValueError):
        CursorState(M(1, 0), [(M(1, 5), M(1, 4))])


def test_idle_cursor_is_small():
    c = CursorState.starting_at(M(123456, 789))
    assert not hasattr(c, "__dict__") and c.holes == 0
    assert sys.getsizeof(c) + sys.getsizeof(c._md) <= 100


class SparseView:
    """The position half of a compacted view: ids survive here and there (`ids`), the rest
    are absent; past the last one comes `end`."""

    def __init__(self, ids: list[MessageId], end: MessageId):
        self.kept, self.end = sorted(ids), end

    def valid_position(self, position: MessageId) -> MessageId:
        return next((i for i in self.kept if i >= position), self.end)


@pytest.mark.parametrize("seed", range(8))
def test_ack_one_with_a_shared_memo_equals_ack_packed(seed):
    """Many cursors (most at one mark-delete, as members of a broadcast move) acknowledge the
    same position per step through one memo (`ack_one`, what `TopicSubscriptions.ack_many`
    does); twins take `ack_packed([p])` each. Their records are equal after every step, on
    a dense layout and on a sparse (compacted) one."""
    rnd = random.Random(seed)
    dense = FakeView([(2, 5), (3, 0), (5, 7), (6, 4)])
    ids = dense.ids()
    for nxt, universe in [(next_after_in(dense), ids),
                          (next_after_in(SparseView(kept := sorted(rnd.sample(ids, 9)),
                                                    dense.next_position()), sparse=True),
                           kept)]:
        starts = [M(0, 0)] * 6 + [rnd.choice(ids) for _ in range(4)]
        fast = [CursorState.starting_at(s) for s in starts]
        slow = [CursorState.starting_at(s) for s in starts]
        for _step in range(80):
            # mostly the next entry of the leading group, sometimes any id
            lead = fast[0].read_position(nxt)
            p = lead if rnd.random() < 0.7 and lead in universe else rnd.choice(universe)
            memo: dict[int, int] = {}
            for i in rnd.sample(range(len(fast)), rnd.randint(1, len(fast))):
                assert fast[i].ack_one(pack(p), nxt, memo) == slow[i].ack_packed([pack(p)], nxt)
                assert fast[i].to_record() == slow[i].to_record()
        assert any(c.to_record()[:2] != (0, 0) for c in fast)  # they moved
