"""Durable subscriptions against a real broker and etcd, driven through the client as a user
does (docs/BEHAVIOURS.md C1-C7, retention honouring cursors)."""
from __future__ import annotations

import threading
import time

import pytest
from support.produce import produce, send_pipelined
from support.waiting import drain, nothing_more, wait_cursors_saved, wait_for

from shadowtopic.client import Client, MessageId, Policies
from shadowtopic.core import errors


def sub_stats(client: Client, topic: str, sub: str) -> dict:
    return client.admin.stats(topic)["subscriptions"][sub]


# ---- C1: the four types ----------------------------------------------------------------------

def test_c1_exclusive_refuses_a_second_consumer(broker, client, topic):
    client.admin.create_topic(topic)
    with client.subscribe(topic, "s", "exclusive") as c:
        with Client(broker.url) as other:
            with pytest.raises(errors.ConsumerBusy):
                other.subscribe(topic, "s", "exclusive")
            with pytest.raises(errors.ConsumerBusy):
                other.subscribe(topic, "s", "shared")
        produce(client, topic, 3)
        assert [m.value() for m in drain(c, 3)] == ["m0", "m1", "m2"]


def test_c1_failover_promotes_the_standby(broker, client, topic):
    client.admin.create_topic(topic)
    with Client(broker.url) as ca, Client(broker.url) as cb:
        a = ca.subscribe(topic, "f", "failover", consumer_name="a")
        b = cb.subscribe(topic, "f", "failover", consumer_name="b")
        wait_for(lambda: a.is_active is True and b.is_active is False, 10, "a active")
        produce(client, topic, 10)
        got = drain(a, 4)  # acked 0..3; 4..9 delivered to a and never acked
        assert [m.value() for m in got] == [f"m{i}" for i in range(4)]
        assert nothing_more(b, 0.3)
        a.close()
        wait_for(lambda: b.is_active is True, 10, "b promoted")
        rest = drain(b, 6)
        assert [m.value() for m in rest] == [f"m{i}" for i in range(4, 10)]
        assert all(m.redelivery_count == 1 for m in rest)  # a had been sent them all


def test_c1_shared_spreads_and_key_shared_keeps_keys(broker, client, topic):
    client.admin.create_topic(topic)
    with Client(broker.url) as c1, Client(broker.url) as c2:
        s1 = c1.subscribe(topic, "sh", "shared", receiver_queue_size=10)
        s2 = c2.subscribe(topic, "sh", "shared", receiver_queue_size=10)
        k1 = c1.subscribe(topic, "ks", "key_shared", consumer_name="k1")
        k2 = c2.subscribe(topic, "ks", "key_shared", consumer_name="k2")
        produce(client, topic, 200, keys=20)
        got1, got2 = [], []
        deadline = time.monotonic() + 20
        while len(got1) + len(got2) < 200 and time.monotonic() < deadline:
            for cons, into in ((s1, got1), (s2, got2)):
                for m in cons.batch_receive(50, timeout=0.05):
                    cons.acknowledge(m)
                    into.append(m.value())
        assert got1 and got2 and not set(got1) & set(got2)
        assert sorted(got1 + got2) == sorted(f"m{i}" for i in range(200))
        owners: dict[bytes, str] = {}
        total = 0
        deadline = time.monotonic() + 20
        while total < 200 and time.monotonic() < deadline:
            for cons, name in ((k1, "k1"), (k2, "k2")):
                for m in cons.batch_receive(50, timeout=0.05):
                    cons.acknowledge(m)
                    assert owners.setdefault(m.key, name) == name, "a key moved"
                    total += 1
        assert total == 200 and set(owners.values()) == {"k1", "k2"}
        ranges = [c["keyHashRanges"] for c in sub_stats(client, topic, "ks")["consumers"]]
        assert len(ranges) == 2 and all(ranges)


# ---- C2: initial positions and readers from an id -------------------------------------------

def test_c2_initial_positions_and_reader_from_an_id(broker, client, topic):
    client.admin.create_topic(topic)
    ids = produce(client, topic, 5)
    with client.subscribe(topic, "early", initial_position="earliest") as e, \
            client.subscribe(topic, "late") as late:       # Pulsar's default: latest
        produce(client, topic, 1, prefix="new")
        assert [m.value() for m in drain(e, 6)] == [f"m{i}" for i in range(5)] + ["new0"]
        assert [m.value() for m in drain(late, 1)] == ["new0"]
        assert nothing_more(late, 0.3)
    with client.create_reader(topic, start=ids[2], inclusive=True) as r:
        assert r.read_next(10).value() == "m2"
    with client.create_reader(topic, start=ids[2]) as r:
        assert r.read_next(10).value() == "m3"
        landed = r.seek(ids[0])
        assert landed.message_id.entry_id == ids[0].entry_id and not landed.clamped
        assert r.read_next(10).value() == "m0"


# ---- C3: acks, nacks, redelivery -------------------------------------------------------------

def test_c3_individual_cumulative_and_negative_acks(broker, client, topic):
    client.admin.create_topic(topic)
    with client.subscribe(topic, "sh", "shared", initial_position="earliest",
                          negative_ack_redelivery_delay_ms=200) as sh:
        produce(client, topic, 4)
        got = drain(sh, 4, ack=False)
        with pytest.raises(errors.NotAllowed):
            sh.acknowledge_cumulative(got[-1])
        sh.acknowledge(got[0])
        sh.acknowledge(got[1])
        sh.negative_acknowledge(got[2])
        again = drain(sh, 1, timeout=10)
        assert again[0].message_id == got[2].message_id and again[0].redelivery_count == 1
        sh.acknowledge(got[3])
        wait_for(lambda: sub_stats(client, topic, "sh")["msgBacklog"] == 0, 10, "backlog 0")
    with client.subscribe(topic, "ex", initial_position="earliest") as ex:
        got = drain(ex, 4, ack=False)
        ex.acknowledge_cumulative(got[2])
        wait_for(lambda: sub_stats(client, topic, "ex")["msgBacklog"] == 1, 10, "backlog 1")


def test_c3_a_dead_consumers_unacked_messages_go_to_another_with_a_count(broker, client, topic):
    client.admin.create_topic(topic)
    with Client(broker.url) as doomed:
        d = doomed.subscribe(topic, "sh", "shared", initial_position="earliest",
                             receiver_queue_size=100)
        produce(client, topic, 20)
        got = drain(d, 20, ack=False)
        for m in got[:5]:
            d.acknowledge(m)
        live = client.subscribe(topic, "sh", "shared")
        time.sleep(0.3)  # the acks reach the broker before the stream dies
    again = drain(live, 15)
    assert sorted(m.value() for m in again) == sorted(m.value() for m in got[5:])
    assert all(m.redelivery_count == 1 for m in again)
    # acks are fire-and-forget: the backlog reaches 0 once the broker has them all
    wait_for(lambda: sub_stats(client, topic, "sh")["msgBacklog"] == 0, 10, "backlog 0")


@pytest.mark.parametrize("type_", ["exclusive", "failover"])
def test_c3a_one_nack_counts_only_the_nacked_message_not_the_receiver_queue(
        client, topic, type_):
    """The 26-message case: 50 messages sit in a receiver queue of 1,000; the application
    received one and nacks it. Everything comes again from the first unacknowledged one (the
    order of an Exclusive subscription), and only the nacked message has redelivery_count 1:
    the others never reached the application, or did and were not given back."""
    client.admin.create_topic(topic)
    with client.subscribe(topic, "s", type_, initial_position="earliest",
                          receiver_queue_size=1000,
                          negative_ack_redelivery_delay_ms=100) as c:
        ids = produce(client, topic, 50)
        first = c.receive(timeout=10)
        assert first.message_id == ids[0]
        c.negative_acknowledge(first)
        before = []                     # what came before the rewind reached the client
        for _ in range(60):
            m = c.receive(timeout=10)
            if m.message_id == ids[0]:
                break
            before.append(m)
        assert m.message_id == ids[0] and m.redelivery_count == 1
        after = [c.receive(timeout=10) for _ in range(49)]
        assert [x.message_id for x in after] == ids[1:]
        assert [x.redelivery_count for x in before + after] == [0] * (len(before) + 49)
        c.acknowledge_cumulative(after[-1])
        assert nothing_more(c, 0.5)
        wait_for(lambda: sub_stats(client, topic, "s")["msgBacklog"] == 0, 10, "backlog 0")


# ---- C4 / C6: restart, exact backlogs --------------------------------------------------------

@pytest.mark.own_broker
def test_c4_c6_kill_9_resumes_at_the_last_persisted_cursor_with_exact_backlogs(
        broker, client, topic):
    client.admin.create_topic(topic, policies=Policies(ledger_max_entries=7))
    ids = produce(client, topic, 30)
    acked = {0, 1, 2, 3, 9, 10, 17, 25}
    with client.subscribe(topic, "s", initial_position="earliest") as c:
        got = drain(c, 30, ack=False)
        for i in sorted(acked):
            c.acknowledge(got[i])
        wait_for(lambda: sub_stats(client, topic, "s")["msgBacklog"] == 22, 10, "backlog 22")
        wait_cursors_saved(client, topic)
    broker.kill()
    broker.start(timeout=60)
    with Client(broker.url) as again:
        assert sub_stats(again, topic, "s")["msgBacklog"] == 22
        with again.subscribe(topic, "s") as c:
            got = drain(c, 22, ack=False)
            assert [m.message_id for m in got] == [m for i, m in enumerate(ids) if i not in acked]
            assert nothing_more(c, 0.3)
            c.acknowledge_cumulative(got[10])
            want = sum(1 for i in range(30) if i not in acked and ids[i] > got[10].message_id)
            wait_for(lambda: sub_stats(again, topic, "s")["msgBacklog"] == want,
                     timeout=10, what="backlog after cumulative ack")


# ---- C5: seek and reset ---------------------------------------------------------------------

def test_c5_seek_and_reset_cursor_by_id_and_time_clamp_and_tell_consumers(broker, client, topic):
    client.admin.create_topic(topic)
    ids = produce(client, topic, 5)
    time.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    ids += produce(client, topic, 5, prefix="late")
    with client.subscribe(topic, "s", initial_position="earliest") as c:
        drain(c, 10)
        pos, clamped = c.seek(ids[3])
        assert pos.entry_id == ids[3].entry_id and not clamped
        assert [m.value() for m in drain(c, 7)][:2] == ["m3", "m4"]
        pos, clamped = c.seek(middle_ms)
        assert not clamped and drain(c, 1)[0].value() == "late0"
        drain(c, 4)
        pos, clamped = client.admin.reset_cursor(topic, "s", MessageId(10**6, 0))
        assert clamped
        pos, clamped = client.admin.reset_cursor(topic, "s", MessageId(0, 0), dry_run=True)
        assert clamped and sub_stats(client, topic, "s")["msgBacklog"] == 0  # dry run
        pos, clamped = client.admin.reset_cursor(topic, "s", ids[1])
        assert not clamped
        assert [m.value() for m in drain(c, 9)][0] == "m1"   # the attached consumer follows
        # acks are fire-and-forget: the broker counts them a moment later
        wait_for(lambda: sub_stats(client, topic, "s")["msgBacklog"] == 0, 10, "backlog 0")


def test_c6_admin_skip_clear_peek_and_dry_run(broker, client, topic):
    client.admin.create_topic(topic)
    client.admin.create_subscription(topic, "s", start="earliest")
    with pytest.raises(errors.SubscriptionAlreadyExists):
        client.admin.create_subscription(topic, "s")
    produce(client, topic, 10)
    assert client.admin.list_subscriptions(topic) == ["s"]
    assert [m.value() for m in client.admin.peek_messages(topic, "s", 2)] == ["m0", "m1"]
    ch = client.admin.skip(topic, "s", 3, dry_run=True)
    assert ch["entriesAcked"] == 3 and ch["msgBacklog"] == 7
    assert sub_stats(client, topic, "s")["msgBacklog"] == 10
    client.admin.skip(topic, "s", 3)
    assert sub_stats(client, topic, "s")["msgBacklog"] == 7
    assert client.admin.peek_messages(topic, "s", 1)[0].value() == "m3"
    client.admin.clear_backlog(topic, "s")
    assert sub_stats(client, topic, "s")["msgBacklog"] == 0
    with client.subscribe(topic, "s") as c:
        with pytest.raises(errors.ConsumerBusy):
            client.admin.delete_subscription(topic, "s")
        with pytest.raises(errors.NotAllowed):
            client.admin.delete_topic(topic)
        assert client.admin.delete_subscription(topic, "s", force=True,
                                                dry_run=True)["consumers"] == 1
        client.admin.delete_subscription(topic, "s", force=True)
        with pytest.raises(errors.SubscriptionNotFound):
            c.receive(timeout=5)
    assert client.admin.list_subscriptions(topic) == []


def test_limits_and_forced_topic_delete(broker, client, topic):
    client.admin.create_topic(topic, policies=Policies(max_subscriptions=1, max_consumers=1))
    c = client.subscribe(topic, "a", "shared")
    with pytest.raises(errors.TooManySubscriptions):
        client.subscribe(topic, "b")
    with pytest.raises(errors.TooManyConsumers):
        client.subscribe(topic, "a", "shared")
    with pytest.raises(errors.NotAllowed):
        client.admin.delete_topic(topic)
    client.admin.delete_topic(topic, force=True)
    with pytest.raises(errors.TopicNotFound):
        c.receive(timeout=5)


# ---- C7: a stalled subscription does not hold up the others ---------------------------------

def test_c7_a_stalled_subscription_does_not_slow_the_others(broker, client, topic):
    client.admin.create_topic(topic)
    stalled = client.subscribe(topic, "stalled", receiver_queue_size=100)  # never receives
    with Client(broker.url) as other:
        live = other.subscribe(topic, "live", receiver_queue_size=1000)
        done = threading.Event()
        got: list = []

        def consume():
            got.extend(drain(live, 5000, timeout=60))
            done.set()

        t = threading.Thread(target=consume)
        t.start()
        with client.create_producer(topic) as p:  # batched: 5,000 sends one at a time
            send_pipelined(p, [f"m{i}".encode() for i in range(5000)])  # took 10-30 s
        assert done.wait(60)
        t.join()
        assert [m.value() for m in got] == [f"m{i}" for i in range(5000)]
        s = sub_stats(client, topic, "stalled")
        assert s["msgBacklog"] == 5000
        assert s["consumers"][0]["unackedMessages"] <= 100 + 500  # bounded by its permits
    stalled.close()


# ---- retention honours cursors ---------------------------------------------------------------

def test_retention_keeps_an_unacknowledged_ledger_until_it_is_acked(etcd_server, tmp_path, topic):
    from shadowtopic.broker.server import free_port
    from shadowtopic.standalone import BrokerProcess
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "data"), free_port(),
                      extra_args=["--lease-ttl", "3", "--retention-interval", "0.3"])
    b.start(timeout=60)
    try:
        with Client(b.url) as client:
            client.admin.create_topic(topic, policies=Policies(ledger_max_entries=5,
                                                               retention_time_seconds=0))
            c = client.subscribe(topic, "s", initial_position="earliest")
            produce(client, topic, 12)          # ledgers of 5, 5 and an open one
            client.admin.roll_ledger(topic)

            def ledgers():
                return len(client.admin.internal_stats(topic)["ledgers"])
            time.sleep(1.0)
            kept = ledgers()
            assert kept >= 3   # nothing acknowledged: every sealed ledger stays
            got = drain(c, 12, ack=False)
            for m in got[:5]:
                c.acknowledge(m)   # the first ledger is acknowledged
            wait_for(lambda: ledgers() == kept - 1, 10, "first ledger deleted")
            for m in got[5:]:
                c.acknowledge(m)
            wait_for(lambda: ledgers() <= 1, 10, "every acked sealed ledger deleted")
            wait_for(lambda: sub_stats(client, topic, "s")["msgBacklog"] == 0,
                     timeout=10, what="backlog 0")
    finally:
        b.kill()


def test_c3_exclusive_nack_rewinds_to_the_first_unacked_without_duplicates(broker, client,
                                                                           topic):
    client.admin.create_topic(topic)
    with client.subscribe(topic, "ex", initial_position="earliest",
                          negative_ack_redelivery_delay_ms=200) as c:
        produce(client, topic, 5)
        got = drain(c, 3, ack=False)       # m3, m4 sit in the client's buffer
        c.acknowledge(got[0])
        c.negative_acknowledge(got[1])
        time.sleep(0.6)                    # the broker rewinds; the buffer is dropped
        again = drain(c, 4)
        assert [m.value() for m in again] == ["m1", "m2", "m3", "m4"]
        assert [m.redelivery_count for m in again] == [1, 0, 0, 0]  # only the nacked (C3a)
        assert nothing_more(c, 0.5)
        wait_for(lambda: sub_stats(client, topic, "ex")["msgBacklog"] == 0, 10, "backlog 0")


def test_internal_stats_show_each_cursor_as_pulsar_prints_it(broker, client, topic):
    client.admin.create_topic(topic)
    ids = produce(client, topic, 6)
    with client.subscribe(topic, "s", initial_position="earliest") as c:
        drain(c, 6, ack=False)
        for i in (0, 2, 3):
            c.acknowledge(ids[i])
        lid = ids[0].ledger_id

        def cursor():
            return client.admin.internal_stats(topic)["cursors"].get("s", {})
        wait_for(lambda: cursor().get("individuallyDeletedMessages") ==
                 f"[({lid}:1..{lid}:3]]", 10, "acked range shown")
        cur = cursor()
        assert cur["markDeletePosition"] == f"{lid}:0"
        assert cur["readPosition"] == f"{lid}:6" and cur["messagesConsumedCounter"] == 6
        wait_for(lambda: cursor()["cursorFlushes"] >= 1, 10, "a cursor flush")
