"""Producer limits and publisher stats."""
from __future__ import annotations

import time

import pytest

from source.client import Client, Policies
from source.core import errors


def test_max_producers_refuses_the_extra_producer_and_stats_list_publishers(broker, client,
                                                                            topic):
    client.admin.create_topic(topic, policies=Policies(max_producers=1))
    with Client(broker.url) as c1, Client(broker.url) as c2:
        first = c1.create_producer(topic, producer_name="first")
        assert first.send(b"a").entry_id == 0
        second = c2.create_producer(topic, producer_name="second")
        with pytest.raises(errors.TooManyProducers) as info:
            second.send(b"b")
        assert info.value.code.name == "RESOURCE_EXHAUSTED"
        pubs = client.admin.stats(topic)["publishers"]
        assert [p["producerName"] for p in pubs] == ["first"]
        first.close()
        c1.close()
        deadline = time.monotonic() + 10
        while client.admin.stats(topic)["publishers"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.admin.stats(topic)["publishers"] == []
        assert second.send(b"c").entry_id == 1
        second.close()
    with client.create_reader(topic) as r:
        assert [r.read_next(5).payload for _ in range(2)] == [b"a", b"c"]
