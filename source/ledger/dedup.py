"""Idempotent producing: the highest sequence id each producer has stored on a topic.

A producer (a `producer_name`: one the user gives, stable across restarts, or one the broker
assigns when it attaches, unique per producer session) numbers its messages per topic:
a produce batch carries the sequence id of its first message (`ProduceRequest.sequence_id`)
and holds `first .. first + count - 1`. A batch with sequence id 0 is not sequenced and is
never deduplicated. The rules, checked by the topic's one writer task as it takes each
batch (source/ledger/writer.py), so a check never races with the group commit:

- `first > last` (the producer's highest stored sequence id; 0 for a producer never seen
  or expired): new, stored. A gap (`first > last + 1`) is accepted: it is sequences the
  producer gave up on (batches refused before they reached the writer, e.g. too big),
  as Pulsar's deduplication does; the broker never waits for them.
- `first + count - 1 <= last`: a duplicate (a resend after a lost receipt). Nothing is
  stored; the receipt says `duplicate`, with the original's ids when the batch holding
  `first` is among the producer's `RECENT` last stored batches (remembered in memory and
  rebuilt from the open ledgers' WAL frames after a restart), else with ids 0.
- a resent batch that is *not* among the remembered stored batches although it is no
  older than the oldest of them was never stored while a later batch of the producer was
  (its first send failed, a later one did not): it is refused (`InvalidArgument`), since
  storing it now would break the producer's order and dropping it would lose it silently.
- `first <= last < first + count - 1` (a batch overlapping what is stored): refused
  (`InvalidArgument`); this client never re-batches a resend.

A group commit stages its batches (`stage`) and applies them only once its fsync succeeded
(`commit`), or forgets them (`rollback`), so a failed write never counts as stored and a
resend within the same group is seen as the duplicate it is.

Durability (what a restart, even after kill -9, rebuilds):

- every WAL frame holds its produce request as it came (source/ledger/wal.py), producer
  name and sequence id included, so recovering an OPEN ledger replays its frames into
  the map (`record`);
- when a ledger seals, a `DedupSnapshot` (storage.v1, metadata.proto: ledger id, and per
  producer its name, highest stored sequence id and the publish time of its last stored
  batch) of the map as of the end of that ledger is written into the topic's `LedgerList`
  in etcd in the same transaction that marks the ledger SEALED, kept only when it is newer
  (a higher ledger id) than the one there. A new owner loads that snapshot and replays
  only the WALs of the ledgers still OPEN: never a sealed ledger. Replays merge by maximum,
  so replaying a ledger the snapshot already covers changes nothing.
- a producer idle for `idle_s` (default 6 h; `LedgerConfig.dedup_idle_s`, the broker's
  `--dedup-idle-seconds`) expires: its entry leaves the map (and the next snapshot); a
  batch from it after that is new. The writer looks for idle producers as it stores a
  batch, every EXPIRE_EVERY_MS or `idle_s` if shorter. At most
  `MAX_PRODUCERS` producers go into a snapshot (the most recently active).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from shadowtopic.core import errors
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

RECENT = 256                 # stored batches remembered per producer (original ids of resends)
DEFAULT_IDLE_S = 6 * 3600    # a producer idle this long is forgotten
MAX_PRODUCERS = 10_000       # producers kept in a snapshot (in etcd: a bounded value)
EXPIRE_EVERY_MS = 60_000     # how often the writer looks for idle producers (at most)


class Duplicate(NamedTuple):
    """Where a duplicate batch's original was stored ((0, 0): no longer known)."""

    ledger_id: int
    first_entry_id: int


UNKNOWN = Duplicate(0, 0)


class _State:
    __slots__ = ("last", "last_ms", "recent")

    def __init__(self, last: int = 0, last_ms: int = 0):
        self.last = last
        self.last_ms = last_ms
        # (first sequence id, count, ledger id, first entry id) of the last stored batches
        self.recent: deque[tuple[int, int, int, int]] = deque(maxlen=RECENT)


class DedupMap:
    """The producers of one topic and their highest stored sequence ids (see the module
    doc for the rules, the staging and the snapshot)."""

    def __init__(self, idle_s: float = DEFAULT_IDLE_S):
        self.idle_ms = int(idle_s * 1000)
        self._states: dict[str, _State] = {}
        self._staged: list[tuple[str, int, int, int, int, int]] = []
        self._staged_last: dict[str, int] = {}
        self.expired_at_ms = 0

    def __len__(self) -> int:
        return len(self._states)

    def last(self, name: str) -> int:
        """The highest stored sequence id of `name` (0: none)."""
        st = self._states.get(name)
        return st.last if st is not None else 0

    # ---- the check, in the writer ------------------------------------------------------------

    def check(self, name: str, first: int, count: int) -> Duplicate | None:
        """None: the batch `first .. first + count - 1` of `name` is new (store it, then
        `stage` it); a `Duplicate`: it is stored already. Raises `InvalidArgument` for a
        batch that may be neither stored nor dropped (module doc)."""
        st = self._states.get(name)
        last = self._staged_last.get(name, st.last if st is not None else 0)
        if first > last:
            return None
        end = first + count - 1
        if end > last:
            raise errors.InvalidArgument(
                f"producer {name!r}: batch of sequence ids {first}..{end} overlaps the "
                f"stored ones (up to {last})")
        batches = [s[1:5] for s in self._staged if s[0] == name]
        if st is not None:
            batches[:0] = st.recent
        if not batches:
            return UNKNOWN
        for f, c, lid, entry in reversed(batches):
            if f <= first < f + c:
                return Duplicate(lid, entry + first - f) if end < f + c else UNKNOWN
        if first >= batches[0][0]:
            raise errors.InvalidArgument(
                f"producer {name!r}: batch of sequence ids {first}..{end} was never stored "
                f"but later ones were (up to {last}); storing it now would break the order")
        return UNKNOWN  # older than what is remembered

    def stage(self, name: str, first: int, count: int, ledger_id: int, first_entry: int,
              publish_ms: int) -> None:
        """A new batch is in the group being written (applied by `commit`)."""
        self._staged.append((name, first, count, ledger_id, first_entry, publish_ms))
        self._staged_last[name] = first + count - 1

    def commit(self) -> None:
        """The staged batches are durable: they count as stored."""
        for staged in self._staged:
            self.record(*staged)
        self.rollback()

    # Several groups in flight at once (the WAL on object storage: source/ledger/writer.py):
    # their batches are staged in entry order, and each group's are committed, or the last
    # group's dropped, by count.

    @property
    def staged(self) -> int:
        """How many batches are staged."""
        return len(self._staged)

    def commit_staged(self, n: int) -> None:
        """The first `n` staged batches (the oldest group in flight) are durable."""
        done, self._staged = self._staged[:n], self._staged[n:]
        for staged in done:
            self.record(*staged)
        self._restage()

    def drop_staged(self, n: int) -> None:
        """The last `n` staged batches (the newest group) were not written."""
        if n:
            del self._staged[-n:]
            self._restage()

    def _restage(self) -> None:
        self._staged_last.clear()
        for name, first, count, *_rest in self._staged:
            self._staged_last[name] = first + count - 1

    def rollback(self) -> None:
        """The staged batches were not written: forget them."""
        self._staged.clear()
        self._staged_last.clear()

    # ---- recovery, snapshots, expiry ------------------------------------------------------

    def record(self, name: str, first: int, count: int, ledger_id: int, first_entry: int,
               publish_ms: int) -> None:
        """`name`'s batch `first ..` is stored at (ledger_id, first_entry) (merged by
        maximum: replaying a batch twice, or an older one, changes nothing)."""
        st = self._states.get(name)
        if st is None:
            st = self._states[name] = _State()
        end = first + count - 1
        if end > st.last:
            st.last = end
            st.recent.append((first, count, ledger_id, first_entry))
        if publish_ms > st.last_ms:
            st.last_ms = publish_ms

    def load(self, snap: mpb.DedupSnapshot) -> None:
        """Merge a snapshot (a topic's `LedgerList.dedup`) into the map."""
        for p in snap.producers:
            st = self._states.get(p.producer_name)
            if st is None:
                st = self._states[p.producer_name] = _State()
            st.last = max(st.last, p.sequence_id)
            st.last_ms = max(st.last_ms, p.last_ms)

    def snapshot(self, ledger_id: int) -> mpb.DedupSnapshot:
        """The map as a `DedupSnapshot` covering everything up to the end of `ledger_id`
        (the `MAX_PRODUCERS` most recently active producers)."""
        states: Iterable[tuple[str, _State]] = self._states.items()
        if len(self._states) > MAX_PRODUCERS:
            states = sorted(states, key=lambda kv: kv[1].last_ms)[-MAX_PRODUCERS:]
        return mpb.DedupSnapshot(ledger_id=ledger_id, producers=[
            mpb.ProducerSequence(producer_name=name, sequence_id=st.last, last_ms=st.last_ms)
            for name, st in states])

    def expire(self, now_ms: int) -> int:
        """Forget producers idle for `idle_ms` or more (and any beyond `MAX_PRODUCERS`,
        least recently active first); returns how many went."""
        self.expired_at_ms = now_ms
        cutoff = now_ms - self.idle_ms
        gone = [name for name, st in self._states.items() if st.last_ms <= cutoff]
        if len(self._states) - len(gone) > MAX_PRODUCERS:
            rest = sorted((st.last_ms, name) for name, st in self._states.items()
                          if st.last_ms > cutoff)
            gone.extend(name for _ms, name in rest[:len(rest) - MAX_PRODUCERS])
        for name in gone:
            del self._states[name]
        return len(gone)
