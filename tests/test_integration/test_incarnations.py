"""A topic deleted and created again under the same name is a new incarnation (issue 18,
item 4): once the create returns, no broker serves the old one. Each incarnation has a
generation (its info key's etcd create revision); a broker checks it when it loads a topic
and whenever a producer, consumer, reader or admin call opens it, and every cursor or
subscription write of a loaded topic holds only while its generation stands.

The shadow broker here hears etcd's watch events 3 s late (the `metadata.watch.events`
failpoint): it learns of the delete only after the new incarnation exists, as a busy broker
does under load."""
from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
from support.waiting import drain, nothing_more

from shadowtopic import failpoints
from shadowtopic.broker.server import free_port
from shadowtopic.client import Client, errors
from shadowtopic.standalone import BrokerProcess


@pytest.fixture
def late_pair(etcd_server, tmp_path):
    """(source broker, shadow broker whose watch events arrive 3 s late)."""
    shared = str(tmp_path / "shared-storage")
    args = ["--lease-ttl", "3", "--storage-root", shared,
            "--cluster", f"c-{uuid.uuid4().hex[:8]}"]
    src = BrokerProcess(etcd_server.endpoint, str(tmp_path / "src"), free_port(),
                        extra_args=args)
    sh = BrokerProcess(etcd_server.endpoint, str(tmp_path / "sh"), free_port(),
                       extra_args=args, module="shadowtopic.shadow.broker",
                       env=failpoints.env({"metadata.watch.events": "sleep(3)"}))
    try:
        src.start(timeout=60)
        sh.start(timeout=60)
        yield src, sh
    finally:
        for b in (src, sh):
            if b.proc is not None and b.proc.poll() is None:
                os.kill(b.proc.pid, signal.SIGCONT)
            b.kill()


def test_a_shadow_deleted_and_created_again_serves_only_its_new_incarnation(late_pair, topic):
    src, _ = late_pair
    shadow = f"{topic}-shadow"
    with Client(src.url) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(shadow, topic)
        with c.create_producer(topic) as p:
            first = [p.send(f"a{i}".encode()) for i in range(5)]
        with c.subscribe(shadow, "old", initial_position="earliest") as cons:
            assert [m.message_id for m in drain(cons, 5)] == first
        c.admin.delete_shadow_topic(shadow)
        c.admin.create_shadow_topic(shadow, topic)
        # at once, while the shadow broker has not yet heard of the delete
        with c.subscribe(shadow, "new", initial_position="earliest") as cons:
            with c.create_producer(topic) as p:
                more = [p.send(f"b{i}".encode()) for i in range(5)]
            got = drain(cons, 10, timeout=20)
            assert [m.message_id for m in got] == first + more
            time.sleep(4)  # the late delete event arrives meanwhile: it must not close us
            with c.create_producer(topic) as p:
                last = p.send(b"c")
            assert drain(cons, 1)[0].message_id == last
            assert nothing_more(cons)
            assert c.admin.list_subscriptions(shadow) == ["new"]


def test_the_old_incarnations_subscriptions_are_not_listed_by_the_new(late_pair, topic):
    src, _ = late_pair
    shadow = f"{topic}-shadow"
    with Client(src.url) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(shadow, topic)
        with c.create_producer(topic) as p:
            for i in range(3):
                p.send(f"a{i}".encode())
        with c.subscribe(shadow, "old", initial_position="earliest") as cons:
            drain(cons, 3, ack=False)  # the old incarnation is loaded on the shadow broker
        c.admin.delete_shadow_topic(shadow)
        c.admin.create_shadow_topic(shadow, topic)
        assert c.admin.list_subscriptions(shadow) == []
        with c.subscribe(shadow, "new", initial_position="earliest") as cons:
            assert len(drain(cons, 3)) == 3
        time.sleep(4)  # past the late delete event and a cursor flush of the old incarnation
        assert c.admin.list_subscriptions(shadow) == ["new"]


def test_a_topic_deleted_through_another_broker_is_retired_where_it_is_loaded(two_brokers,
                                                                             topic):
    """The consumers of a topic loaded on broker a hear that it was deleted through broker b
    (a follows the topic's info key), and a subscription of the same name after it is
    created again reads only the new incarnation. (A client stays with the source broker
    it names: b serves the new incarnation.)"""
    a, b = two_brokers
    with Client(a.url) as ca, Client(b.url) as cb:
        ca.admin.create_topic(topic)
        with ca.create_producer(topic) as p:
            p.send(b"old")
        cons = ca.subscribe(topic, "s", initial_position="earliest")
        try:
            assert cons.receive(timeout=10).payload == b"old"
            assert ca.admin.lookup(topic)["brokerUrl"] == a.url
            cb.admin.delete_topic(topic, force=True)
            with pytest.raises(errors.TopicNotFound, match="was deleted"):
                cons.receive(timeout=10)
        finally:
            cons.close()
        cb.admin.create_topic(topic)
        with cb.create_producer(topic) as p:
            new = p.send(b"new")
        with cb.subscribe(topic, "s", initial_position="earliest") as cons:
            m = cons.receive(timeout=10)
            assert (m.payload, m.message_id) == (b"new", new)
            assert nothing_more(cons)
