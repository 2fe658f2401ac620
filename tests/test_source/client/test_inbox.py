"""The consumer's inbox (source/client/inbox.py): frames in, messages out in order, one
frame decoded at a time; what a seek made stale (an older epoch) or an ended partition held
is never returned; `drop` says how many current messages each handle had."""
from __future__ import annotations

from support.fake_broker import entry

from shadowtopic.client.consumer_part import Part
from shadowtopic.client.inbox import Inbox
from shadowtopic.client.stream import Decoded, Delivery
from shadowtopic.pb.v1 import consumer_pb2


class _Mux:  # a Part's stream, never used here
    pass


def frame(handle: int, *entries) -> Delivery:
    return Delivery(consumer_pb2.ServerFrame(handles=[handle], entries=list(entries)),
                    Decoded())


def test_messages_come_out_in_order_and_what_a_seek_made_stale_does_not():
    a, b = Part("t-partition-0", 0, 1, _Mux()), Part("t-partition-1", 1, 2, _Mux())
    inbox = Inbox()
    inbox.add(a, frame(1, entry(1, 0), entry(1, 1)))
    inbox.add(b, frame(2, entry(2, 0)))
    p, epoch, msg = inbox.take()
    assert (p, epoch, msg.message_id.entry_id) == (a, 0, 0)
    a.epoch += 1  # a seek of partition 0: its 1:1, received before, is stale
    p, _, msg = inbox.take()
    assert (p, msg.message_id.ledger_id) == (b, 2)
    assert inbox.take() is None and not inbox.has_current()


def test_drop_counts_each_handles_current_messages_and_empties_the_inbox():
    a, b = Part("t-partition-0", 0, 1, _Mux()), Part("t-partition-1", 1, 2, _Mux())
    inbox = Inbox()
    inbox.add(a, frame(1, entry(1, 0), entry(1, 1), entry(1, 2)))
    inbox.add(b, frame(2, entry(2, 0)))
    inbox.add(b, frame(2, entry(2, 1), entry(2, 2)))
    inbox.take()  # 1:0 returned: 2 left of that frame
    b.state = "ended"
    inbox.add(a, frame(1, entry(1, 3)))
    assert inbox.has_current()
    assert inbox.drop() == {1: 3}  # an ended partition's messages count for nothing
    assert inbox.take() is None and not inbox.has_current()
