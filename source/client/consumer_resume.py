"""How a `consumer.Consumer` reconnects (source/client/reconnect.py has the design): a
partition that breaks with a retriable error goes `reconnecting`, the client's `Reconnector`
calls `Resumer.resume` until it subscribes again (or `give_up`), and the acks the consumer
remembers (consumer_acks.py) are sent again for what the broker redelivers after that.

A `Resumer` is the consumer's, beside it: it holds the consumer's condition, its `Handles`
and its `AckSender`, and asks the rest of the consumer through the `ResumeHooks` it was
given. Every method runs with the consumer's condition held, or takes it.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from shadowtopic.client.consumer_acks import AckSender, id_pb
from shadowtopic.client.consumer_handles import Handles
from shadowtopic.client.consumer_part import Part, wait_answers
from shadowtopic.client.reconnect import Owner, Reconnector, reconnectable
from shadowtopic.client.stream import Multiplexer
from shadowtopic.core import errors
from shadowtopic.pb.v1 import consumer_pb2


@dataclass(frozen=True)
class ResumeHooks:
    """What a `Resumer` asks of its consumer (each called with the condition held)."""

    #: closed by the user (or a failed subscribe)
    closed: Callable[[], bool]
    #: closed, or ended by an error that `receive` raises
    ended: Callable[[], bool]
    #: `receive` raises this from now on (unless closed or ended already)
    fail: Callable[[errors.ShadowTopicError], None]
    #: the partition's Subscribe command (a reader's resumes where it is)
    subscribe_pb: Callable[[Part], consumer_pb2.Subscribe]
    #: the partition is open again: give it its permits
    reopened: Callable[[Part], None]
    #: wake whoever waits on the consumer
    notify: Callable[[], None]
    #: a reader's positions catch up with what it returned (before it subscribes again)
    sync_position: Callable[[], None]


class Resumer:
    """A consumer's reconnects: which partitions broke, and the attempts to subscribe again."""

    def __init__(self, topic: str, cond: threading.Condition, handles: Handles,
                 acks: AckSender, reconnector: Reconnector | None, hooks: ResumeHooks):
        self.topic = topic
        self._cond = cond
        self._handles = handles
        self._acks = acks
        self._reconnector = reconnector
        self._hooks = hooks
        self._owner = Owner(topic, self.resume, self.give_up)  # what the reconnector drives

    # ---- breaking (the stream's receive thread, condition held) ----------------------------

    def broken(self, p: Part, err: errors.ShadowTopicError) -> bool:
        """`p`'s handle broke with `err`: True when it reconnects (open, retriable, a
        reconnector), after answering whoever waits on it; False: it ends as before."""
        if p.state == "reconnecting":
            return True  # the stream's end after an in-band error: already on it
        if (self._reconnector is None or p.state != "open" or self._hooks.ended()
                or not reconnectable(err)):
            return False
        p.state = "reconnecting"
        for kind in p.waits:
            p.answer(kind, err)  # a pending seek or unsubscribe fails with it
        self._acks.receipts.fail(err, p.handle)  # (applied or not: no receipt will come)
        self._reconnector.start(self._owner)
        return True

    # ---- the reconnector's attempts ---------------------------------------------------

    def resume(self, mux: Multiplexer, timeout: float) -> None:
        """One attempt (reconnect.Resumable): every partition still reconnecting takes a
        new handle on `mux` and subscribes again; wait for the answers; flow and send the
        remembered cumulative acks again. Raises the first failure, leaving every one of
        them reconnecting."""
        hooks = self._hooks
        with self._cond:
            if hooks.closed():
                raise errors.AlreadyClosed("consumer is closed")
            parts = [p for p in self._handles if p.state == "reconnecting"]
            if not parts:
                return
            hooks.sync_position()  # (a reader resumes after what it returned)
            moved: list[Part] = []
            try:
                for p in parts:
                    self._handles.move(p, mux)
                    moved.append(p)
                    p.epoch += 1  # what was buffered comes again from the cursor
                    p.consumed = 0
                    p.state = "subscribing"
                    p.waits["subscribe"] = None
                    p.send(subscribe=hooks.subscribe_pb(p))
                answers = wait_answers(self._cond, parts, "subscribe", timeout,
                                       f"resubscribing to {self.topic}", hooks.closed)
            except BaseException:
                self._unwind(moved)
                raise
            failure = next((a for a in answers if isinstance(a, BaseException)), None)
            if failure is not None:
                self._unwind(moved)
                raise failure
            for p in parts:
                if p.state == "ended":  # an error came right after its subscribe's answer
                    continue
                p.state = "open"
                p.resumed = True
                hooks.reopened(p)
                if p.cum_acked is not None:
                    ledger, entry = p.cum_acked
                    p.send_quietly(ack=consumer_pb2.Ack(ids=[id_pb(ledger, entry)],
                                                        cumulative=True))
            hooks.notify()

    def _unwind(self, moved: list[Part]) -> None:
        """A failed attempt: leave the new handles (unregistered first, so their answers go
        nowhere) and mark the partitions reconnecting again."""
        for p in moved:
            p.waits.pop("subscribe", None)
            self._handles.unregister(p)
            p.send_quietly(close=consumer_pb2.CloseHandle())
            # (a stream that died meanwhile ended it: it still reconnects, unless closed)
            p.state = "ended" if self._hooks.closed() else "reconnecting"

    def give_up(self, err: errors.ShadowTopicError) -> None:
        """Reconnecting failed for good (reconnect.Resumable): `receive` raises `err`."""
        with self._cond:
            self._hooks.fail(err)
            for p in self._handles:
                if p.state == "reconnecting":
                    p.state = "ended"
            self._hooks.notify()
