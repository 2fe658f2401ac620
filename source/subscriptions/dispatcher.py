"""How a subscription of each type gives entries to its consumers: the `Dispatcher`.

A subscription (subscription.py) keeps what every type shares: the cursor, acknowledgements,
redelivery counts, its `position` in the topic's dispatch groups. What its type decides is
its dispatcher's, one class per type as Pulsar has one per subscription type (Pulsar's
semantics):

    EXCLUSIVE   one consumer; another one is refused (`ConsumerBusy`)
    FAILOVER    many consumers, one active (lowest `priority`, then name, then arrival);
                the others stand by and take over, from the first unacknowledged entry,
                when it leaves or a better one arrives (`ActiveConsumerChanged`)
    SHARED      entries spread over the consumers with permits, round robin in runs
    KEY_SHARED  an entry goes to the consumer owning its key's hash (keyring.py)

Exclusive and Failover are single_active.py (Pulsar's
PersistentDispatcherSingleActiveConsumer), Shared is shared.py
(PersistentDispatcherMultipleConsumers), Key_Shared key_shared.py
(PersistentStickyKeyDispatcherMultipleConsumers). The subscription picks its dispatcher from
its type when it is created, and again when the first consumer after none attaches with
another type (subscription.py, `DISPATCHERS`).

A dispatcher calls back into its subscription through `Dispatched` (defined here, so this
package imports one way: subscription.py imports the dispatchers, never the reverse).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable
from typing import ClassVar, Protocol

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.cursors.state import CursorState, NextAfter
from shadowtopic.ledger.view import LedgerView, ReadEntry
from shadowtopic.read.engine import Frames, Member, Replayer
from shadowtopic.subscriptions.consumer import SubConsumer
from shadowtopic.subscriptions.positions import UNUSED, Positions

EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED = "Exclusive", "Shared", "Failover", "Key_Shared"
TYPES = (EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED)


class Dispatched(Member, Replayer, Protocol):
    """What a dispatcher uses of its subscription (subscription.py's `Subscription`): a
    member of the topic's dispatch groups (`position`: the next entry never dispatched;
    `topic`: the groups, while it has consumers), and the `Replayer` a dispatcher with
    entries waiting for redelivery puts in the groups' `replays`."""

    name: str
    cursor: CursorState
    consumers: list[SubConsumer]
    counts: dict[int, int]            # redelivery counts (the shared empty stand-in until used)

    @property
    def view(self) -> LedgerView: ...

    @property
    def next_after(self) -> NextAfter: ...

    def touch(self) -> None:
        """Tell a read in flight to ask `wanted` again before it delivers."""

    def counted(self) -> dict[int, int]:
        """`counts`, allocated on first use."""

    def rewind(self, counting: Collection[int] | None = ()) -> MessageId | None:
        """Dispatch again from the first unacknowledged entry (where it lands; None when
        nothing after it was dispatched), counting a redelivery for the packed positions in
        `counting` (None: for every unacknowledged entry already sent)."""

    def encode(self, entries: list[ReadEntry], encoded: list[bytes], ps: list[int],
               keep: list[int]) -> tuple[list[bytes], int]:
        """The kept entries' encodings, with their redelivery counts, and their size."""

    def sent(self, c: SubConsumer, n: int, size: int) -> None:
        """`n` entries of `size` bytes went to `c`."""

    def resent(self, n: int, size: int) -> None:
        """`n` entries of `size` bytes were redelivered (replayed)."""


def unacked_of(cursor: CursorState, entries: list[ReadEntry]) -> tuple[list[int], list[int]]:
    """The entries' packed positions, and the indexes of those not acknowledged
    individually above the mark-delete (after a restart or a seek): the others are skipped.
    (No filter when nothing from the first entry on is acknowledged: the usual case, where
    only entries sent before are acknowledged, below the read position.)"""
    ps = [(e.ledger_id << 64) + e.entry_id for e in entries]
    keep = list(range(len(entries)))
    if cursor.holes and ps and cursor.acked_from(min(ps)):
        acked = cursor.is_acked_packed
        keep = [i for i in keep if not acked(ps[i])]
    return ps, keep


class Dispatcher(ABC):
    """Who may attach, who is active, how the entries of a read are spread over the
    consumers and how unacknowledged ones come again, for one subscription type. One per
    subscription; it calls back into the subscription (`sub`) for the cursor, the counts
    and its counters."""

    __slots__ = ("sub",)

    type: ClassVar[str]
    #: read_compacted consumers may read a subscription of this type (Exclusive and
    #: Failover, as in Pulsar; TopicSubscriptions.subscribe refuses the others)
    reads_compacted: ClassVar[bool] = False
    #: consumers may acknowledge cumulatively (not on Shared or Key_Shared, as in Pulsar)
    cumulative_acks: ClassVar[bool] = True

    # Shared / Key_Shared keep in these which consumer holds each unacknowledged entry, and
    # the entries waiting for redelivery; the others read the shared empty stand-ins
    holder: dict[int, SubConsumer] = UNUSED
    redo: Positions = UNUSED
    #: Exclusive / Failover: the consumer that gets the entries
    active: SubConsumer | None = None

    def __init__(self, sub: Dispatched):
        self.sub = sub

    # ---- consumers -------------------------------------------------------------------------

    def check_attach(self, type_: str) -> None:
        """A consumer of `type_` asks to join the consumers attached: refused
        (`ConsumerBusy`) when it is of another type, or this type takes no more."""
        if type_ != self.type:
            raise errors.ConsumerBusy(
                f"subscription {self.sub.name} is {self.type}; a {type_} consumer cannot join")

    @abstractmethod
    def add(self, c: SubConsumer) -> None:
        """`c` was attached (it is in `sub.consumers`)."""

    @abstractmethod
    def remove(self, c: SubConsumer) -> None:
        """`c` left (no longer in `sub.consumers`): what it had not acknowledged goes to
        the others, or waits for the next consumer when none is left."""

    # ---- dispatch --------------------------------------------------------------------------

    @abstractmethod
    def wanted(self, wake: Callable[[], None]) -> int:
        """The subscription's `wanted` (a read-engine Member): how many entries its
        consumers can take now."""

    @abstractmethod
    def deliver(self, entries: list[ReadEntry], encoded: list[bytes], size: int,
                frames: Frames) -> int:
        """The subscription's `deliver`: the entries of a read at `sub.position` go to the
        consumers (or wait); returns how many went out."""

    async def replay(self) -> bool:
        """Redeliver entries waiting in `redo`; True when there may be more to do."""
        return False

    # ---- acknowledgements and redelivery ---------------------------------------------------

    @abstractmethod
    def redeliver(self, c: SubConsumer, ids: list[MessageId] | None) -> None:
        """`c` asks for `ids` again (a nack: each of them counts a redelivery; None:
        everything it has not acknowledged, counting none: subscription.py says why)."""

    def release(self, ps: Iterable[int]) -> None:
        """The entries at packed positions `ps` are no longer unacknowledged (acknowledged,
        or their ledger is gone): nobody holds them, none waits, none is counted."""
        counts = self.sub.counts
        if counts:
            for p in ps:
                counts.pop(p, None)

    def reset(self) -> None:
        """The cursor was reset: nothing is held or waits for redelivery any more (a
        dispatcher that holds nothing of its own has nothing to drop)."""
        return None

    # ---- numbers ---------------------------------------------------------------------------

    @abstractmethod
    def unacked(self, c: SubConsumer) -> int:
        """How many entries `c` was sent and has not acknowledged (for stats)."""

    def ranges(self, c: SubConsumer) -> list[tuple[int, int]]:
        """Key_Shared: the inclusive key-hash ranges `c` owns (for stats)."""
        return []
