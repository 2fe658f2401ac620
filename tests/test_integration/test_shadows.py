"""Shadow topics end to end (docs/BEHAVIOURS.md R1-R9, C8, S7): a source broker and a shadow broker
(`python -m shadowtopic.shadow.broker`) on one shared storage root and the session's etcd. Users
name any broker (here always the source broker's URL): the client looks the shadow up and talks
to the shadow broker."""
from __future__ import annotations

import os
import queue
import time

import grpc
import pytest
from support.waiting import drain, nothing_more, wait_for

from shadowtopic.client import Client, Policies, errors
from shadowtopic.core.names import canonical
from shadowtopic.pb.v1 import common_pb2, replication_pb2


@pytest.fixture
def pair(start_pair):
    """(source broker, shadow broker) of this test alone: see conftest's `start_pair`."""
    return start_pair()


@pytest.fixture(scope="module")
def shared_pair(start_module_pair):
    """(source broker, shadow broker) shared by this module's tests that stop neither and
    look at no storage as a whole."""
    return start_module_pair()


def files(root: str) -> dict[str, int]:
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            if n.startswith(".disk-probe-"):  # a broker's write probe (source/ledger/disk.py)
                continue
            p = os.path.join(d, n)
            out[os.path.relpath(p, root)] = os.path.getsize(p)
    return out


def fields(m) -> tuple:
    return (m.message_id, m.key, m.payload, dict(m.properties), m.publish_time, m.event_time)


def test_r1_r3_a_shadow_delivers_the_sources_messages_with_the_same_ids(pair, topic):
    src, sh = pair
    root = os.path.dirname(src.data_dir) + "/shared-storage"
    with Client(src.url) as c:
        c.admin.create_topic(topic, policies=Policies(ledger_max_entries=40))
        with c.create_producer(topic) as p:
            for i in range(100):  # history before the shadow exists (sealed + open ledgers)
                p.send_async(f"m{i}".encode(), key=f"k{i % 7}", properties={"i": str(i)},
                             event_time=1_000 + i)
            p.flush()
        before = files(root)
        c.admin.create_shadow_topic(f"{topic}-shadow", topic)
        assert files(root) == before  # S7: creating a shadow writes no ledger file
        with c.create_reader(topic, start="earliest") as r:
            want = [fields(r.read_next(timeout=10)) for _ in range(100)]
        with c.subscribe(f"{topic}-shadow", "s", initial_position="earliest") as cons:
            got = drain(cons, 100, timeout=15)
            assert [fields(m)[1:] for m in got] == [w[1:] for w in want]
            assert [(m.message_id.ledger_id, m.message_id.entry_id) for m in got] == \
                [(w[0].ledger_id, w[0].entry_id) for w in want]
            # live messages follow, with their ids
            with c.create_producer(topic) as p:
                live = [p.send(f"live{i}".encode(), key="k") for i in range(20)]
            got = drain(cons, 20, timeout=15)
            assert [(m.message_id.ledger_id, m.message_id.entry_id) for m in got] == \
                [(x.ledger_id, x.entry_id) for x in live]
            assert nothing_more(cons)
        # the shadow owns no ledger file (its subscriptions' cursors are its own)
        assert not [f for f in files(root) if "shadow" in f and not f.startswith("cursors/")]


def test_r2_two_shadows_and_the_source_each_get_every_message(shared_pair, topic):
    src, _ = shared_pair
    with Client(src.url) as c:
        c.admin.create_topic(topic)
        for s in ("a", "b"):
            c.admin.create_shadow_topic(f"{topic}-{s}", topic)
        consumers = [c.subscribe(t, "same-name", initial_position="earliest")
                     for t in (topic, f"{topic}-a", f"{topic}-b")]
        with c.create_producer(topic) as p:
            ids = [p.send(f"m{i}".encode()) for i in range(50)]
        for cons in consumers:
            got = drain(cons, 50, timeout=15)
            assert [(m.message_id.ledger_id, m.message_id.entry_id) for m in got] == \
                [(x.ledger_id, x.entry_id) for x in ids]
            assert nothing_more(cons, 0.3)
        stats = c.admin.stats(topic)["shadowReplication"]
        assert set(stats) == {f"{topic}-a", f"{topic}-b"}
        for name, st in stats.items():  # R8
            assert st["connected"] is True, (name, st)
            assert int(st.get("replicationBacklog", 0)) == 0
            assert st["replicatedPosition"] == f"{ids[-1].ledger_id}:{ids[-1].entry_id}"
            assert int(st["msgOutCounter"]) >= 50
        for cons in consumers:
            cons.close()


def test_r6_the_shadow_broker_killed_and_restarted_catches_up(pair, topic):
    src, sh = pair
    with Client(src.url) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(f"{topic}-shadow", topic)
        cons = c.subscribe(f"{topic}-shadow", "s", initial_position="earliest")
        with c.create_producer(topic) as p:
            first = [p.send(f"a{i}".encode()) for i in range(10)]
        drain(cons, 10, timeout=15)
        time.sleep(1.5)  # its cursor is flushed
        sh.kill()
        with c.create_producer(topic) as p:
            meanwhile = [p.send(f"b{i}".encode()) for i in range(10)]
        wait_for(lambda: not c.admin.stats(topic)["shadowReplication"][f"{topic}-shadow"]
                 .get("connected"), what="the replicator to see the shadow broker gone")
        sh.start(timeout=60)
    with Client(src.url) as c:
        cons = c.subscribe(f"{topic}-shadow", "s")
        got = drain(cons, 10, timeout=15)
        assert [m.message_id.entry_id for m in got] == [x.entry_id for x in meanwhile]
        with c.create_producer(topic) as p:
            after = p.send(b"after")
        assert drain(cons, 1, timeout=15)[0].message_id.entry_id == after.entry_id
        assert nothing_more(cons)
        assert first  # (used above)


def test_r6_while_the_shadow_broker_is_away_its_shadows_answer_a_retriable_error(pair, topic):
    """A shadow whose broker is down (killed; its lease expired) is away for now, not
    missing: a read asked of the source broker answers `ServiceUnavailable` (retriable), not
    `NotAllowed`; once the shadow broker is back the same read works."""
    src, sh = pair
    shadow = f"{topic}-shadow"
    with Client(src.url, timeout=10, operation_timeout=3) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(shadow, topic)
        with c.create_producer(topic) as p:
            p.send(b"m")
        with c.create_reader(shadow, start="earliest") as r:  # the shadow broker serves it
            assert r.read_next(timeout=10).payload == b"m"
        sh.kill()
        # while it is away, calls that retry a retriable error give up after 1 s (3 s each
        # added up to most of this test's time)
        with Client(src.url, timeout=10, operation_timeout=1) as away:

            def ownership_expired() -> bool:
                try:
                    return away.admin.lookup(shadow).get("brokerUrl") != sh.url
                except errors.ServiceUnavailable:  # no shadow broker registered any more
                    return True
            wait_for(ownership_expired, timeout=20,
                     what="the shadow broker's ownership to expire")
            with pytest.raises(errors.ShadowTopicError) as exc:
                with away.create_reader(shadow, start="earliest") as r:
                    r.read_next(timeout=5)
        assert exc.value.retriable and isinstance(exc.value, errors.ServiceUnavailable), \
            repr(exc.value)
        sh.start(timeout=60)
        with c.create_reader(shadow, start="earliest") as r:
            assert r.read_next(timeout=10).payload == b"m"


def test_f11_a_shadow_that_cannot_follow_its_source_says_so_in_its_stats(pair, topic):
    """A shadow's stats carry its incoming replication under its source's name: connected
    while its source's replicator streams to it; after the source broker is killed, not
    connected (and for how long), never a silent "caught up"; connected again, at the
    source's newest id, once the source is back."""
    src, sh = pair
    shadow = f"{topic}-shadow"

    def inbound(c: Client) -> dict:
        return c.admin.stats(shadow).get("shadowReplication", {}).get(topic, {})

    with Client(src.url, timeout=10) as c, Client(sh.url, timeout=10) as at_shadow:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(shadow, topic)
        with c.create_producer(topic) as p:
            first = p.send(b"m")
        with c.create_reader(shadow, start="earliest") as r:  # the shadow broker serves it
            assert r.read_next(timeout=10).message_id == first
        wait_for(lambda: inbound(at_shadow).get("connected"), what="the shadow to say connected")
        assert inbound(at_shadow)["replicatedPosition"] == f"{first.ledger_id}:{first.entry_id}"
        src.kill()
        st = wait_for(lambda: (d := inbound(at_shadow)) and not d.get("connected") and d,
                      what="the shadow to say it is not connected")
        assert st.get("replicationDelayInSeconds", 0) >= 0
        src.start(timeout=60)
        with Client(src.url, timeout=10) as c2, c2.create_producer(topic) as p:
            second = p.send(b"n")
        at = f"{second.ledger_id}:{second.entry_id}"
        wait_for(lambda: inbound(at_shadow).get("connected") and
                 inbound(at_shadow).get("replicatedPosition") == at,
                 what=f"the shadow to say connected at {at}")


def test_r7_a_backlog_past_the_policy_resets_and_the_shadow_still_reads_it(pair, topic):
    src, sh = pair
    with Client(src.url) as c:
        c.admin.create_topic(topic, policies=Policies(replicator_auto_reset_backlog_entries=10))
        c.admin.create_shadow_topic(f"{topic}-shadow", topic)
        c.admin.create_subscription(f"{topic}-shadow", "s", "earliest")
        with c.create_producer(topic) as p:  # the source loads: its replicator starts
            ids = [p.send(b"first")]
        wait_for(lambda: c.admin.stats(topic).get("shadowReplication", {})
                 .get(f"{topic}-shadow", {}).get("connected"), what="replicator connected")
        sh.kill()
        with c.create_producer(topic) as p:
            ids += [p.send(f"m{i}".encode()) for i in range(100)]
        sh.start(timeout=60)
        st = wait_for(lambda: (s := c.admin.stats(topic)["shadowReplication"]
                               [f"{topic}-shadow"]).get("connected") and s, what="reconnect")
        assert int(st["autoResets"]) >= 1
        with c.subscribe(f"{topic}-shadow", "s") as cons:
            got = drain(cons, 101, timeout=15)
            assert [m.message_id.entry_id for m in got] == [x.entry_id for x in ids]


def test_r9_the_last_message_of_a_quiet_topic_shows_on_the_shadow(shared_pair, topic):
    src, _ = shared_pair
    with Client(src.url) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(f"{topic}-shadow", topic)
        with c.create_reader(f"{topic}-shadow", start="latest") as r:
            with c.create_producer(topic) as p:
                mid = p.send(b"the only one")
            m = r.read_next(timeout=10)  # bounded: far less in practice (bench/)
            assert (m.message_id.ledger_id, m.message_id.entry_id) == \
                (mid.ledger_id, mid.entry_id)


def _replicate(url: str, batches: list) -> list:
    up: queue.SimpleQueue = queue.SimpleQueue()
    for b in batches:
        up.put(b)
    up.put(None)

    def gen():
        while (b := up.get()) is not None:
            yield b

    with grpc.insecure_channel(url) as ch:
        call = ch.stream_stream("/shadowtopic.v1.Replication/Replicate",
                                request_serializer=replication_pb2.ReplicateBatch.SerializeToString,
                                response_deserializer=replication_pb2.ReplicateAck.FromString)
        return list(call(gen(), timeout=30))


def _shadow_with_messages(c, topic: str, shadow: str, n: int = 5):
    """A source with a shadow, `n` messages produced and received by a subscription of the
    shadow: (that consumer, the messages' ids, the source owner's epoch)."""
    c.admin.create_topic(topic)
    c.admin.create_shadow_topic(shadow, topic)
    cons = c.subscribe(shadow, "s", initial_position="earliest")
    with c.create_producer(topic) as p:
        ids = [p.send(f"m{i}".encode()) for i in range(n)]
    drain(cons, n, timeout=15)
    return cons, ids, int(c.admin.lookup(topic)["epoch"])


def test_r5_resent_and_stale_batches_change_nothing_and_a_deposed_owner_is_refused(
        shared_pair, topic):
    src, sh = shared_pair
    shadow = f"{topic}-shadow"
    with Client(src.url) as c:
        cons, ids, epoch = _shadow_with_messages(c, topic, shadow)
        old = replication_pb2.ReplicateBatch(
            shadow=canonical(shadow), source=canonical(topic), batch_id=1, source_epoch=epoch,
            entries=[common_pb2.EncodedEntry(ledger_id=ids[0].ledger_id, entry_id=0)],
            last_confirmed=common_pb2.MessageIdData(ledger_id=ids[0].ledger_id, entry_id=0))
        acks = _replicate(sh.url, [old, old])  # resent, older than what the shadow has
        assert [a.HasField("error") for a in acks] == [False, False]
        assert all(a.last_persisted.entry_id == ids[-1].entry_id for a in acks)
        assert nothing_more(cons)  # no duplicate reached the subscription
        deposed = replication_pb2.ReplicateBatch()
        deposed.CopyFrom(old)
        deposed.source_epoch = epoch - 1
        acks = _replicate(sh.url, [deposed])
        assert acks[0].HasField("error") and acks[0].error.reason == "Fenced"
        with c.create_producer(topic) as p:  # replication goes on
            more = p.send(b"more")
        assert drain(cons, 1, timeout=15)[0].message_id.entry_id == more.entry_id
        cons.close()


def test_r5_replication_is_accepted_only_at_the_owners_epoch_and_for_listed_ledgers(
        shared_pair, topic):
    """A batch claiming an epoch no owner had is refused; ids in a ledger the source never
    listed are not applied: the shadow's readers and last id stay the source's."""
    src, sh = shared_pair
    shadow = f"{topic}-shadow"
    with Client(src.url) as c:
        cons, ids, epoch = _shadow_with_messages(c, topic, shadow)
        future = replication_pb2.ReplicateBatch(
            shadow=canonical(shadow), source=canonical(topic), batch_id=1,
            source_epoch=2 ** 63, last_confirmed=common_pb2.MessageIdData(
                ledger_id=ids[-1].ledger_id, entry_id=ids[-1].entry_id + 1000))
        acks = _replicate(sh.url, [future])
        assert acks[0].HasField("error") and acks[0].error.reason == "InvalidArgument"
        assert "epoch" in acks[0].error.message
        unlisted = replication_pb2.ReplicateBatch()
        unlisted.CopyFrom(future)
        unlisted.source_epoch = epoch
        unlisted.last_confirmed.ledger_id = ids[-1].ledger_id + 1000
        acks = _replicate(sh.url, [unlisted])
        assert not acks[0].HasField("error")
        assert acks[0].last_persisted.ledger_id == ids[-1].ledger_id  # not the unlisted one
        assert c.admin.last_message_id(shadow) == ids[-1]
        with c.create_producer(topic) as p:  # replication goes on, reads work
            more = p.send(b"more")
        assert drain(cons, 1, timeout=15)[0].message_id == more
        with c.create_reader(shadow, start="earliest") as r:
            got = [r.read_next(timeout=10).payload for _ in range(6)]
        assert got == [f"m{i}".encode() for i in range(5)] + [b"more"]
        cons.close()


def test_c8_source_truncation_moves_shadow_cursors_past_deleted_ledgers(shared_pair, topic):
    src, _ = shared_pair
    shadow = f"{topic}-shadow"
    with Client(src.url) as c:
        c.admin.create_topic(topic, policies=Policies(ledger_max_entries=10))
        c.admin.create_shadow_topic(shadow, topic)
        c.admin.create_subscription(shadow, "lagging", "earliest")
        with c.create_producer(topic) as p:
            for i in range(35):
                p.send(f"m{i}".encode())
        c.admin.truncate(topic)  # seals the open ledger, deletes every sealed one
        with c.create_producer(topic) as p:
            after = [p.send(f"n{i}".encode()) for i in range(3)]
        with c.subscribe(shadow, "lagging") as cons:
            got = drain(cons, 3, timeout=15)
            assert [m.message_id.entry_id for m in got] == [x.entry_id for x in after]
            assert [m.message_id.ledger_id for m in got] == [x.ledger_id for x in after]
        sub = wait_for(lambda: c.admin.stats(shadow)["subscriptions"]["lagging"],
                       what="shadow stats")
        assert int(sub["skippedEntries"]) == 35
        # the source still reads what is left, and the shadow's reader too
        with c.create_reader(shadow, start="earliest") as r:
            assert r.read_next(timeout=10).message_id.entry_id == after[0].entry_id
