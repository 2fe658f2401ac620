"""A consumer's acknowledgements on their way to the broker (acks.py has the wire side: ranges
and receipts):

- an individual ack goes into the stream's ack ranges (`Multiplexer.ack`: grouped with the
  others queued meanwhile);
- an ack that wants the broker's receipt (`ack_receipt=True`) is a command of its own with a
  request id, answered by an `ack_receipt` event or a warning (`AckReceipts`);
- a consumer that reconnects (reconnect.py) remembers its last `ACK_MEMORY` individual acks:
  an ack lost with a stream is sent again when its message comes again after the reconnect,
  and that message is not returned a second time (`acked_already`). A seek forgets them.

Every method runs with the consumer's condition held.
"""
from __future__ import annotations

from collections import OrderedDict

from shadowtopic.client.acks import AckReceipts, ReceiptCallback, one_range
from shadowtopic.client.consumer_part import Part
from shadowtopic.client.message import Message
from shadowtopic.client.reconnect import ACK_MEMORY
from shadowtopic.core import errors
from shadowtopic.pb.v1 import common_pb2, consumer_pb2


class AckSender:
    """A consumer's acknowledgements: sent, waiting for receipts, and remembered."""

    __slots__ = ("receipts", "remember", "_acked")

    def __init__(self, remember: bool) -> None:
        #: acks waiting for the broker's receipt (ack_receipt=True)
        self.receipts = AckReceipts()
        #: remember individual acks (the consumer reconnects)
        self.remember = remember
        #: remembered acks (partition, ledger, entry), oldest first
        self._acked: OrderedDict[tuple[int, int, int], None] = OrderedDict()

    def send(self, p: Part, ledger: int, entry: int) -> None:
        """An individual ack, remembered; while the partition reconnects, or when its stream
        just broke, only remembered: the message comes again and is acknowledged then."""
        if self.remember:
            self._remember(p, ledger, entry)
        if p.state == "reconnecting":
            return
        try:
            p.mux.ack(p.handle, ledger, entry)
        except errors.ShadowTopicError:
            if not self.remember:
                raise

    def send_with_receipt(self, p: Part, ledger: int, entry: int, cumulative: bool,
                          callback: ReceiptCallback) -> None:
        """An ack that wants the broker's receipt: its own command, now, with a request id;
        `callback` hears the answer. Remembered as `send` does (an individual one; the
        consumer keeps a cumulative one); while the partition reconnects it fails at once
        with `ServiceUnavailable` (the remembered ack goes again after the reconnect,
        unconfirmed)."""
        if self.remember and not cumulative:
            self._remember(p, ledger, entry)
        if p.state != "open":
            callback(errors.ServiceUnavailable(
                f"the consumer of {p.topic} is reconnecting: ack not confirmed")
                if p.state == "reconnecting" else
                errors.AlreadyClosed(f"the consumer of {p.topic} was ended"))
            return
        request_id = self.receipts.add(p.handle, callback)
        ack = (consumer_pb2.Ack(ids=[id_pb(ledger, entry)], cumulative=True,
                                request_id=request_id) if cumulative else
               consumer_pb2.Ack(ranges=one_range(ledger, entry), request_id=request_id))
        try:
            p.send(ack=ack)
        except errors.ShadowTopicError as exc:
            self.receipts.answer(request_id, exc)

    def acked_already(self, p: Part, msg: Message) -> bool:
        """`msg` came again after a reconnect and this consumer acknowledged it before (the
        ack was lost): acknowledge it again, and it is not returned."""
        if not p.resumed:
            return False
        mid = msg.message_id
        if p.cum_acked is not None and (mid.ledger_id, mid.entry_id) <= p.cum_acked:
            return True  # the cumulative ack went again at the reconnect
        if (p.index, mid.ledger_id, mid.entry_id) not in self._acked:
            return False
        p.send_quietly(ack=consumer_pb2.Ack(ranges=one_range(mid.ledger_id, mid.entry_id)))
        return True

    def forget(self, p: Part) -> None:
        """A seek (anyone's): acknowledged messages of `p` may be delivered again on purpose."""
        p.cum_acked = None
        p.resumed = False
        if self._acked:
            self._acked = OrderedDict((k, None) for k in self._acked if k[0] != p.index)

    def _remember(self, p: Part, ledger: int, entry: int) -> None:
        acked = self._acked
        acked[(p.index, ledger, entry)] = None
        if len(acked) > ACK_MEMORY:  # the oldest goes (O(1): a plain dict's first key is
            acked.popitem(last=False)  # found past every deleted slot, microseconds each)


def id_pb(ledger: int, entry: int) -> common_pb2.MessageIdData:
    return common_pb2.MessageIdData(ledger_id=ledger, entry_id=entry)
