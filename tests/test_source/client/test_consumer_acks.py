"""A consumer's `AckSender` (source/client/consumer_acks.py) over a stream that records what
it is given: acks go out as ranges, receipts as commands of their own, and a reconnecting
consumer's acks are remembered (bounded), sent again for a message that comes again, and
forgotten by a seek."""
from __future__ import annotations

import pytest

from shadowtopic.client.consumer_acks import AckSender
from shadowtopic.client.consumer_part import Part
from shadowtopic.client.message import Message
from shadowtopic.client.reconnect import ACK_MEMORY
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId


class Stream:
    """The part of `stream.Multiplexer` a part's acks use; `gone` makes it a broken one."""

    def __init__(self) -> None:
        self.acks: list[tuple[int, int, int]] = []
        self.commands: list = []
        self.gone = False

    def ack(self, handle: int, ledger: int, entry: int) -> None:
        if self.gone:
            raise errors.ConnectError("stream gone")
        self.acks.append((handle, ledger, entry))

    def send(self, command) -> None:
        if self.gone:
            raise errors.ConnectError("stream gone")
        self.commands.append(command)


def part(index: int = 0, state: str = "open") -> tuple[Part, Stream]:
    s = Stream()
    p = Part("t", index, 7, s)  # type: ignore[arg-type]
    p.state = state
    return p, s


def msg(ledger: int, entry: int, index: int = 0) -> Message:
    return Message(MessageId(ledger, entry, index), "t", b"x")


def test_an_ack_goes_out_as_a_range_and_is_remembered_only_when_reconnecting():
    p, s = part()
    plain, remembering = AckSender(remember=False), AckSender(remember=True)
    plain.send(p, 3, 4)
    remembering.send(p, 3, 5)
    assert s.acks == [(7, 3, 4), (7, 3, 5)]
    p.resumed = True
    assert not plain.acked_already(p, msg(3, 4))
    assert remembering.acked_already(p, msg(3, 5))       # not returned again ...
    assert [c.ack.ranges[0].first_entry for c in s.commands] == [5]  # ... acked again
    assert not remembering.acked_already(p, msg(3, 6))


def test_a_broken_stream_raises_unless_the_ack_is_remembered():
    p, s = part()
    s.gone = True
    with pytest.raises(errors.ConnectError):
        AckSender(remember=False).send(p, 1, 1)
    remembering = AckSender(remember=True)
    remembering.send(p, 1, 1)  # the message comes again after the reconnect
    p.resumed = True
    s.gone = False
    assert remembering.acked_already(p, msg(1, 1))


def test_while_reconnecting_an_ack_is_only_remembered_and_a_receipt_fails_at_once():
    p, s = part(state="reconnecting")
    acks = AckSender(remember=True)
    acks.send(p, 2, 0)
    answers: list = []
    acks.send_with_receipt(p, 2, 1, False, answers.append)
    assert s.acks == [] and s.commands == []
    assert isinstance(answers[0], errors.ServiceUnavailable)
    p.resumed = True
    assert acks.acked_already(p, msg(2, 0)) and acks.acked_already(p, msg(2, 1))


def test_a_receipt_is_a_command_with_a_request_id_answered_once():
    p, s = part()
    acks = AckSender(remember=False)
    answers: list = []
    acks.send_with_receipt(p, 5, 9, True, answers.append)
    (command,) = s.commands
    assert command.ack.cumulative and command.ack.request_id > 0
    assert (command.ack.ids[0].ledger_id, command.ack.ids[0].entry_id) == (5, 9)
    acks.receipts.answer(command.ack.request_id, None)
    acks.receipts.answer(command.ack.request_id, errors.Timeout("late"))  # (answered already)
    assert answers == [None]


def test_memory_is_bounded_and_a_seek_forgets_its_partition_only():
    p0, _ = part(0)
    p1, _ = part(1)
    acks = AckSender(remember=True)
    for entry in range(ACK_MEMORY + 5):
        acks.send(p0, 1, entry)
    acks.send(p1, 1, 0)
    p0.resumed = p1.resumed = True
    # ACK_MEMORY + 6 acks: the oldest 6 went
    assert not acks.acked_already(p0, msg(1, 5))
    assert acks.acked_already(p0, msg(1, 6))
    p0.cum_acked = (1, 3)
    acks.forget(p0)
    assert p0.cum_acked is None and not p0.resumed
    p0.resumed = True
    assert not acks.acked_already(p0, msg(1, 7))
    assert acks.acked_already(p1, msg(1, 0, index=1))
