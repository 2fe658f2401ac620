"""Disk policies against real broker processes, as a user drives them (client, admin, CLI):
message TTL (then retention deletes the ledger), the three backlog quota actions
(producer_request_hold, producer_exception, consumer_backlog_eviction), subscription
expiry, and TTL and expiry on a shadow's own subscriptions. Brokers run with a short
maintenance interval (`--retention-interval 0.5`); policy times are a few seconds; every
wait polls with a bounded deadline."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from support.policy_broker import ARGS, backlog, payload, sub_stats
from support.waiting import wait_for

from shadowtopic.client import Client, Policies, errors
from shadowtopic.core.policies import BacklogQuotaAction
from shadowtopic.testing import start_broker

EXE = os.path.join(os.path.dirname(sys.executable), "shadowtopic")


@pytest.fixture(scope="module")
def quick_broker(etcd_server, tmp_path_factory):
    """conftest's `quick_broker` (maintenance twice a second), one for the module: every
    policy here is a topic's own, and each test's topic is its own."""
    b = start_broker(etcd_server.endpoint, tmp_path_factory.mktemp("quick"), args=ARGS)
    try:
        yield b
    finally:
        b.kill()


@pytest.fixture(scope="module")
def quick_pair(start_module_pair):
    """A source broker (maintenance twice a second) and a shadow broker, one pair for the
    module (see conftest's `start_pair`)."""
    return start_module_pair("--retention-interval", "0.5")


def cli(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, "--url", url, *args], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def entries(c: Client, topic: str) -> int:
    return int(c.admin.internal_stats(topic).get("numberOfEntries", 0))


# ---- message TTL ---------------------------------------------------------------------------

def test_ttl_acknowledges_old_messages_then_retention_deletes_their_ledger(quick_broker, topic):
    with Client(quick_broker.url, timeout=20) as c:
        c.admin.create_topic(topic, policies=Policies(retention_time_seconds=0))
        c.admin.create_subscription(topic, "abandoned", "earliest")
        with c.create_producer(topic) as p:
            for i in range(5):
                p.send(payload(i))
        c.admin.roll_ledger(topic)
        time.sleep(1.5)  # retention alone keeps everything: the subscription needs it
        assert backlog(c, topic, "abandoned") == 5 and entries(c, topic) == 5
        res = cli(quick_broker.url, "topics", "set-policies", topic, "--message-ttl", "2s")
        assert res.returncode == 0, res.stderr
        assert json.loads(cli(quick_broker.url, "topics", "get-policies", topic, "-o", "json")
                          .stdout)["message_ttl_seconds"] == 2
        wait_for(lambda: backlog(c, topic, "abandoned") == 0, 30, "TTL to acknowledge")
        assert int(sub_stats(c, topic, "abandoned")["msgExpired"]) == 5
        wait_for(lambda: entries(c, topic) == 0, 30, "retention to delete the ledger")
        with c.create_producer(topic) as p:  # new messages are kept until they are old
            p.send(b"fresh")
        assert backlog(c, topic, "abandoned") == 1


# ---- backlog quota -------------------------------------------------------------------------

def quota_topic(c: Client, topic: str, action: BacklogQuotaAction) -> None:
    """A topic whose subscription "slow" has 20 messages of backlog (2,000 bytes), then a
    quota of 500 bytes (set after producing: a send held meanwhile would wait)."""
    c.admin.create_topic(topic)
    c.admin.create_subscription(topic, "slow", "earliest")
    with c.create_producer(topic) as p:
        for i in range(20):
            p.send(payload(i))
    c.admin.set_policies(topic, Policies(backlog_quota_size_bytes=500,
                                         backlog_quota_action=action))


def exceeded(c: Client, topic: str) -> bool:
    return bool(c.admin.stats(topic).get("backlogQuotaExceeded"))


def test_quota_hold_makes_produce_wait_until_a_consumer_catches_up(quick_broker, topic):
    with Client(quick_broker.url, timeout=20) as c:
        quota_topic(c, topic, BacklogQuotaAction.PRODUCER_REQUEST_HOLD)
        with c.create_producer(topic) as p:
            wait_for(lambda: exceeded(c, topic), 30, "the quota to be exceeded")
            assert sub_stats(c, topic, "slow")["backlogQuotaExceeded"] is True
            with pytest.raises(errors.Timeout):  # held: the client's timeout ends the wait
                p.send(b"held", timeout=1.5)
            result: dict = {}

            def send():
                try:
                    result["id"] = p.send(b"after", timeout=30)
                except Exception as exc:  # noqa: BLE001 - asserted below
                    result["error"] = exc
            sender = threading.Thread(target=send)
            sender.start()
            time.sleep(1.0)
            assert sender.is_alive()  # still held
            with c.subscribe(topic, "slow") as cons:
                got = []
                while True:
                    try:
                        m = cons.receive(timeout=3)
                    except errors.Timeout:
                        break
                    cons.acknowledge(m)
                    got.append(m.payload)
                    if m.payload == b"after":
                        break
                sender.join(30)
                assert not sender.is_alive() and "id" in result, result
                assert got[:20] == [payload(i) for i in range(20)]
        wait_for(lambda: not exceeded(c, topic), 30, "the quota to be met")


def test_quota_exception_refuses_produce_with_a_typed_error(quick_broker, topic):
    with Client(quick_broker.url, timeout=20) as c:
        quota_topic(c, topic, BacklogQuotaAction.PRODUCER_EXCEPTION)
        with c.create_producer(topic) as p:
            wait_for(lambda: exceeded(c, topic), 30, "the quota to be exceeded")
            with pytest.raises(errors.ProducerBlockedQuotaExceeded) as info:
                p.send(b"refused", timeout=10)
            assert "slow" in info.value.message
            c.admin.clear_backlog(topic, "slow")
            wait_for(lambda: not exceeded(c, topic), 30, "the quota to be met")
            p.send(b"accepted", timeout=10)


def test_quota_eviction_skips_the_slowest_subscription_to_within_quota(quick_broker, topic):
    with Client(quick_broker.url, timeout=20) as c:
        c.admin.create_topic(topic)
        c.admin.create_subscription(topic, "slow", "earliest")
        with c.subscribe(topic, "fast", initial_position="earliest") as fast:
            with c.create_producer(topic) as p:
                for i in range(20):
                    p.send(payload(i))
            for _ in range(20):
                fast.acknowledge(fast.receive(timeout=10))
            wait_for(lambda: backlog(c, topic, "fast") == 0, 30, "fast to catch up")
            res = cli(quick_broker.url, "topics", "set-policies", topic,
                      "--backlog-quota-size", "500",
                      "--backlog-quota-action", "consumer_backlog_eviction")
            assert res.returncode == 0, res.stderr
            shown = cli(quick_broker.url, "topics", "get-policies", topic, "-o", "json")
            assert json.loads(shown.stdout)["backlog_quota_action"] == \
                "consumer_backlog_eviction"
            slow = wait_for(lambda: (s := sub_stats(c, topic, "slow")) and
                            int(s.get("msgEvicted", 0)) > 0 and s, 30, "eviction")
            assert int(slow["backlogSize"]) <= 500 and int(slow["msgBacklog"]) < 20
            assert int(slow["msgBacklog"]) + int(slow["msgEvicted"]) == 20
            assert int(sub_stats(c, topic, "fast")["msgEvicted"]) == 0
            with c.create_producer(topic) as p:  # eviction never blocks producers
                p.send(b"more", timeout=10)
            # what is left is the newest: the slow subscription reads on from there
            with c.subscribe(topic, "slow") as cons:
                first = cons.receive(timeout=10)
                assert first.payload == payload(20 - int(slow["msgBacklog"]))


# ---- subscription expiry -------------------------------------------------------------------

def test_idle_subscription_expires_one_with_a_consumer_stays(quick_broker, topic):
    with Client(quick_broker.url, timeout=20) as c:
        c.admin.create_topic(topic)
        c.admin.create_subscription(topic, "idle", "earliest")
        with c.subscribe(topic, "busy", initial_position="earliest") as busy:
            with c.create_producer(topic) as p:
                p.send(b"x")
            res = cli(quick_broker.url, "topics", "set-policies", topic,
                      "--subscription-expiration", "2s")
            assert res.returncode == 0, res.stderr
            wait_for(lambda: "idle" not in c.admin.list_subscriptions(topic),
                     timeout=30, what="the idle subscription to expire")
            assert "busy" in c.admin.list_subscriptions(topic)
            assert busy.receive(timeout=10).payload == b"x"
            assert int(sub_stats(c, topic, "busy")["lastActive"]) > 0


# ---- shadows -------------------------------------------------------------------------------

def test_ttl_and_expiry_apply_to_a_shadows_own_subscriptions(quick_pair, topic):
    src, _ = quick_pair
    shadow = f"{topic}-shadow"
    with Client(src.url, timeout=20) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(shadow, topic)
        c.admin.create_subscription(shadow, "idle", "earliest")
        with c.subscribe(shadow, "kept", initial_position="earliest") as kept:
            with c.create_producer(topic) as p:
                for i in range(5):
                    p.send(payload(i))
            wait_for(lambda: backlog(c, shadow, "idle") == 5, 30, "the shadow to replicate")
            got = kept.receive(timeout=10)  # received, never acknowledged
            assert got.payload == payload(0)
            c.admin.set_policies(shadow, Policies(message_ttl_seconds=2))
            wait_for(lambda: backlog(c, shadow, "kept") == 0 and
                     backlog(c, shadow, "idle") == 0, 30, "TTL on the shadow")
            assert int(sub_stats(c, shadow, "kept")["msgExpired"]) == 5
            # the source's own subscriptions are not the shadow's business
            assert c.admin.get_policies(topic).message_ttl_seconds == 0
            c.admin.set_policies(shadow, Policies(subscription_expiration_seconds=2))
            wait_for(lambda: "idle" not in c.admin.list_subscriptions(shadow),
                     timeout=30, what="the shadow's idle subscription to expire")
            assert "kept" in c.admin.list_subscriptions(shadow)


def test_quota_eviction_applies_to_a_shadows_own_subscriptions(quick_pair, topic):
    """A shadow's backlog quota with `consumer_backlog_eviction` skips its own slowest
    subscription to within the quota; the source's subscriptions and producers are not the
    shadow's business (the producer actions have nothing to act on in a shadow)."""
    src, _ = quick_pair
    shadow = f"{topic}-shadow"
    with Client(src.url, timeout=20) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(shadow, topic)
        c.admin.create_subscription(shadow, "slow", "earliest")
        c.admin.create_subscription(topic, "source-slow", "earliest")
        with c.create_producer(topic) as p:
            for i in range(20):
                p.send(payload(i))
        # a shadow knows the size of its source's sealed ledgers only (the open one's entries
        # reach it as ids): a size quota counts those
        c.admin.roll_ledger(topic)
        wait_for(lambda: backlog(c, shadow, "slow") == 20 and
                 int(sub_stats(c, shadow, "slow").get("backlogSize", 0)) > 500,
                 timeout=30, what="the shadow to replicate and see the sealed ledger")
        c.admin.set_policies(shadow, Policies(
            backlog_quota_size_bytes=500,
            backlog_quota_action=BacklogQuotaAction.CONSUMER_BACKLOG_EVICTION))
        slow = wait_for(lambda: (s := sub_stats(c, shadow, "slow")) and
                        int(s.get("msgEvicted", 0)) > 0 and s, 30, "eviction on the shadow")
        assert int(slow["backlogSize"]) <= 500
        assert int(slow["msgBacklog"]) + int(slow["msgEvicted"]) == 20
        assert backlog(c, topic, "source-slow") == 20
        assert int(sub_stats(c, topic, "source-slow").get("msgEvicted", 0)) == 0
        with c.create_producer(topic) as p:
            p.send(b"more", timeout=10)
        with c.subscribe(shadow, "slow") as cons:  # it reads on from the newest it kept
            assert cons.receive(timeout=10).payload == payload(20 - int(slow["msgBacklog"]))
