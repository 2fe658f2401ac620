"""Subscription expiry across a broker crash: a durable subscription's last activity is
persisted with its cursor (source/cursors/, `last_active_ms`), so a broker killed (kill -9)
and restarted does not restart the count of subscription_expiration_seconds. The
subscription expires at (its consumer's disconnect + the expiration), not at (the restart +
the expiration). The broker runs its maintenance twice a second; every wait polls with a
bounded deadline."""
from __future__ import annotations

import time
import uuid

import pytest
from support.waiting import wait_for

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client, Policies, errors
from shadowtopic.standalone import BrokerProcess

# a cluster of its own: brokers of earlier tests, killed with their leases not yet expired,
# are still registered in the session's etcd and must not be picked to own the topic
ARGS = ["--lease-ttl", "3", "--retention-interval", "0.5"]
APART_S = 4.0  # between the disconnect and the kill: what the two counts differ by at least
#: client errors a wait counts as not yet: the restarted broker may not own the topic yet
NOT_YET = (errors.ShadowTopicError,)


@pytest.fixture
def restartable(etcd_server, tmp_path):
    """A broker of its own; the test kills and starts it again on the same data dir."""
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "data"), free_port(),
                      log_path=str(tmp_path / "broker.log"),
                      extra_args=[*ARGS, "--cluster", f"c-{uuid.uuid4().hex[:8]}"])
    b.start(timeout=60)
    try:
        yield b
    finally:
        b.kill()


def now_ms() -> int:
    return int(time.time() * 1000)


def sub_stats(c: Client, topic: str, name: str) -> dict:
    return c.admin.stats(topic)["subscriptions"].get(name, {})


def flushes(c: Client, topic: str, name: str) -> int:
    return int(c.admin.internal_stats(topic)["cursors"][name].get("cursorFlushes", 0))


def test_expiry_counts_from_the_disconnect_across_a_kill_and_restart(restartable, topic):
    broker = restartable
    with Client(broker.url, timeout=20) as c:
        c.admin.create_topic(topic)
        with c.subscribe(topic, "abandoned", initial_position="earliest") as cons:
            with c.create_producer(topic) as p:
                p.send(b"pinned")
            assert cons.receive(timeout=10).payload == b"pinned"  # never acknowledged
        wait_for(lambda: sub_stats(c, topic, "abandoned")["consumers"] == [] or None,
                 timeout=30, what="the consumer to detach", ignore=NOT_YET)
        before = flushes(c, topic, "abandoned")
        detached = int(sub_stats(c, topic, "abandoned")["lastActive"])
        wait_for(lambda: flushes(c, topic, "abandoned") > before,
                 timeout=30, what="the cursor flusher to save the detach", ignore=NOT_YET)
    time.sleep(APART_S)
    killed = now_ms()
    broker.kill()
    broker.start(timeout=60)
    with Client(broker.url, timeout=20) as c:
        after = wait_for(lambda: sub_stats(c, topic, "abandoned"), 30,
                         "the restarted broker to load the topic", ignore=NOT_YET)
        # the persisted detach time, not the load's
        assert int(after["lastActive"]) == detached
        assert detached <= killed - APART_S * 1000
        # expire the subscription 3 s after its disconnect + expiration is due: from the
        # load, it would be due APART_S later at least (the load follows the kill)
        expiration = (now_ms() - detached) // 1000 + 3
        c.admin.set_policies(topic, Policies(subscription_expiration_seconds=expiration))
        wait_for(lambda: "abandoned" not in c.admin.list_subscriptions(topic),
                 timeout=30, what="the abandoned subscription to expire", ignore=NOT_YET)
        gone = now_ms()
        assert detached + expiration * 1000 <= gone < killed + expiration * 1000
