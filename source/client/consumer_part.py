"""One partition (one handle on the client's stream) of a consumer: the state that both the
consumer (`consumer.Consumer`) and a `subscribe_many` listener (`listener.Listeners`) keep of
it, here below both of them; and the wait for the broker's answers on some of them."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypedDict, Unpack

from shadowtopic.client.read_position import ReadPosition
from shadowtopic.client.stream import Multiplexer
from shadowtopic.core import errors
from shadowtopic.pb.v1 import consumer_pb2


class Command(TypedDict, total=False):
    """The command a `ClientCommand` for one handle carries (its one-of, by name)."""
    subscribe: consumer_pb2.Subscribe
    flow: consumer_pb2.Flow
    ack: consumer_pb2.Ack
    nack: consumer_pb2.Nack
    seek: consumer_pb2.Seek
    unsubscribe: consumer_pb2.Unsubscribe
    close: consumer_pb2.CloseHandle
    redeliver: consumer_pb2.RedeliverUnacknowledged


class Part:
    """One partition (one handle) of a consumer. Guarded by the consumer's condition; with a
    message listener, the listener's thread also counts `consumed` for what it calls back
    with, and reads `epoch` and `state` to drop what a seek or the end made stale."""

    __slots__ = ("topic", "index", "handle", "mux", "epoch", "consumed", "active", "state",
                 "waits", "cum_acked", "resumed", "position")

    def __init__(self, topic: str, index: int, handle: int, mux: Multiplexer):
        self.topic = topic
        self.index = index              # partition index, -1 for a non-partitioned topic
        self.handle = handle
        self.mux = mux                  # the stream the handle is on (a new one on reconnect)
        self.epoch = 0                  # +1 at every seek_done: older messages are dropped
        self.consumed = 0               # messages returned since the last Flow
        self.active: bool | None = None
        self.state = "subscribing"      # -> open (<-> reconnecting) -> ended
        #: what a caller waits for (subscribe | seek | unsubscribe | close) -> the broker's
        #: answer, an event or a typed error; None until it came
        self.waits: dict[str, object] = {}
        #: the last cumulative ack (ledger, entry), sent again after a reconnect
        self.cum_acked: tuple[int, int] | None = None
        self.resumed = False            # reconnected once: what comes may be acked already
        #: a reader's (a non-durable consumer's) position; None for a durable subscription
        self.position: ReadPosition | None = None

    def send(self, **command: Unpack[Command]) -> None:
        """Send `command` on this handle; raises the stream's typed error once it is gone."""
        self.mux.send(consumer_pb2.ClientCommand(handle=self.handle, **command))

    def send_quietly(self, **command: Unpack[Command]) -> None:
        """`send`, where a stream that is gone is no error: the consumer's sink hears of it."""
        try:
            self.mux.send(consumer_pb2.ClientCommand(handle=self.handle, **command))
        except errors.ShadowTopicError:
            pass

    def answer(self, kind: str, value: object) -> bool:
        if kind in self.waits and self.waits[kind] is None:
            self.waits[kind] = value
            return True
        return False



WAIT_SLICE_S = 0.2  # a blocked wait wakes this often, so Ctrl-C interrupts it promptly


def wait_answers(cond: threading.Condition, parts: list[Part], kind: str,
                 timeout: float | None, what: str, closed: Callable[[], bool]) -> list[object]:
    """Wait (`cond` held) until the broker answered `kind` on each of `parts` (their
    `waits[kind]` is set); return the answers. `Timeout` after `timeout` seconds (`what`
    timed out), `AlreadyClosed` when the consumer is `closed()` meanwhile (unless this is the
    close)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while any(p.waits.get(kind) is None for p in parts):
            if kind != "close" and closed():
                raise errors.AlreadyClosed("consumer is closed")
            remaining = WAIT_SLICE_S
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise errors.Timeout(f"{what} timed out after {timeout:g}s")
                remaining = min(left, WAIT_SLICE_S)
            cond.wait(remaining)
        return [p.waits[kind] for p in parts]
    finally:
        for p in parts:
            p.waits.pop(kind, None)
