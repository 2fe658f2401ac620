"""CatchUp (source/client/catch_up.py) against a scripted Tables service: rows handed out
`max_messages` at a time from each answer, the position after the last handed out, a call
again from there when one ends, caught up when a call from the position brings nothing, a
failed call's typed error raised once and the next call from the same position, an answer
that is not Arrow refused as DataLoss."""
from __future__ import annotations

import grpc
import pytest

pa = pytest.importorskip("pyarrow")

from shadowtopic import columns  # noqa: E402
from shadowtopic.client.catch_up import CatchUp  # noqa: E402
from shadowtopic.core import errors  # noqa: E402
from shadowtopic.core.message_id import MessageId  # noqa: E402
from shadowtopic.pb.v1 import tables_pb2  # noqa: E402


def answer(ledger: int, first: int, n: int) -> tables_pb2.ArrowBatch:
    rows = {name: [None] * n for name in columns.READ_SCHEMA.names}
    rows.update(ledger_id=[ledger] * n, entry_id=list(range(first, first + n)),
                key=[b"k%d" % i for i in range(first, first + n)],
                payload=[b"v%d" % i for i in range(first, first + n)],
                is_tombstone=[False] * n, publish_time=[1] * n, partition=[-1] * n)
    table = pa.table(rows, schema=columns.READ_SCHEMA)
    return tables_pb2.ArrowBatch(ipc=columns.ipc(table))


class Refused(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "broker restarting"


class Call:
    def __init__(self, items):
        self.items = items

    def __iter__(self):
        for item in self.items:
            if isinstance(item, Exception):
                raise item
            yield item

    def cancel(self) -> bool:
        return True


class Tables:
    """A channel whose ReadArrow answers each call with the next script, recording starts."""

    def __init__(self, scripts):
        self.scripts = list(scripts)
        self.starts: list = []

    def unary_stream(self, method, request_serializer=None, response_deserializer=None,
                     **_):
        def call(request):
            self.starts.append((request.start.ledger_id, request.start.entry_id)
                               if request.HasField("start") else None)
            return Call(self.scripts.pop(0))
        return call


def rows(batch) -> list:
    return list(zip(batch.column("ledger_id").to_pylist(),
                    batch.column("entry_id").to_pylist(), strict=True))


NAMES = ["ledger_id", "entry_id", "payload"]


def test_rows_come_out_in_order_a_few_at_a_time_until_a_call_finds_nothing():
    channel = Tables([[answer(3, 0, 5), answer(4, 0, 2)], [answer(4, 2, 1)], []])
    cu = CatchUp(channel, False, [("persistent://t/ns/x", -1, None)])
    got = []
    while (batch := cu.next(3, 5.0, NAMES)) is not None:
        assert batch.num_rows <= 3 and batch.schema.names == NAMES
        got += rows(batch)
    assert got == [(3, i) for i in range(5)] + [(4, 0), (4, 1), (4, 2)]
    assert channel.starts == [None, (4, 2), (4, 3)]  # again from the position, until empty
    assert cu.seeks() == [(-1, MessageId(4, 3))]


def test_a_failed_call_raises_its_typed_error_and_the_next_goes_on_from_the_position():
    channel = Tables([[answer(3, 0, 2), Refused()], [answer(3, 2, 1)], []])
    cu = CatchUp(channel, True, [("persistent://t/ns/x", -1, MessageId(3, 0))])
    assert rows(cu.next(10, 5.0, NAMES)) == [(3, 0), (3, 1)]
    with pytest.raises(errors.ServiceUnavailable):
        cu.next(10, 5.0, NAMES)
    assert rows(cu.next(10, 5.0, NAMES)) == [(3, 2)]
    assert cu.next(10, 5.0, NAMES) is None
    assert channel.starts == [(3, 0), (3, 2), (3, 3)]


def test_an_answer_that_is_not_arrow_is_data_loss():
    cu = CatchUp(Tables([[tables_pb2.ArrowBatch(ipc=b"not arrow")]]), False,
                 [("persistent://t/ns/x", -1, None)])
    with pytest.raises(errors.DataLoss, match="did not decode"):
        cu.next(10, 5.0, NAMES)


def test_nothing_read_needs_no_seek():
    cu = CatchUp(Tables([[]]), False, [("persistent://t/ns/x", -1, MessageId(7, 0))])
    assert cu.next(10, 5.0, NAMES) is None
    assert cu.seeks() == []
