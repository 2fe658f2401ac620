"""K18 on the reference implementation (compaction/reference.py), pure Python: deletes kept in
the compacted ledger for `delete_retention_seconds` (compaction/plan.py) reach every reader
that crosses compactions, within that bound.

A model topic is a log of rows (one ledger, ids 0, 1, ...; publish times from a model clock
that only moves forward), compacted at random points: a compaction is requested at a time
(its cutoff fixed then) over everything produced so far, and published a little later, as
the worker does. A reader is a position and a key -> value map; it reads on by id in the
newest published compacted view (the compacted rows at or after its position while it is at
or before the horizon, then the raw tail after the horizon), applying each message (an empty
payload deletes its key). Every reader that reaches the head is checked against the model's
map: always no older value and no missing live key; and exactly the model's map when it got
there within delete_retention of every delete that was ahead of it (a reader that got there
later and missed a delete is dropped: its map stays wrong).
"""
from __future__ import annotations

import random

import pytest

from shadowtopic.compaction import reference
from shadowtopic.compaction.ledger import CompactedLedger
from shadowtopic.compaction.plan import make_plan, tombstone_cutoff
from shadowtopic.compaction.reference import Row, compact
from shadowtopic.compaction.view import CompactedView
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.memory_view import MemoryView
from shadowtopic.ledger.storage import Storage
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import common_pb2

INF = float("inf")


class Topic:
    """The log, the published compacted view, and compactions requested but not published."""

    def __init__(self, retention_s: int, retain: bool):
        self.retention_s = retention_s
        self.retain = retain
        self.rows: list[Row] = []
        self.now = 1_000_000
        self.compacted: list[Row] = []    # the published compacted ledger
        self.horizon = -1                 # its last id (-1: none)
        self.cutoff: int | None = None    # the published job's cutoff
        self.pending: list[tuple[int, list[Row], int | None]] = []

    def produce(self, key: bytes | None, value: bytes) -> Row:
        row = Row(1, len(self.rows), key, not value, self.now, value)
        self.rows.append(row)
        return row

    def model(self, upto: int | None = None) -> dict[bytes, bytes]:
        """The key -> value map of the log (of its first `upto` rows)."""
        out: dict[bytes, bytes] = {}
        for r in self.rows[:upto]:
            apply(out, r)
        return out

    def request(self) -> None:
        """A compaction of everything so far, its cutoff fixed now (and checked: the
        incremental result equals a full one at the same cutoff, K12)."""
        if not self.rows:
            return
        horizon = len(self.rows) - 1
        cutoff = tombstone_cutoff(self.now, self.retention_s)
        base, prev_h = (self.pending[-1][1], self.pending[-1][0]) if self.pending \
            else (self.compacted, self.horizon)
        inc = compact(base + self.rows[prev_h + 1:horizon + 1], self.retain, cutoff)
        assert inc == compact(self.rows[:horizon + 1], self.retain, cutoff)
        self.pending.append((horizon, inc, cutoff))

    def publish(self) -> None:
        """The oldest requested compaction published (jobs of a topic run one at a time)."""
        if self.pending:
            self.horizon, self.compacted, self.cutoff = self.pending.pop(0)

    def after(self, position: int) -> list[Row]:
        """What a compacted reader at `position` reads next, in order."""
        if position <= self.horizon:
            return [r for r in self.compacted if r.entry_id >= position] + \
                self.rows[self.horizon + 1:]
        return self.rows[position:]


def apply(state: dict[bytes, bytes], r: Row) -> None:
    if r.key is None:
        return
    if r.is_tombstone:
        state.pop(r.key, None)
    else:
        state[r.key] = r.raw


class Reader:
    def __init__(self, topic: Topic, position: int):
        self.position = position
        self.state = topic.model(position)  # as if it had read everything before
        #: the latest time it may reach the head and still be owed every delete ahead of it
        self.deadline = min((r.publish_time + topic.retention_s * 1000
                             for r in topic.rows[position:] if r.key and r.is_tombstone),
                            default=INF)

    def read(self, topic: Topic, n: int) -> bool:
        """Read up to `n` messages; whether it is at the head afterwards."""
        for r in topic.after(self.position)[:n]:
            apply(self.state, r)
            self.position = r.entry_id + 1
        return not topic.after(self.position)


def run_model(seed: int, retention_s: int, steps: int = 400) -> tuple[int, int]:
    """One random history; (checks with the guarantee, checks where a delete was missed)."""
    rnd = random.Random(seed)
    t = Topic(retention_s, retain=seed % 2 == 0)
    keys = [f"k{i}".encode() for i in range(rnd.randint(2, 8))]
    readers: list[Reader] = []
    guaranteed = missed = 0
    for _ in range(steps):
        t.now += rnd.choice([0, 1, 100, 1000, 3000])
        roll = rnd.random()
        if roll < 0.35:
            key = None if rnd.random() < 0.1 else rnd.choice(keys)
            value = b"" if rnd.random() < 0.35 else f"v{rnd.random():.6f}".encode()
            row = t.produce(key, value)
            if row.key is not None and row.is_tombstone:
                for rd in readers:  # every reader is behind it or at it
                    rd.deadline = min(rd.deadline, row.publish_time + retention_s * 1000)
        elif roll < 0.45:
            t.request()
        elif roll < 0.55:
            t.publish()
        elif roll < 0.62:
            start = 0 if rnd.random() < 0.3 else rnd.randint(0, len(t.rows))
            readers.append(Reader(t, start))
        elif readers:
            rd = rnd.choice(readers)
            at_head = rd.read(t, rnd.choice([1, 2, 5, 1000]))
            if at_head:
                want = t.model()
                # never an older value, never a live key missing (whatever the bound)
                assert {k: v for k, v in rd.state.items() if k in want} == want, seed
                if t.now <= rd.deadline:
                    assert rd.state == want, (seed, t.now, rd.deadline)
                    guaranteed += 1
                elif rd.state != want:  # it missed a delete: its map stays wrong
                    missed += 1
                    readers.remove(rd)
                rd.deadline = INF
    return guaranteed, missed


@pytest.mark.parametrize("seed", range(40))
def test_readers_crossing_compactions_see_every_recent_delete(seed):
    """K18: within delete_retention every delete reaches every reader, across any number of
    compactions; incremental compactions equal full ones at the same cutoff."""
    guaranteed, _ = run_model(seed, retention_s=random.Random(seed).choice([2, 5, 30]))
    assert guaranteed > 0


def test_a_long_retention_never_misses_and_zero_can():
    """Delete retention longer than the history: every check holds; retention 0 (tombstones
    dropped by the first compaction that reads them): some reader misses a delete, the
    bound the guarantee has."""
    assert sum(run_model(s, retention_s=10**6)[1] for s in range(20)) == 0
    assert sum(run_model(s, retention_s=0)[1] for s in range(20)) > 0


def k18_history(retention_s: int) -> tuple[Topic, Reader]:
    """put k1, compact, a reader past the horizon, delete k1, compact: (topic, reader)."""
    t = Topic(retention_s, retain=True)
    t.produce(b"k1", b"v1")
    t.request()
    t.publish()
    t.produce(b"k2", b"x")
    rd = Reader(t, 0)
    assert rd.read(t, 2) and rd.state == {b"k1": b"v1", b"k2": b"x"}  # past the horizon
    t.now += 1000
    t.produce(b"k1", b"")
    t.now += 1000
    t.request()
    t.publish()
    rd.read(t, 1000)
    return t, rd


def test_the_k18_scenario():
    """The issue's repro: the reader continues in the new compacted ledger and gets k1's
    delete with a retention; with 0 it ends holding k1 (what the bound allows)."""
    t, rd = k18_history(retention_s=60)
    assert rd.state == t.model() == {b"k2": b"x"}
    assert [r.key for r in t.compacted] == [b"k2", b"k1"] and t.compacted[-1].is_tombstone
    t, rd = k18_history(retention_s=0)
    assert rd.state == {b"k1": b"v1", b"k2": b"x"} != t.model()


def test_tombstones_expire_by_publish_time_against_the_cutoff():
    rows = [Row(1, 0, b"a", False, 10, b"a1"), Row(1, 1, b"a", True, 20, b""),
            Row(1, 2, b"b", True, 30, b""), Row(1, 3, b"c", True, 40, b""),
            Row(1, 4, None, True, 50, b"")]
    assert compact(rows, True, None) == [rows[4]]
    assert compact(rows, True, 30) == rows[2:]          # at the cutoff: kept
    assert compact(rows, False, 31) == [rows[3]]
    assert compact(rows, True, 1) == rows[1:]            # a1 replaced by its delete
    assert tombstone_cutoff(100_000, 0) is None
    assert tombstone_cutoff(100_000, 60) == 40_000 and tombstone_cutoff(5, 60) == 1


# ---- the read path: kept tombstones read like raw ones ---------------------------------------

TOPIC = TopicName("t", "ns", "compact-me")  # the topic of the `ledgers` fixture


def test_compacted_view_serves_kept_tombstones_as_empty_messages(tmp_path, ledgers, arun):
    """A compacted ledger written with a cutoff holds the recent deletes: a compacted read
    gets them as empty-payload messages with their ids, counted in the backlog; the manifest
    counts them apart from the live keys."""
    st = Storage(str(tmp_path))
    led = ledgers(st)   # ledger n's messages are published at 1000 + n
    led.seal([("a", b"a1"), ("b", b"b1"), ("c", b"c1")])
    led.seal([("a", b"")])                     # published at 1002: before the cutoff
    h = led.seal([("b", b""), ("d", b"d1")])   # published at 1003: kept
    m = reference.run(make_plan(TOPIC, "j1", led.list, h, None, True,
                                tombstone_cutoff_ms=1003), st, "c/j1")
    assert (m.entries, m.keys, m.tombstones, m.tombstone_cutoff_ms) == (3, 2, 1, 1003)
    lst = [(lid, [(0, r.raw) for r in led.rows if r.ledger_id == lid], True)
           for lid in (1, 2, 3)]
    view = CompactedView(MemoryView(ledgers=lst, next_id=4))
    view.swap(mpb.CompactionPointer(manifest=m, horizon=m.horizon, job_id="j1"),
              CompactedLedger(st, m))
    got = arun(view.read(MessageId(0, 0), 100, 1 << 20))
    msgs = [(e.ledger_id, e.entry_id, common_pb2.Message.FromString(e.raw)) for e in got]
    assert [(lid, eid, x.key, x.payload) for lid, eid, x in msgs] == [
        (1, 2, b"c", b"c1"), (3, 0, b"b", b""), (3, 1, b"d", b"d1")]
    assert view.entries_between(MessageId(0, 0), view.next_position()) == 3
    assert view.last_confirmed() == MessageId(3, 1)
