"""What a consumer (or a reader: a non-durable consumer) has received and not yet returned.

Frames go in as the stream's receive thread hands them over (`add`: the partition, its epoch
then, the frame). They are decoded one frame at a time (`next_batch`: the entries become
lazily parsed `Message`s, message.py) and returned from that frame's `Batch`, an iterator
over its messages: `next(batch.it)` is one atomic step, so the consumer's `receive` takes a
message of the current batch without its lock (consumer.py) while the batch is still
current, and takes the lock only to move to the next frame. A message whose partition moved
on since it arrived (a seek bumped its epoch) or ended is never returned.

Permits: a frame's messages count as consumed when its batch starts (the consumer credits
them then, so the broker's next frame overlaps this one's reading); `drop` gives back the
permits of frames never started. The consumer's condition guards every call but the
`current` read of the fast path.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from operator import length_hint

from shadowtopic.client.consumer_part import Part
from shadowtopic.client.message import Message
from shadowtopic.client.stream import Delivery


def _current(p: Part, epoch: int) -> bool:
    return epoch == p.epoch and p.state != "ended"


class Batch:
    """One frame's decoded messages for one partition, returned through `it`. `last`: the
    last one returned (a reader's position, written back by `Inbox.sync_position`);
    `plain`: returned as they are, with no per-message check (set by the consumer)."""

    __slots__ = ("part", "epoch", "msgs", "it", "last", "plain")

    def __init__(self, part: Part, epoch: int, msgs: list[Message]):
        self.part = part
        self.epoch = epoch
        self.msgs = msgs
        self.it: Iterator[Message] = iter(msgs)
        self.last: Message | None = None
        self.plain = False

    def is_current(self) -> bool:
        return self.epoch == self.part.epoch and self.part.state != "ended"

    def left(self) -> int:
        """How many messages are still to be returned."""
        return length_hint(self.it)


class Inbox:
    def __init__(self) -> None:
        self._pending: deque[tuple[Part, int, Delivery]] = deque()  # not decoded yet
        #: the frame being returned (read without the lock by the consumer's fast path)
        self.current: Batch | None = None

    def add(self, p: Part, delivery: Delivery) -> None:
        """A frame with entries for `p` (on the stream's receive thread)."""
        self._pending.append((p, p.epoch, delivery))

    def next_batch(self) -> Batch | None:
        """Finish the current batch and start the next current frame's (None: nothing
        current is pending)."""
        self.sync_position()
        self.current = None
        while self._pending:
            p, epoch, delivery = self._pending.popleft()
            if not _current(p, epoch):
                continue
            msgs = delivery.messages(p.topic, p.index)
            redeliveries = [r for r in delivery.frame.redeliveries if r.handle == p.handle]
            if redeliveries:  # (counts differ per handle: this handle's own copies)
                msgs = list(msgs)
                for r in redeliveries:
                    if r.entry_index < len(msgs):
                        msgs[r.entry_index] = msgs[r.entry_index].replace(
                            redelivery_count=r.count)
            b = self.current = Batch(p, epoch, msgs)
            return b
        return None

    def sync_position(self) -> None:
        """A reader's partition position takes the current batch's last returned message."""
        b = self.current
        if b is not None and b.last is not None and b.part.position is not None \
                and b.is_current():
            b.part.position.last = b.last.message_id

    def has_current(self) -> bool:
        """Whether a message is here to be returned now."""
        b = self.current
        return ((b is not None and b.left() > 0 and b.is_current())
                or any(_current(p, e) for p, e, _d in self._pending))

    def drop(self) -> dict[int, int]:
        """Drop everything; how many current messages of frames not started each handle had
        here (their permits go back to the broker: a started frame's were credited)."""
        self.sync_position()
        dropped: dict[int, int] = {}
        self.current = None
        while self._pending:
            p, epoch, delivery = self._pending.popleft()
            if _current(p, epoch):
                dropped[p.handle] = dropped.get(p.handle, 0) + len(delivery.frame.entries)
        return dropped
