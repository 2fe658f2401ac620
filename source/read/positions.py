"""Where a reader starts or seeks to (a domain type; the service converts StartPosition),
and how that resolves to a position in a `LedgerView`."""
from __future__ import annotations

from dataclasses import dataclass

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.ledger.view import LedgerView

EARLIEST, LATEST, MESSAGE_ID, PUBLISH_TIME = "earliest", "latest", "message_id", "publish_time"


@dataclass(frozen=True)
class Start:
    kind: str = EARLIEST                  # earliest | latest | message_id | publish_time
    message_id: MessageId | None = None   # kind == message_id
    publish_ms: int = 0                   # kind == publish_time
    inclusive: bool = False               # include the entry at message_id (or at latest)

    @classmethod
    def at(cls, message_id: MessageId, inclusive: bool = False) -> Start:
        return cls(MESSAGE_ID, message_id=message_id, inclusive=inclusive)


async def resolve(view: LedgerView, start: Start) -> MessageId:
    """The first position a reader starting at `start` reads (a valid position of `view`)."""
    if start.kind == LATEST:
        last = view.last_confirmed()
        if start.inclusive and last is not None:
            return last
        return view.next_position()
    if start.kind == MESSAGE_ID:
        mid = start.message_id
        if mid is None:
            raise errors.InvalidMessageId("a start at a message id names none")
        pos = MessageId(mid.ledger_id, mid.entry_id if start.inclusive else mid.entry_id + 1)
        return view.valid_position(pos)
    if start.kind == PUBLISH_TIME:
        return await view.position_at_time(start.publish_ms)
    return view.valid_position(MessageId(0, 0))
