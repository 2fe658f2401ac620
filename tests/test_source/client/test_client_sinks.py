"""A frame that names several handles of one sink (source/client/stream.py `Sink.put_many`):
the multiplexer hands it over once, and every kind of sink (a consumer's, a reader's queue)
passes it on to each of its handles. Against the fake broker of test_client_consumer_unit."""
from __future__ import annotations

import pytest
from support.fake_broker import FakeBroker, entry

from shadowtopic.pb.v1 import consumer_pb2

TOPIC = "persistent://public/default/t"


@pytest.fixture
def fake(fake: FakeBroker) -> FakeBroker:
    """The broker of conftest.py, with TOPIC in 2 partitions."""
    fake.partitions[TOPIC] = 2
    return fake


def test_a_frame_naming_every_partition_of_a_consumer_reaches_each_partition(fake, client):
    c = client.subscribe("t", "sub")
    handles = [c._handles.by_index[i].handle for i in (0, 1)]
    fake.push(consumer_pb2.ServerFrame(handles=handles, entries=[entry(1, 0)]))
    got = sorted(c.receive(timeout=5).topic for _ in range(2))
    assert got == [f"{TOPIC}-partition-0", f"{TOPIC}-partition-1"]


def test_a_frame_naming_every_partition_of_a_reader_reaches_each_partition(fake, client):
    reader = client.create_reader("t")
    try:
        handles = sorted(c.handle for c in fake.commands("subscribe"))
        fake.push(consumer_pb2.ServerFrame(handles=handles, entries=[entry(1, 0)]))
        got = sorted(reader.read_next(timeout=5).topic for _ in range(2))
        assert got == [f"{TOPIC}-partition-0", f"{TOPIC}-partition-1"]
    finally:
        reader.close()
