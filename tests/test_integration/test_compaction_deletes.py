"""K18 end to end: deletes reach compacted readers and read_compacted durable subscriptions
that cross a compaction (real etcd, real broker processes, a real compaction worker with
one warm SparkSession: conftest's `worker`, the client as a user drives it).

A compaction keeps a key's delete (its tombstone: the empty-payload message) in the
compacted ledger for the topic's `delete_retention_seconds` (default one day), so a reader
between the previous horizon and the delete when the next compaction runs goes on in the
new compacted ledger and still reads the delete. The readers here are held behind the
delete (a receiver queue of one message, or no consumer attached) so that the delete
reaches them only through the new compacted ledger.
"""
from __future__ import annotations

from support.compaction_support import pointer, produce, wait_done
from support.waiting import eventually

from shadowtopic.client import Client, Policies
from shadowtopic.core.policies import DEFAULTS

FILLERS = 20  # messages between what the reader read and the delete: more than it prefetches


def compact(client, topic: str) -> str:
    job_id = client.admin.compact(topic)
    status = wait_done(client, topic, job_id)
    assert status.phase == "done", status.error
    return job_id


def compacted_ids(client, topic: str) -> list:
    """Every id a compacted reader from the earliest reads. Opening it also puts the
    broker's compacted view on the newest pointer (K19): readers and subscriptions of the
    topic read the job that just finished from here on."""
    out = []
    with client.create_reader(topic, "earliest", read_compacted=True) as r:
        while r.has_message_available():
            out.append(r.read_next(timeout=10).message_id)
    return out


def apply(state: dict, msg) -> None:
    """A key -> value map as a reader of a compacted topic builds it."""
    if msg.key is None:
        return
    if msg.payload:
        state[msg.key] = msg.payload
    else:
        state.pop(msg.key, None)


def test_a_compacted_reader_crossing_a_compaction_receives_the_delete(compacting_source,
                                                                       etcd_server, topic):
    """K18, the issue's repro: put k1, compact, a read_compacted reader reads past the
    horizon, k1 is deleted, compact again: the reader goes on in the new compacted ledger
    and receives k1's tombstone, ending with exactly the topic's keys (default policies:
    delete_retention_seconds is one day)."""
    with Client(compacting_source.url, timeout=30) as c:
        first = produce(c, topic, [("k1", "v1")])
        assert c.admin.get_policies(topic).delete_retention_seconds == \
            DEFAULTS.delete_retention_seconds == 86400
        compact(c, topic)
        fillers = produce(c, topic, [("f", f"x{i}") for i in range(FILLERS)])
        state: dict = {}
        got = []
        with c.create_reader(topic, "earliest", read_compacted=True,
                             receiver_queue_size=1) as r:
            for _ in range(2):  # k1 from the compacted ledger, then the raw tail
                msg = r.read_next(timeout=10)
                got.append(msg.message_id)
                apply(state, msg)
            assert got == [first[0], fillers[0]] and state == {b"k1": b"v1", b"f": b"x0"}
            delete = produce(c, topic, [("k1", "")])[0]
            job = compact(c, topic)
            ptr = pointer(etcd_server, topic)
            assert ptr.job_id == job and ptr.manifest.tombstones == 1
            assert compacted_ids(c, topic) == [fillers[-1], delete]
            tombstones = []
            while r.has_message_available():
                msg = r.read_next(timeout=10)
                apply(state, msg)
                if not msg.payload:
                    tombstones.append((msg.key, msg.message_id))
        assert tombstones == [(b"k1", delete)]
        assert state == {b"f": f"x{FILLERS - 1}".encode()}


def test_a_compacted_subscription_receives_the_delete_across_a_broker_restart(
        compacting_source, etcd_server, topic):
    """K18 for a durable read_compacted subscription: it acknowledged past the first
    horizon, k1 was deleted, the broker restarted, then the topic was compacted again:
    resumed from its cursor, it reads on in the new compacted ledger and receives k1's
    tombstone (the cursor is all it kept: the delete reaches it from the ledger)."""
    with Client(compacting_source.url, timeout=30) as c:
        c.admin.create_topic(topic, policies=Policies(delete_retention_seconds=3600))
        first = produce(c, topic, [("k1", "v1"), ("k2", "v2")])
        compact(c, topic)
        fillers = produce(c, topic, [("f", f"x{i}") for i in range(FILLERS)])
        sub = c.subscribe(topic, "snap", initial_position="earliest", read_compacted=True,
                          receiver_queue_size=1)
        state: dict = {}
        for want in (*first, fillers[0]):
            msg = sub.receive(timeout=10)
            assert msg.message_id == want
            apply(state, msg)
            sub.acknowledge(msg)
        eventually(lambda: assert_equal(
            c.admin.internal_stats(topic)["cursors"]["snap"]["markDeletePosition"],
            str(fillers[0])))
        sub.close()
        delete = produce(c, topic, [("k1", "")])[0]
    assert compacting_source.terminate() == 0
    compacting_source.start(timeout=60)
    with Client(compacting_source.url, timeout=30) as c:
        compact(c, topic)
        assert compacted_ids(c, topic) == [first[1], fillers[-1], delete]
        sub = c.subscribe(topic, "snap", read_compacted=True, receiver_queue_size=1)
        got = []
        while True:
            msg = sub.receive(timeout=10)
            got.append(msg.message_id)
            apply(state, msg)
            sub.acknowledge(msg)
            if msg.message_id == delete or len(got) > FILLERS + 2:
                break
        sub.close()
    assert got[-1] == delete and fillers[-1] in got
    assert state == {b"k2": b"v2", b"f": f"x{FILLERS - 1}".encode()}


def assert_equal(a, b):
    assert a == b, (a, b)
