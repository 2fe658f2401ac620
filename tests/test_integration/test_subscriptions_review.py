"""Second reader's end-to-end tests of durable subscriptions (real broker + etcd, through
the bundled client). `test_bug_*` fail on the current code; the others pin behaviour that is
right but was not tested."""
from __future__ import annotations

import time

from support.produce import produce
from support.waiting import drain, wait_for

from shadowtopic.client import Client


def test_partitioned_shared_consumer_acks_route_to_their_partition(broker, client, topic):
    """Right today: a consumer of a 3-partition topic gets every partition's messages, acks
    go to the partition of each message (backlog 0 on each), a seek by publish time applies
    to every partition and redelivers all of them."""
    client.admin.create_topic(topic, partitions=3)
    with client.subscribe(topic, "s", "shared", initial_position="earliest") as c:
        t0 = int(time.time() * 1000) - 1
        produce(client, topic, 30, keys=30)
        got = drain(c, 30)
        assert sorted(m.value() for m in got) == sorted(f"m{i}" for i in range(30))
        assert {m.message_id.partition for m in got} == {0, 1, 2}

        def backlogs():
            return [client.admin.stats(f"{topic}-partition-{i}")["subscriptions"]["s"]
                    ["msgBacklog"] for i in range(3)]
        wait_for(lambda: backlogs() == [0, 0, 0], what="every partition acked")
        _, clamped = c.seek(t0)
        again = drain(c, 30)
        assert sorted(m.value() for m in again) == sorted(f"m{i}" for i in range(30))
        wait_for(lambda: backlogs() == [0, 0, 0], what="every partition acked again")


def test_bug_shared_redelivery_count_after_the_only_consumer_reconnects(broker, client, topic):
    """C3 end to end: the only consumer of a Shared subscription dies with unacknowledged
    messages; the next consumer gets them again but with redelivery_count 0 (subscription.py
    `detach` clears `counts` when the last consumer leaves)."""
    client.admin.create_topic(topic)
    with Client(broker.url) as doomed:
        d = doomed.subscribe(topic, "sh", "shared", initial_position="earliest")
        produce(client, topic, 5)
        drain(d, 5, ack=False)
    with client.subscribe(topic, "sh", "shared") as live:
        again = drain(live, 5)
        assert [m.redelivery_count for m in again] == [1] * 5
