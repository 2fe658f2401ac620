"""Stats and last-message-id never take a topic: a topic another broker owns is answered by
that broker, a topic nobody owns from etcd (and the dead owner's WAL), and the broker asked
does not become the owner."""
from __future__ import annotations

from shadowtopic.client import Client


def test_stats_of_a_topic_owned_elsewhere_come_from_its_owner(two_brokers, topic):
    a, b = two_brokers
    with Client(a.url) as ca, Client(b.url) as cb:
        ca.admin.create_topic(topic)
        with ca.create_producer(topic) as p:
            last = [p.send(f"m{i}".encode()) for i in range(25)][-1]
        assert cb.admin.lookup(topic)["brokerUrl"] == a.url
        stats = cb.admin.stats(topic)
        assert stats["ownerBroker"] == a.url
        assert stats["msgInCounter"] == 25 and len(stats["publishers"]) == 0
        internal = cb.admin.internal_stats(topic)
        assert internal["numberOfEntries"] == 25 and internal["state"] == "LedgerOpened"
        assert cb.admin.last_message_id(topic) == last
        assert cb.admin.lookup(topic)["brokerUrl"] == a.url  # asking did not move it


def test_stats_of_a_topic_nobody_owns_come_from_etcd_without_taking_it(two_brokers, topic):
    a, b = two_brokers
    with Client(a.url) as ca:
        ca.admin.create_topic(topic)
        with ca.create_producer(topic) as p:
            for i in range(10):
                p.send(f"s{i}".encode())
            ca.admin.roll_ledger(topic)                 # one sealed ledger ...
            last = [p.send(f"o{i}".encode()) for i in range(7)][-1]  # ... and an open one
    a.terminate()                                       # releases ownership; WAL stays
    with Client(b.url) as cb:
        internal = cb.admin.internal_stats(topic)
        assert internal["state"] == "Unloaded"
        assert internal["numberOfEntries"] == 17
        assert internal["lastConfirmedEntry"] == f"{last.ledger_id}:{last.entry_id}"
        assert [led["state"] for led in internal["ledgers"]] == ["SEALED", "OPEN"]
        assert cb.admin.last_message_id(topic) == last
        stats = cb.admin.stats(topic)
        assert stats["ownerBroker"] == "" and stats["storageSize"] > 0
        assert cb.admin.internal_stats(topic)["state"] == "Unloaded"  # still nobody's
        with cb.create_reader(topic) as r:                # reading takes it, and sees all
            assert len(list(r)) == 17
        assert cb.admin.internal_stats(topic)["state"] == "LedgerOpened"
