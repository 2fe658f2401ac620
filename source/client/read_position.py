"""Where a reader (a non-durable consumer) of one partition is, kept by the client: a
reader has no cursor on the broker, so when its stream breaks it subscribes again from
here (source/client/reconnect.py), and `has_message_available` compares it with the
partition's last message.

- `last`: the last message returned to the user; a reconnect resumes right after it (what
  was buffered and not yet returned is dropped and comes again, as Pulsar's reader does).
- `threshold` / `inclusive`: before anything was returned, where the reader starts: the
  id it was told (inclusive or not), the partition's last message when it subscribed at
  "latest" (exclusive), or where a seek landed (inclusive). None: from the first message.
"""
from __future__ import annotations

from shadowtopic.core.message_id import MessageId
from shadowtopic.pb.v1 import common_pb2


class ReadPosition:
    __slots__ = ("last", "threshold", "inclusive", "answered")

    def __init__(self) -> None:
        self.answered = False  # the first subscribe was answered: a new one resumes
        self.last: MessageId | None = None
        self.threshold: MessageId | None = None
        self.inclusive = False

    def subscribed(self, start: common_pb2.StartPosition, inclusive: bool,
                   last: common_pb2.MessageIdData | None) -> None:
        """The first subscribe was answered: `start` as asked, `last` the partition's last
        message then (none when it held none)."""
        self.answered = True
        if start.HasField("message_id"):
            self.threshold = MessageId(start.message_id.ledger_id, start.message_id.entry_id)
            self.inclusive = inclusive
        elif start.HasField("latest") and last is not None and last.ledger_id:
            self.threshold = MessageId(last.ledger_id, last.entry_id)
            self.inclusive = inclusive

    def seeked(self, position: MessageId) -> None:
        """A seek landed at `position`: the next message read is that one."""
        self.last = None
        self.threshold = MessageId(position.ledger_id, position.entry_id)
        self.inclusive = True

    def resume_at(self) -> tuple[common_pb2.StartPosition, bool]:
        """Where a reconnect subscribes again, and whether inclusively."""
        if self.last is not None:
            return common_pb2.StartPosition(message_id=MessageId(
                self.last.ledger_id, self.last.entry_id).to_pb()), False
        if self.threshold is not None:
            return common_pb2.StartPosition(message_id=self.threshold.to_pb()), self.inclusive
        # nothing came, no position: "earliest", or "latest" of a partition that was empty
        return common_pb2.StartPosition(earliest=True), False

    def next_id(self) -> MessageId | None:
        """The first id this reader may read next (None: the partition's first): after the
        last returned, or the start as told."""
        if self.last is not None:
            return MessageId(self.last.ledger_id, self.last.entry_id + 1)
        if self.threshold is not None:
            return self.threshold if self.inclusive else \
                MessageId(self.threshold.ledger_id, self.threshold.entry_id + 1)
        return None

    def unread(self, newest: MessageId) -> bool:
        """Whether `newest` (the partition's last message) is past what was read."""
        newest = MessageId(newest.ledger_id, newest.entry_id)
        if self.last is not None:
            return newest > MessageId(self.last.ledger_id, self.last.entry_id)
        return (self.threshold is None or newest > self.threshold
                or (self.inclusive and newest == self.threshold))
