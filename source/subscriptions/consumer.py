"""A consumer of a durable subscription, and the notices it is sent besides entries.

A `SubConsumer` is one handle of a client stream attached to a subscription: its permits
(the flow it asked for), its outbox, and what the subscription's dispatcher keeps per
consumer (Shared / Key_Shared: the entries it holds unacknowledged; Key_Shared: where it
joined; Exclusive / Failover: whether it is the active one). Notices tell it that it became
or stopped being the active consumer (`ActiveChanged`) or that the cursor moved under it
(`CursorMoved`).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from shadowtopic.core.message_id import MessageId
from shadowtopic.read.engine import Outbox
from shadowtopic.subscriptions.positions import UNUSED, Positions

S = TypeVar("S")


@dataclass(frozen=True)
class ActiveChanged:
    """Exclusive / Failover: this consumer now gets the messages, or no longer does."""
    is_active: bool


@dataclass(frozen=True)
class CursorMoved:
    """The subscription's cursor was reset (a seek or reset-cursor): the consumer drops what
    it holds and sends a fresh flow. `by_admin`: it was not this consumer's own seek."""
    position: MessageId
    clamped: bool
    by_admin: bool


class ConsumerOutbox(Outbox, Protocol):
    def send_notice(self, handle: int, notice: ActiveChanged | CursorMoved) -> None:
        """Queue an event for `handle`."""


class SubConsumer(Generic[S]):
    """One consumer (a handle of a client stream) of a subscription. `S` is the type of
    the subscription it is attached to (`Subscription`, subscription.py: that module
    imports this one, not the reverse)."""

    __slots__ = ("handle", "outbox", "name", "priority", "permits", "sub", "pending", "join",
                 "seq", "msg_out", "bytes_out", "redelivered", "address", "since", "active",
                 "closed")

    def __init__(self, handle: int, outbox: ConsumerOutbox, name: str, priority: int, seq: int,
                 address: str = ""):
        self.handle = handle
        self.outbox = outbox
        self.name = name
        self.priority = priority
        self.seq = seq
        self.permits = 0
        self.sub: S | None = None
        self.pending: Positions = UNUSED  # Shared / Key_Shared: entries it holds unacked
        self.join: int | None = None     # Key_Shared: held back from here until acked
        self.msg_out = self.bytes_out = self.redelivered = 0
        self.address = address
        self.since = time.time()         # connected since (shown as ISO 8601 in stats)
        self.active: bool | None = None
        self.closed = False

    def can_take(self, wake: Callable[[], None]) -> bool:
        if self.permits <= 0:
            return False
        if not self.outbox.has_room():
            self.outbox.call_when_room(wake)
            return False
        return True
