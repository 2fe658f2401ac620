"""The consumer's inbox (source/client/inbox.py): frames in, messages out in order, one
frame decoded at a time; what a seek made stale (an older epoch) or an ended partition held
is never returned; `drop` gives back the permits of frames not started; a reader's position
takes the last message returned from the current frame."""
from __future__ import annotations

from support.fake_broker import entry

from shadowtopic.client.consumer_part import Part
from shadowtopic.client.inbox import Inbox
from shadowtopic.client.read_position import ReadPosition
from shadowtopic.client.stream import Delivery
from shadowtopic.core.message_id import MessageId
from shadowtopic.pb.v1 import consumer_pb2


class _Mux:  # a Part's stream, never used here
    pass


def frame(handle: int, *entries) -> Delivery:
    return Delivery(consumer_pb2.ServerFrame(handles=[handle], entries=list(entries)))


def take(inbox: Inbox):
    """What the consumer does (consumer.py `_next`): the current batch, then the next."""
    b = inbox.current
    while True:
        if b is not None and b.is_current():
            msg = next(b.it, None)
            if msg is not None:
                b.last = msg
                return b.part, b.epoch, msg
        b = inbox.next_batch()
        if b is None:
            return None


def test_messages_come_out_in_order_and_what_a_seek_made_stale_does_not():
    a, b = Part("t-partition-0", 0, 1, _Mux()), Part("t-partition-1", 1, 2, _Mux())
    inbox = Inbox()
    inbox.add(a, frame(1, entry(1, 0), entry(1, 1)))
    inbox.add(b, frame(2, entry(2, 0)))
    p, epoch, msg = take(inbox)
    assert (p, epoch, msg.message_id.entry_id) == (a, 0, 0)
    a.epoch += 1  # a seek of partition 0: its 1:1, received before, is stale
    p, _, msg = take(inbox)
    assert (p, msg.message_id.ledger_id) == (b, 2)
    assert take(inbox) is None and not inbox.has_current()


def test_drop_counts_the_current_messages_of_frames_not_started():
    a, b = Part("t-partition-0", 0, 1, _Mux()), Part("t-partition-1", 1, 2, _Mux())
    inbox = Inbox()
    inbox.add(a, frame(1, entry(1, 0), entry(1, 1), entry(1, 2)))
    inbox.add(b, frame(2, entry(2, 0)))
    inbox.add(b, frame(2, entry(2, 1), entry(2, 2)))
    take(inbox)  # 1:0 returned: its frame started (its permits were credited then)
    b.state = "ended"
    inbox.add(a, frame(1, entry(1, 3)))
    assert inbox.has_current()
    assert inbox.drop() == {1: 1}  # an ended partition's messages count for nothing
    assert take(inbox) is None and not inbox.has_current()


def test_a_readers_position_is_the_last_message_returned_of_the_current_frame():
    a = Part("t", -1, 1, _Mux())
    a.position = ReadPosition()
    inbox = Inbox()
    inbox.add(a, frame(1, entry(1, 0), entry(1, 1), entry(1, 2)))
    take(inbox)
    take(inbox)
    assert a.position.last is None  # (written back when asked, not per message)
    inbox.sync_position()
    assert a.position.last == MessageId(1, 1, -1)
    a.epoch += 1  # a seek: what was returned before it no longer moves the position
    a.position.seeked(MessageId(1, 0))
    inbox.sync_position()
    assert a.position.last is None


def test_a_redelivered_entry_carries_its_handles_own_count():
    a = Part("t", -1, 7, _Mux())
    inbox = Inbox()
    delivery = Delivery(consumer_pb2.ServerFrame(
        handles=[7], entries=[entry(1, 0), entry(1, 1)],
        redeliveries=[consumer_pb2.Redelivery(handle=7, entry_index=1, count=3),
                      consumer_pb2.Redelivery(handle=8, entry_index=0, count=9)]))
    inbox.add(a, delivery)
    got = [take(inbox)[2], take(inbox)[2]]
    assert [m.redelivery_count for m in got] == [0, 3]
    shared = delivery.messages("t", -1)[1]
    assert shared.redelivery_count == 0 and got[1].payload == shared.payload
    assert got[1].message_id == shared.message_id
