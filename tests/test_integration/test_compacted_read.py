"""Reading the compacted view end to end (real etcd, real broker processes, the client and the
CLI), with compacted ledgers published by `publish_compaction` below: a few lines doing what
the compaction worker does (PIP-14 over the topic's sealed ledgers, written in the format of
compaction/ledger.py, pointer put into etcd), so these tests need no Spark.
tests/test_integration/test_compaction.py runs the same reads after the real worker."""
from __future__ import annotations

import json
import time

import pytest
from support.compacted_read import ITEMS, compacted_ids, produce, publish_compaction, storage_root
from support.waiting import eventually

from shadowtopic.client import Client, errors

# ---- a compaction, by hand ----------------------------------------------------------------------


# ---- helpers ---------------------------------------------------------------------------------


# ---- tests ------------------------------------------------------------------------------------

def test_compacted_reader_client_and_cli(etcd_server, broker, client, cli, topic):
    """K1, K7, K8 (start and seek), K9 through the client and `read --compacted`; the
    pointer in internal stats; plain readers read everything (K3)."""
    client.admin.create_topic(topic)
    ids = produce(client, topic, ITEMS)
    client.admin.roll_ledger(topic)
    with client.create_reader(topic, "earliest", read_compacted=True) as r:  # before: raw
        assert r.read_next(timeout=10).message_id == ids[0]
    ptr = publish_compaction(etcd_server, storage_root(broker), topic, "job-1")
    survivors = [ids[2], ids[4]]  # a2, b2; c and d deleted
    eventually(lambda: assert_equal(compacted_ids(client, topic), survivors))
    assert client.admin.last_message_id(topic, read_compacted=True) == ids[4]  # K9
    assert client.admin.last_message_id(topic) == ids[-1]
    assert client.admin.internal_stats(topic)["compactedLedger"] == ptr.manifest_path
    more = produce(client, topic, [("a", "a3"), ("e", "")])  # K7: after the horizon
    assert compacted_ids(client, topic) == survivors + more
    assert compacted_ids(client, topic, ids[0], inclusive=True) == survivors + more  # K8
    assert compacted_ids(client, topic, ids[3], inclusive=True) == [ids[4]] + more
    assert compacted_ids(client, topic, ids[5]) == more  # beyond the last compacted entry
    with client.create_reader(topic, "earliest", read_compacted=True) as r:
        assert r.read_next(timeout=10).message_id == ids[2]
        r.seek(ids[3])  # compacted away: lands on the next survivor
        msg = r.read_next(timeout=10)
        assert (msg.message_id, msg.key, msg.payload) == (ids[4], b"b", b"b2")
    with client.create_reader(topic, "earliest") as r:
        assert [r.read_next(timeout=10).message_id for _ in ids + more] == ids + more
    res = cli("read", topic, "--compacted", "--until-end", "-o", "json", check=True)
    assert [json.loads(x)["message_id"] for x in res.stdout.splitlines()] == \
        [str(i) for i in survivors + more]
    res = cli("read", topic, "--until-end", "-o", "json", check=True)
    assert len(res.stdout.splitlines()) == len(ids + more)


def assert_equal(a, b):
    assert a == b, (a, b)


@pytest.mark.own_broker
def test_compacted_view_outlives_truncate_and_restart_with_subscriptions(etcd_server, broker,
                                                                         topic):
    """K15: after the raw ledgers up to the horizon are truncated and the broker restarts,
    compacted readers read the compacted prefix then the new raw tail, and a read_compacted
    subscription resumes right after what it acknowledged (acked one by one over ids that
    were compacted away), nothing compacted skipped; before its consumer is back, it peeks
    and counts its backlog in the compacted view."""
    with Client(broker.url, timeout=20) as c:
        c.admin.create_topic(topic)
        ids = produce(c, topic, [(f"k{i % 4}", f"v{i}") for i in range(12)]
                      + [("k0", "w0"), ("z", "1"), ("k2", "w2"), ("z", "")])
        c.admin.roll_ledger(topic)
        publish_compaction(etcd_server, storage_root(broker), topic, "job-1")
        survivors = [ids[9], ids[11], ids[12], ids[14]]  # k1 v9, k3 v11, k0 w0, k2 w2
        eventually(lambda: assert_equal(compacted_ids(c, topic), survivors))
        sub = c.subscribe(topic, "snap", initial_position="earliest", read_compacted=True)
        got = [sub.receive(timeout=10) for _ in range(2)]
        assert [m.message_id for m in got] == survivors[:2]
        for m in got:
            sub.acknowledge(m)
        # acks are fire-and-forget: the cursor moves a moment later, with no holes over gaps
        eventually(lambda: assert_equal(
            c.admin.internal_stats(topic)["cursors"]["snap"]["markDeletePosition"],
            str(survivors[1])))
        sub.close()
        assert c.admin.truncate(topic)["ledgersDeleted"] >= 1
        with c.create_reader(topic, "earliest") as r:
            assert not r.has_message_available()  # the raw ledgers are gone
        assert compacted_ids(c, topic) == survivors
        time.sleep(1.5)  # a cursor flush
    assert broker.terminate() == 0
    broker.start(timeout=60)
    with Client(broker.url, timeout=20) as c:
        more = produce(c, topic, [("k1", "new")])
        assert compacted_ids(c, topic) == survivors + more
        # no consumer attached since the restart: the subscription still reads the
        # compacted view (its read_compacted is stored with it)
        assert [m.message_id for m in c.admin.peek_messages(topic, "snap", 3)] == \
            survivors[2:] + more
        assert c.admin.stats(topic)["subscriptions"]["snap"]["msgBacklog"] == 3
        sub = c.subscribe(topic, "snap", read_compacted=True)
        assert [sub.receive(timeout=10).message_id for _ in range(3)] == survivors[2:] + more
        sub.close()
        with pytest.raises(errors.InvalidArgument, match="Exclusive or Failover"):
            c.subscribe(topic, "shared", consumer_type="shared", read_compacted=True)


def test_shadows_of_a_partitioned_source_read_its_compacted_view(etcd_server, start_pair,
                                                                 tmp_path):
    """K10: each partition of a shadow reads its source partition's compacted ledger (one
    compaction for the source and every shadow), through the shadow broker and through the
    source's URL."""
    src, sh = start_pair()
    root = str(tmp_path / "shared-storage")
    topic = "persistent://public/cv/parted"
    shadow = topic + "-shadow"
    with Client(src.url, timeout=30) as c:
        c.admin.create_topic(topic, partitions=2)
        c.admin.create_shadow_topic(shadow, topic)
        ids = produce(c, topic, [(f"k{i % 6}", f"v{i}") for i in range(30)])
        want = {}
        for i in range(2):
            part = f"{topic}-partition-{i}"
            c.admin.roll_ledger(part)
            ptr = publish_compaction(etcd_server, root, part, f"job-{i}")
            want[i] = sorted(m for m in ids[-6:] if m.partition == i)
            assert ptr.manifest.entries == len(want[i])
        expect = sorted(m for ms in want.values() for m in ms)
        eventually(lambda: assert_equal(sorted(compacted_ids(c, topic)), expect))
        eventually(lambda: assert_equal(sorted(compacted_ids(c, shadow)), expect))
        stats = c.admin.internal_stats(f"{shadow}-partition-1")
        assert stats["compactedLedger"].endswith("job-1/manifest.pb")
        last = c.admin.last_message_id(f"{shadow}-partition-0", read_compacted=True)
        assert (last.ledger_id, last.entry_id) == (want[0][-1].ledger_id, want[0][-1].entry_id)
    with Client(sh.url, timeout=30) as c2:
        assert sorted(compacted_ids(c2, shadow)) == expect


def test_a_missing_compacted_ledger_fails_compacted_reads_only(etcd_server, broker, client,
                                                               cli, topic):
    """K17: a pointer naming a missing file: compacted reads (reader, last message id, CLI)
    fail with DATA_LOSS; plain reads work; a good pointer heals the view."""
    client.admin.create_topic(topic)
    ids = produce(client, topic, [("k", "v1"), ("k", "v2")])
    client.admin.roll_ledger(topic)

    def lose(ptr):
        ptr.manifest.files[0].path = ptr.manifest.files[0].path.replace(".parquet",
                                                                        "-gone.parquet")
    publish_compaction(etcd_server, storage_root(broker), topic, "job-bad", lose)

    def fails():
        try:
            with client.create_reader(topic, "earliest", read_compacted=True) as r:
                r.read_next(timeout=5)
        except errors.DataLoss as exc:
            assert "gone" in str(exc)
        else:
            raise AssertionError("a compacted read did not fail")
    eventually(fails)
    with pytest.raises(errors.DataLoss):
        client.admin.last_message_id(topic, read_compacted=True)
    with pytest.raises(errors.DataLoss):
        compacted_ids(client, topic)  # the read loop does not end quietly
    res = cli("read", topic, "--compacted", "--until-end")
    assert res.returncode == 1 and "DataLoss" in res.stderr, res.stderr
    with client.create_reader(topic, "earliest") as r:
        assert [r.read_next(timeout=10).message_id for _ in ids] == ids
    publish_compaction(etcd_server, storage_root(broker), topic, "job-good")
    eventually(lambda: assert_equal(compacted_ids(client, topic), [ids[1]]))
