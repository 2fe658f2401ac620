"""One partition (one handle on the client's stream) of a consumer: the state that both the
consumer (`consumer.Consumer`) and a `subscribe_many` listener (`listener.Listeners`) keep of
it, here below both of them."""
from __future__ import annotations

from typing import TypedDict

from shadowtopic.client.read_position import ReadPosition
from shadowtopic.client.stream import Multiplexer
from shadowtopic.pb.v1 import consumer_pb2


class Command(TypedDict, total=False):
    """The command a `ClientCommand` for one handle carries (its one-of, by name)."""
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

    def answer(self, kind: str, value: object) -> bool:
        if kind in self.waits and self.waits[kind] is None:
            self.waits[kind] = value
            return True
        return False

