"""Retention and shadows, end to end: a source broker (retention every 0.5 s) and a shadow
broker on one storage root and the session's etcd.

- Each shadow publishes the oldest position its durable subscriptions still need
  (`keys.shadow_needs`), and with the source policy `retention_keeps_shadow_backlog` on,
  the source's retention keeps those ledgers: a lagging shadow subscription reads
  everything, skipping nothing. Off (the default), retention deletes them and the shadow's
  cursor skips them (C8).
- A shadow deleted through the source broker is unloaded by the shadow broker serving it:
  its consumers get TopicNotFound and nothing under its prefix comes back in etcd.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from support.etcd_support import etcd_prefix
from support.waiting import drain, wait_for

from shadowtopic.client import Client, Policies, errors
from shadowtopic.core.names import TopicName
from shadowtopic.metadata import keys

N = 35            # messages: 3 sealed ledgers of 10 and an open one of 5
SMALL = dict(ledger_max_entries=10, retention_time_seconds=0)  # every sealed ledger is "old"


@pytest.fixture(scope="module")
def pair(start_module_pair):
    """(source broker, shadow broker), see conftest's `start_pair`: one pair for the
    module's tests (each on topics of its own; none stops a broker)."""
    return start_module_pair("--retention-interval", "0.5")


def etcd(etcd_server, prefix: str) -> dict[str, bytes]:
    return {k: kv.value for k, kv in etcd_prefix(etcd_server, prefix).items()}


def need(etcd_server, source: str, shadow: str) -> bytes | None:
    key = keys.shadow_needs(TopicName.parse(source), TopicName.parse(shadow))
    return etcd(etcd_server, key).get(key)


def entries(c, topic: str) -> int:
    return int(c.admin.internal_stats(topic).get("numberOfEntries", 0))


def cli(url: str, *args: str) -> subprocess.CompletedProcess:
    exe = os.path.join(os.path.dirname(sys.executable), "shadowtopic")
    return subprocess.run([exe, "--url", url, *args], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def test_policy_on_a_lagging_shadow_subscription_keeps_the_sources_ledgers(pair, topic,
                                                                           etcd_server):
    src, _ = pair
    shadow = f"{topic}-shadow"
    with Client(src.url) as c:
        c.admin.create_topic(topic, policies=Policies(**SMALL))
        # the CLI flag sets it, get-policies shows it (off by default)
        assert json.loads(cli(src.url, "topics", "get-policies", topic, "-o", "json").stdout
                          )["retention_keeps_shadow_backlog"] is False
        res = cli(src.url, "topics", "set-policies", topic,
                  "--retention-keeps-shadow-backlog", "true")
        assert res.returncode == 0, res.stderr
        assert json.loads(cli(src.url, "topics", "get-policies", topic, "-o", "json").stdout
                          )["retention_keeps_shadow_backlog"] is True
        res = cli(src.url, "topics", "set-policies", topic,
                  "--retention-keeps-shadow-backlog", "maybe")
        assert res.returncode == 1 and "not a boolean" in res.stderr

        c.admin.create_shadow_topic(shadow, topic)
        c.admin.create_subscription(shadow, "lagging", "earliest")
        first = wait_for(lambda: need(etcd_server, topic, shadow), what="the shadow's need")
        assert b":" in first  # ascii L:E
        with c.create_producer(topic) as p:
            ids = [p.send(f"m{i}".encode()) for i in range(N)]
        assert len({m.ledger_id for m in ids}) == 4
        time.sleep(3)  # six retention passes, a seal or more each
        assert entries(c, topic) == N  # nothing deleted: the shadow still needs it all
        with c.subscribe(shadow, "lagging") as cons:
            got = drain(cons, N, timeout=15)
            assert [(m.message_id.ledger_id, m.message_id.entry_id) for m in got] == \
                [(x.ledger_id, x.entry_id) for x in ids]
            sub = wait_for(lambda: c.admin.stats(shadow)["subscriptions"]["lagging"],
                           what="shadow stats")
            assert int(sub.get("skippedEntries", 0)) == 0
            # acknowledged: the need moves to the open ledger and retention deletes the rest
            last = ids[-1]
            wait_for(lambda: need(etcd_server, topic, shadow) ==
                     f"{last.ledger_id}:{last.entry_id + 1}".encode(), what="the need to move")
            wait_for(lambda: entries(c, topic) == N - 30, what="retention after the acks")
        # no durable subscription left: the need goes
        c.admin.delete_subscription(shadow, "lagging")
        wait_for(lambda: need(etcd_server, topic, shadow) is None, what="the need removed")


def test_policy_off_retention_deletes_and_the_shadow_cursor_skips(pair, topic, etcd_server):
    src, _ = pair
    shadow = f"{topic}-shadow"
    with Client(src.url) as c:
        c.admin.create_topic(topic, policies=Policies(**SMALL))
        assert c.admin.get_policies(topic).retention_keeps_shadow_backlog is False
        c.admin.create_shadow_topic(shadow, topic)
        c.admin.create_subscription(shadow, "lagging", "earliest")
        wait_for(lambda: need(etcd_server, topic, shadow), what="the shadow's need")
        with c.create_producer(topic) as p:
            ids = [p.send(f"m{i}".encode()) for i in range(N)]
        wait_for(lambda: entries(c, topic) == N - 30, what="retention")
        with c.subscribe(shadow, "lagging") as cons:
            got = drain(cons, N - 30, timeout=15)
            assert [(m.message_id.ledger_id, m.message_id.entry_id) for m in got] == \
                [(x.ledger_id, x.entry_id) for x in ids[30:]]
            sub = wait_for(lambda: c.admin.stats(shadow)["subscriptions"]["lagging"],
                           what="shadow stats")
            assert int(sub["skippedEntries"]) == 30


def test_turning_the_policy_on_later_keeps_from_then_on(pair, topic, etcd_server):
    src, _ = pair
    shadow = f"{topic}-shadow"
    with Client(src.url) as c:
        c.admin.create_topic(topic, policies=Policies(**SMALL))
        c.admin.create_shadow_topic(shadow, topic)
        c.admin.create_subscription(shadow, "lagging", "earliest")
        wait_for(lambda: need(etcd_server, topic, shadow), what="the shadow's need")
        with c.create_producer(topic) as p:
            for i in range(15):
                p.send(f"a{i}".encode())
            wait_for(lambda: entries(c, topic) == 5, what="retention while off")
            c.admin.set_policies(topic, Policies(retention_keeps_shadow_backlog=True))
            for i in range(20):
                p.send(f"b{i}".encode())
        time.sleep(2)
        assert entries(c, topic) == 25  # kept from the shadow's need on
        with c.subscribe(shadow, "lagging") as cons:
            got = drain(cons, 25, timeout=15)
            assert got[0].value() == "a10" and got[-1].value() == "b19"


def test_a_shadow_of_a_partitioned_source_publishes_partition_by_partition(pair, topic,
                                                                          etcd_server):
    src, _ = pair
    shadow = f"{topic}-shadow"
    with Client(src.url) as c:
        c.admin.create_topic(topic, partitions=2)
        c.admin.create_shadow_topic(shadow, topic)
        for i in range(2):
            c.admin.create_subscription(f"{shadow}-partition-{i}", "s", "earliest")
        for i in range(2):
            wait_for(lambda i=i: need(etcd_server, f"{topic}-partition-{i}",
                                      f"{shadow}-partition-{i}"), what=f"partition {i}'s need")
        assert need(etcd_server, topic, shadow) is None  # the parent has no ledgers


def test_a_shadow_deleted_through_the_source_broker_is_unloaded_by_the_shadow_broker(
        pair, topic, etcd_server):
    src, sh = pair
    shadow = f"{topic}-shadow"
    prefix = keys.topic_prefix(TopicName.parse(shadow))
    with Client(src.url) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(shadow, topic)
        cons = c.subscribe(shadow, "s", initial_position="earliest")
        assert c.admin.lookup(shadow)["brokerUrl"] == sh.url
        with c.create_producer(topic) as p:
            p.send(b"one")
        drain(cons, 1, timeout=15)
        wait_for(lambda: need(etcd_server, topic, shadow), what="the shadow's need")
        time.sleep(1.2)  # a cursor flush: the cursor pointer exists
        assert keys.cursors(TopicName.parse(shadow)) in etcd(etcd_server, prefix)
        with c.create_producer(topic) as p:  # acked, not yet flushed when it is deleted
            p.send(b"two")
        drain(cons, 1, timeout=15)
        c.admin.delete_shadow_topic(shadow)  # handled by the source broker
        with pytest.raises(errors.TopicNotFound):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                cons.receive(timeout=deadline - time.monotonic())
        time.sleep(3)  # flush intervals and need ticks: nothing comes back
        assert etcd(etcd_server, prefix) == {}
        assert need(etcd_server, topic, shadow) is None
        # the name is free again: a new shadow starts without the old subscription
        c.admin.create_shadow_topic(shadow, topic)
        assert c.admin.list_subscriptions(shadow) == []
        with c.subscribe(shadow, "s", initial_position="earliest") as again:
            assert [m.value() for m in drain(again, 2, timeout=15)] == ["one", "two"]
        cons.close()
