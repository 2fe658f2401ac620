"""How a `consumer.Consumer` reconnects (source/client/reconnect.py has the design): a
partition that breaks with a retriable error goes `reconnecting`, the client's
`Reconnector` calls `_resume` until it subscribes again (or `_give_up`), and the acks the
consumer remembers are sent again for what the broker redelivers after that.

Kept apart from consumer.py (a base class of `Consumer`) so that each stays small; every
method here runs with the consumer's condition held, or takes it.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Unpack

from shadowtopic.client.acks import AckReceipts, ReceiptCallback, one_range
from shadowtopic.client.consumer_part import Command, Part
from shadowtopic.client.inbox import Inbox
from shadowtopic.client.listener import ItemSink, Listeners
from shadowtopic.client.message import Message
from shadowtopic.client.reconnect import ACK_MEMORY, Owner, Reconnector, reconnectable
from shadowtopic.client.stream import Multiplexer
from shadowtopic.core import errors
from shadowtopic.pb.v1 import common_pb2, consumer_pb2


class ConsumerResume:
    """The reconnecting half of `Consumer`, which sets every attribute declared here and
    defines the methods below that only say what they are."""

    topic: str
    _cond: threading.Condition
    _parts: dict[int, Part]
    _reconnector: Reconnector | None
    _owner: Owner  # what `_reconnector` drives: `_resume`, `_give_up`
    _error: errors.ShadowTopicError | None
    _acked: OrderedDict[tuple[int, int, int], None]
    _receipts: AckReceipts  # acks waiting for the broker's receipt (ack_receipt=True)
    _listeners: Listeners | None
    _sink: ItemSink
    _queue_size: int
    _inbox: Inbox  # (a reader's position is written back before it resumes)
    _closed: bool

    def _subscribe_pb(self, p: Part) -> consumer_pb2.Subscribe:
        """(Consumer's) `p`'s Subscribe command."""
        raise NotImplementedError

    def _wait_answers(self, parts: list[Part], kind: str, timeout: float | None,
                      what: str) -> list[object]:
        """(Consumer's) wait until the broker answered `kind` on each of `parts`."""
        raise NotImplementedError

    def _flow(self, p: Part, permits: int) -> None:
        """(Consumer's) give `p` `permits` more."""
        raise NotImplementedError

    def _notify(self) -> None:
        """(Consumer's) wake whoever waits on the consumer (condition held)."""
        raise NotImplementedError

    # ---- breaking (the stream's receive thread, condition held) ----------------------------

    def _broken(self, p: Part, err: errors.ShadowTopicError) -> bool:
        """`p`'s handle broke with `err`: True when it reconnects (open, retriable, a
        reconnector), after answering whoever waits on it; False: it ends as before."""
        if p.state == "reconnecting":
            return True  # the stream's end after an in-band error: already on it
        if (self._reconnector is None or p.state != "open" or self._closed
                or self._error is not None or not reconnectable(err)):
            return False
        p.state = "reconnecting"
        for kind in p.waits:
            p.answer(kind, err)  # a pending seek or unsubscribe fails with it
        self._receipts.fail(err, p.handle)  # (applied or not: no receipt will come)
        self._reconnector.start(self._owner)
        return True

    # ---- the reconnector's attempts ---------------------------------------------------

    def _resume(self, mux: Multiplexer, timeout: float) -> None:
        """One attempt (reconnect.Resumable): every partition still reconnecting takes a
        new handle on `mux` and subscribes again; wait for the answers; flow and send the
        remembered cumulative acks again. Raises the first failure, leaving every one of
        them reconnecting."""
        with self._cond:
            if self._closed:
                raise errors.AlreadyClosed("consumer is closed")
            parts = [p for p in self._parts.values() if p.state == "reconnecting"]
            if not parts:
                return
            sink = self._listeners if self._listeners is not None else self._sink
            self._inbox.sync_position()  # (a reader resumes after what it returned)
            moved: list[Part] = []
            try:
                for p in parts:
                    handle = mux.register(sink, p.topic)
                    old_mux, old = p.mux, p.handle
                    self._parts.pop(old, None)
                    old_mux.unregister(old)
                    if self._listeners is not None:
                        self._listeners.remove(old)
                    p.handle, p.mux = handle, mux
                    self._parts[handle] = p
                    if self._listeners is not None:
                        self._listeners.add(sink=self._sink, part=p)
                    moved.append(p)
                    p.epoch += 1  # what was buffered comes again from the cursor
                    p.consumed = 0
                    p.state = "subscribing"
                    p.waits["subscribe"] = None
                    mux.send(consumer_pb2.ClientCommand(handle=handle,
                                                        subscribe=self._subscribe_pb(p)))
                answers = self._wait_answers(parts, "subscribe", timeout,
                                             f"resubscribing to {self.topic}")
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
                self._flow(p, self._queue_size)
                if p.cum_acked is not None:
                    ledger, entry = p.cum_acked
                    self._resend(p, ack=consumer_pb2.Ack(
                        ids=[_id_pb(ledger, entry)], cumulative=True))
            self._notify()

    def _unwind(self, moved: list[Part]) -> None:
        """A failed attempt: leave the new handles (unregistered first, so their answers go
        nowhere) and mark the partitions reconnecting again."""
        for p in moved:
            p.waits.pop("subscribe", None)
            p.mux.unregister(p.handle)
            if self._listeners is not None:
                self._listeners.remove(p.handle)
            self._resend(p, close=consumer_pb2.CloseHandle())
            # (a stream that died meanwhile ended it: it still reconnects, unless closed)
            p.state = "ended" if self._closed else "reconnecting"

    def _give_up(self, err: errors.ShadowTopicError) -> None:
        """Reconnecting failed for good (reconnect.Resumable): `receive` raises `err`."""
        with self._cond:
            if not self._closed and self._error is None:
                self._error = err
            for p in self._parts.values():
                if p.state == "reconnecting":
                    p.state = "ended"
            self._notify()

    def _resend(self, p: Part, **command: Unpack[Command]) -> None:
        try:
            p.mux.send(consumer_pb2.ClientCommand(handle=p.handle, **command))
        except errors.ShadowTopicError:  # the stream is gone again: the sink hears it
            pass

    # ---- acks remembered (condition held) ---------------------------------------------------

    def _remember_ack(self, p: Part, ledger: int, entry: int) -> None:
        acked = self._acked
        acked[(p.index, ledger, entry)] = None
        if len(acked) > ACK_MEMORY:  # the oldest goes (O(1): a plain dict's first key is
            acked.popitem(last=False)  # found past every deleted slot, microseconds each)

    def _send_ack(self, p: Part, ledger: int, entry: int) -> None:
        """An individual ack, remembered; while the partition reconnects, or when its stream
        just broke, only remembered: the message comes again and is acknowledged then."""
        if self._reconnector is not None:
            self._remember_ack(p, ledger, entry)
        if p.state == "reconnecting":
            return
        try:
            p.mux.ack(p.handle, ledger, entry)
        except errors.ShadowTopicError:
            if self._reconnector is None:
                raise

    def _send_ack_receipt(self, p: Part, ledger: int, entry: int, cumulative: bool,
                          callback: ReceiptCallback) -> None:
        """An ack that wants the broker's receipt (acks.py): its own command, now, with a
        request id; `callback` hears the answer. Remembered as `_send_ack` does (an individual
        one; the caller keeps a cumulative one); while the partition reconnects it fails at
        once with `ServiceUnavailable` (the remembered ack goes again after the reconnect,
        unconfirmed)."""
        if self._reconnector is not None and not cumulative:
            self._remember_ack(p, ledger, entry)
        if p.state != "open":
            callback(errors.ServiceUnavailable(
                f"the consumer of {p.topic} is reconnecting: ack not confirmed")
                if p.state == "reconnecting" else
                errors.AlreadyClosed(f"the consumer of {p.topic} was ended"))
            return
        request_id = self._receipts.add(p.handle, callback)
        ack = (consumer_pb2.Ack(ids=[_id_pb(ledger, entry)], cumulative=True,
                                request_id=request_id) if cumulative else
               consumer_pb2.Ack(ranges=one_range(ledger, entry), request_id=request_id))
        try:
            p.mux.send(consumer_pb2.ClientCommand(handle=p.handle, ack=ack))
        except errors.ShadowTopicError as exc:
            self._receipts.answer(request_id, exc)

    def _acked_already(self, p: Part, msg: Message) -> bool:
        """`msg` came again after a reconnect and this consumer acknowledged it before (the
        ack was lost): acknowledge it again, and it is not returned."""
        if not p.resumed:
            return False
        mid = msg.message_id
        if p.cum_acked is not None and (mid.ledger_id, mid.entry_id) <= p.cum_acked:
            return True  # the cumulative ack went again at the reconnect
        if (p.index, mid.ledger_id, mid.entry_id) not in self._acked:
            return False
        self._resend(p, ack=consumer_pb2.Ack(ranges=one_range(mid.ledger_id, mid.entry_id)))
        return True

    def _forget_acks(self, p: Part) -> None:
        """A seek (anyone's): acknowledged messages may be delivered again on purpose."""
        p.cum_acked = None
        p.resumed = False
        if self._acked:
            self._acked = OrderedDict((k, None) for k in self._acked if k[0] != p.index)


def _id_pb(ledger: int, entry: int) -> common_pb2.MessageIdData:
    return common_pb2.MessageIdData(ledger_id=ledger, entry_id=entry)
