"""What a consumer (or a reader: a non-durable consumer) has received and not yet returned.

Frames go in as the stream's receive thread hands them over (`add`: the partition, its epoch
then, the frame); they are decoded one frame at a time as messages are taken (`take`), and
returned from one cursor over that frame's messages, with no object per message beyond the
`Message`. A message whose partition moved on since it arrived (a seek bumped its epoch) or
ended is never returned. The consumer's condition guards every call.
"""
from __future__ import annotations

from collections import deque
from dataclasses import replace

from shadowtopic.client.consumer_part import Part
from shadowtopic.client.message import Message
from shadowtopic.client.stream import Delivery


def _current(p: Part, epoch: int) -> bool:
    return epoch == p.epoch and p.state != "ended"


class _Batch:
    """One frame's decoded messages for one partition, returned one by one from `pos`."""

    __slots__ = ("part", "epoch", "msgs", "pos")

    def __init__(self, part: Part, epoch: int, msgs: list[Message]):
        self.part = part
        self.epoch = epoch
        self.msgs = msgs
        self.pos = 0


class Inbox:
    def __init__(self) -> None:
        self._pending: deque[tuple[Part, int, Delivery]] = deque()  # not decoded yet
        self._batch: _Batch | None = None  # the frame being returned

    def add(self, p: Part, delivery: Delivery) -> None:
        """A frame with entries for `p` (on the stream's receive thread)."""
        self._pending.append((p, p.epoch, delivery))

    def take(self) -> tuple[Part, int, Message] | None:
        """The next current message with its partition and the epoch it came in, or None."""
        while True:
            b = self._batch
            if b is not None:
                p, pos, msgs = b.part, b.pos, b.msgs
                if pos < len(msgs) and b.epoch == p.epoch and p.state != "ended":
                    b.pos = pos + 1
                    return p, b.epoch, msgs[pos]
                self._batch = None  # done, or received before a seek: dropped
            if not self._pending:
                return None
            p, epoch, delivery = self._pending.popleft()
            if not _current(p, epoch):
                continue
            msgs = delivery.messages(p.topic, p.index)
            redeliveries = [r for r in delivery.frame.redeliveries if r.handle == p.handle]
            if redeliveries:  # (counts differ per handle: this handle's own copies)
                msgs = list(msgs)
                for r in redeliveries:
                    if r.entry_index < len(msgs):
                        msgs[r.entry_index] = replace(msgs[r.entry_index],
                                                      redelivery_count=r.count)
            self._batch = _Batch(p, epoch, msgs)

    def has_current(self) -> bool:
        """Whether a message is here to be returned now."""
        b = self._batch
        return ((b is not None and b.pos < len(b.msgs) and _current(b.part, b.epoch))
                or any(_current(p, e) for p, e, _d in self._pending))

    def drop(self) -> dict[int, int]:
        """Drop everything; how many current messages each handle had here (their permits
        go back to the broker)."""
        dropped: dict[int, int] = {}
        b, self._batch = self._batch, None
        if b is not None and _current(b.part, b.epoch):
            dropped[b.part.handle] = len(b.msgs) - b.pos
        while self._pending:
            p, epoch, delivery = self._pending.popleft()
            if _current(p, epoch):
                dropped[p.handle] = dropped.get(p.handle, 0) + len(delivery.frame.entries)
        return dropped
