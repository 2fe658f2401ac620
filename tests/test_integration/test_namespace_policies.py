"""Namespace policies against real broker processes, as a user drives them (client, CLI):
a namespace's message TTL and subscription expiry act on its topics that have no value of
their own, source and shadow alike, while a topic's own value wins; a change reaches topics
already loaded on every broker through each broker's watch of the namespaces; the CLI
round trip. Each test's `topic` is in a namespace of its own; every wait polls with a
bounded deadline."""
from __future__ import annotations

import json
import time

import pytest
from support.policy_broker import backlog, payload, sub_stats
from support.waiting import wait_for

from shadowtopic.client import Client, Policies, errors
from shadowtopic.core.names import TopicName
from shadowtopic.pb.v1 import admin_pb2 as apb


def namespace_of(topic: str) -> str:
    return TopicName.parse(topic).namespace_name


def test_namespace_ttl_acts_on_a_loaded_topic_without_its_own_and_a_topics_own_wins(
        quick_broker, topic):
    ns = namespace_of(topic)
    own = f"{topic}-own"
    with Client(quick_broker.url, timeout=20) as c:
        c.admin.create_topic(topic)
        c.admin.create_topic(own, policies=Policies(message_ttl_seconds=3600))
        for t in (topic, own):  # loaded (and old enough for a 2 s TTL) before the change
            c.admin.create_subscription(t, "abandoned", "earliest")
            with c.create_producer(t) as p:
                for i in range(5):
                    p.send(payload(i))
        assert c.admin.get_policies(topic).message_ttl_seconds == 0
        got = c.admin.set_namespace_policies(ns, Policies(message_ttl_seconds=2))
        assert got == Policies(message_ttl_seconds=2)
        assert c.admin.get_namespace_policies(ns) == got
        assert c.admin.get_policies(topic).message_ttl_seconds == 2
        assert c.admin.get_policies(own).message_ttl_seconds == 3600
        assert c.admin.get_topic(topic).policies.message_ttl_seconds == 2
        wait_for(lambda: backlog(c, topic, "abandoned") == 0, what="the namespace's TTL")
        assert int(sub_stats(c, topic, "abandoned")["msgExpired"]) == 5
        time.sleep(1.5)  # maintenance passes (twice a second) over both topics since
        assert backlog(c, own, "abandoned") == 5  # its own TTL (1 h) won
        # removed from the namespace: the default (no TTL) again
        assert c.admin.set_namespace_policies(ns, remove=["message_ttl_seconds"]) == Policies()
        assert c.admin.get_policies(topic).message_ttl_seconds == 0
        with c.create_producer(topic) as p:
            p.send(b"kept")
        assert backlog(c, topic, "abandoned") == 1


def test_namespace_ttl_and_expiry_on_a_source_and_its_shadow(start_pair, topic):
    src, _ = start_pair("--retention-interval", "0.5")
    ns = namespace_of(topic)
    shadow = f"{topic}-shadow"
    with Client(src.url, timeout=20) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(shadow, topic)
        c.admin.create_subscription(topic, "idle", "earliest")
        c.admin.create_subscription(shadow, "idle", "earliest")
        with c.subscribe(shadow, "kept", initial_position="earliest") as kept:
            with c.create_producer(topic) as p:
                for i in range(5):
                    p.send(payload(i))
            wait_for(lambda: backlog(c, shadow, "idle") == 5, what="the shadow to replicate")
            assert kept.receive(timeout=10).payload == payload(0)  # never acknowledged
            c.admin.set_namespace_policies(ns, Policies(message_ttl_seconds=2,
                                                        subscription_expiration_seconds=3))
            assert c.admin.get_policies(shadow).subscription_expiration_seconds == 3
            wait_for(lambda: backlog(c, shadow, "kept") == 0, what="TTL on the shadow")
            assert int(sub_stats(c, shadow, "kept")["msgExpired"]) == 5
            wait_for(lambda: "idle" not in c.admin.list_subscriptions(shadow),
                     what="the shadow's idle subscription to expire")
            wait_for(lambda: "idle" not in c.admin.list_subscriptions(topic),
                     what="the source's idle subscription to expire")
            assert "kept" in c.admin.list_subscriptions(shadow)  # it has a consumer


def refused_until(open_one, error: type, what: str):
    """Open (and close again) until the broker refuses with `error`: the policy reached it."""
    def attempt():
        try:
            open_one().close()
        except error as exc:
            return exc
        return None
    return wait_for(attempt, what=what)


def another_producer(url: str, topic: str) -> Client:
    """A producer on a connection of its own (one Produce stream is one producer to the
    broker) that sent one message: the client it is on (close it)."""
    c = Client(url, timeout=20)
    try:
        c.create_producer(topic).send(b"another")
    except BaseException:
        c.close()
        raise
    return c


def test_a_namespace_change_reaches_loaded_topics_through_each_brokers_watch(start_pair,
                                                                             topic):
    # maintenance (which also reads policies) runs once a minute here: only the watches act
    src, sh = start_pair()
    ns = namespace_of(topic)
    shadow = f"{topic}-shadow"
    with Client(src.url, timeout=20) as via_src, Client(sh.url, timeout=20) as via_sh:
        via_src.admin.create_topic(topic)
        via_src.admin.create_shadow_topic(shadow, topic)
        with via_src.create_producer(topic) as p, \
                via_src.subscribe(shadow, "s", "shared", initial_position="earliest") as cons:
            p.send(b"one")
            assert cons.receive(timeout=10).payload == b"one"
            # set through the shadow broker: the source broker hears it from etcd
            via_sh.admin.set_namespace_policies(ns, Policies(max_producers=1))
            exc = refused_until(lambda: another_producer(src.url, topic),
                                errors.TooManyProducers, "the source broker to hear of it")
            assert "max_producers 1" in exc.message
            # set through the source broker: the shadow broker hears it from etcd
            via_src.admin.set_namespace_policies(ns, Policies(max_consumers=1))
            refused_until(lambda: via_src.subscribe(shadow, "s", "shared"),
                          errors.TooManyConsumers, "the shadow broker to hear of it")
            assert via_sh.admin.get_policies(shadow).max_consumers == 1
            # a topic's own value wins over the namespace's
            via_src.admin.set_policies(topic, Policies(max_producers=2))
            another_producer(src.url, topic).close()
            # removed from the namespace: the shadow takes a second consumer again
            via_src.admin.set_namespace_policies(ns, remove=["max_consumers"])

            def second_consumer() -> bool:
                try:
                    via_src.subscribe(shadow, "s", "shared").close()
                except errors.TooManyConsumers:
                    return False
                return True
            wait_for(second_consumer, what="the removal to reach the shadow broker")
            p.send(b"three")


def test_cli_round_trip_and_bad_input(broker, cli, topic):
    ns = namespace_of(topic)
    assert cli("topics", "create", topic).returncode == 0
    res = cli("namespaces", "set-policies", ns, "--message-ttl", "1h", "--max-producers", "3",
              "--backlog-quota-action", "producer_exception", "-o", "json")
    assert res.returncode == 0, res.stderr
    want = {"message_ttl_seconds": 3600, "max_producers": 3,
            "backlog_quota_action": "producer_exception"}
    assert json.loads(res.stdout) == want
    shown = cli("namespaces", "get-policies", ns, "-o", "json")
    assert shown.returncode == 0 and json.loads(shown.stdout) == want
    eff = json.loads(cli("topics", "get-policies", topic, "-o", "json").stdout)
    assert eff["message_ttl_seconds"] == 3600 and eff["max_producers"] == 3
    assert eff["ledger_max_entries"] == 200_000  # the rest: defaults
    res = cli("namespaces", "set-policies", ns, "--remove", "message-ttl",
              "--remove", "backlog_quota_action", "-o", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"max_producers": 3}
    table = cli("namespaces", "get-policies", ns)
    assert table.returncode == 0 and "max_producers" in table.stdout
    assert "message_ttl" not in table.stdout
    for args, says in [
            (["namespaces", "get-policies", "no-slash"], "tenant/namespace"),
            (["namespaces", "set-policies", "a/b/c", "--max-producers", "1"],
             "tenant/namespace"),
            (["namespaces", "set-policies", ns], "at least one policy flag"),
            (["namespaces", "set-policies", ns, "--remove", "nope"], "no such policy"),
            (["namespaces", "set-policies", ns, "--message-ttl", "-5"], "")]:
        res = cli(*args)
        assert res.returncode == 1, (args, res.stdout)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), (args, res.stderr)
        assert says in lines[0], (args, lines[0])
    assert json.loads(cli("namespaces", "get-policies", ns, "-o", "json").stdout) == \
        {"max_producers": 3}


def test_admin_api_refuses_bad_namespaces_and_fields(client):
    with pytest.raises(errors.InvalidTopicName, match="tenant/namespace"):
        client.admin.get_namespace_policies("just-one")
    with pytest.raises(errors.InvalidPolicies, match="no such policy"):
        client.admin.set_namespace_policies("public/x", remove=["ttl"])
    # past the client's own checks: the broker says the same (one error table)
    stub = client.admin._stub
    with pytest.raises(Exception) as info:
        client.admin._call(stub.SetNamespacePolicies, apb.SetNamespacePoliciesRequest(
            namespace="public/x", remove=["ttl"]))
    assert isinstance(info.value, errors.InvalidPolicies), info.value
    with pytest.raises(errors.InvalidTopicName):
        client.admin._call(stub.GetNamespacePolicies, apb.NamespaceRequest(namespace="a/b/c"))
