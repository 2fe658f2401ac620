"""Arrow reads (docs/CLIENT.md, "Arrow reads") against real brokers: `read_table` of a topic
equals what a reader reads (sealed ledgers and the open one); `read_table(compacted=True)` of
20,000 keys (100,000 with ARROW_TEST_KEYS=100000) equals the compacted reader's messages,
tombstones included while kept, on the source and on a shadow; a partitioned topic comes
back with its `partition` column;
`read_batch` follows a live producer with every id once; bad columns are refused."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

import pytest
from support.compacted_read import publish_compaction

from shadowtopic.client import Client, errors

pq = pytest.importorskip("pyarrow.parquet")
#: keys of the compacted test: 20,000 in `make test` (100,000 took minutes on the shared CI
#: machine); ARROW_TEST_KEYS=100000 runs the issue's size
KEYS = int(os.environ.get("ARROW_TEST_KEYS", "20000"))
EXE = os.path.join(os.path.dirname(sys.executable), "shadowtopic")


def read_all(client: Client, topic: str, compacted: bool = False) -> list:
    """What a reader reads message by message (`read_next`: the stream, not the columns)
    from the earliest until the end, as (ids, key, payload)."""
    out: list = []
    deadline = time.monotonic() + 120
    with client.create_reader(topic, "earliest", read_compacted=compacted,
                              receiver_queue_size=5000) as r:
        while r.has_message_available():
            assert time.monotonic() < deadline, f"{len(out)} read, the reader stalled"
            m = r.read_next(timeout=10)
            out.append(((m.message_id.ledger_id, m.message_id.entry_id),
                        m.key, m.payload))
    return out


def batch_rows(batch) -> list:
    return list(zip(zip(batch.column("ledger_id").to_pylist(),
                        batch.column("entry_id").to_pylist()),
                    batch.column("key").to_pylist(), batch.column("payload").to_pylist(),
                    strict=True))


def rows(table) -> list:
    return list(zip(zip(table.column("ledger_id").to_pylist(),
                        table.column("entry_id").to_pylist()),
                    table.column("key").to_pylist(), table.column("payload").to_pylist(),
                    strict=True))


def test_read_table_equals_a_readers_messages_across_sealed_and_open_ledgers(
        client, broker, topic, tmp_path):
    client.admin.create_topic(topic)
    with client.create_producer(topic) as p:
        for i in range(3000):
            p.send_async(f"v{i}".encode(), key=f"k{i % 50}",
                         properties={"i": str(i)}, event_time=1000 + i)
            if i in (1000, 2000):
                p.flush()
                client.admin.roll_ledger(topic)  # two sealed ledgers and an open one
        p.flush()
    table = client.read_table(topic)
    assert table.num_rows == 3000
    assert rows(table) == read_all(client, topic)
    assert table.column("event_time").to_pylist() == [1000 + i for i in range(3000)]
    assert [dict(x)["i"] for x in table.column("properties").to_pylist()] == \
        [str(i) for i in range(3000)]
    assert set(table.column("partition").to_pylist()) == {-1}
    few = client.read_table(topic, columns=["entry_id", "payload"], start="0:0", end="0:0")
    assert few.column_names == ["entry_id", "payload"]
    middle = client.read_table(topic, start=f"{table['ledger_id'][10]}:{table['entry_id'][10]}",
                               end=f"{table['ledger_id'][20]}:{table['entry_id'][20]}")
    assert rows(middle) == rows(table.slice(10, 10))
    with pytest.raises(errors.InvalidArgument, match="no column 'nope'"):
        client.read_table(topic, columns=["nope"])
    out = tmp_path / "orders.parquet"  # the CLI writes what it reads
    done = subprocess.run([EXE, "--url", broker.url, "read", topic, "--until-end",
                           "--parquet", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "3000 messages written" in done.stderr
    assert rows(pq.read_table(out)) == rows(table)


def test_compacted_read_table_of_100000_keys_equals_the_compacted_reader_on_source_and_shadow(
        etcd_server, start_pair, tmp_path):
    src, sh = start_pair()
    topic = "persistent://public/default/arrow-compacted"
    shadow = topic + "-shadow"
    rnd = random.Random(3)
    with Client(src.url, timeout=30) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(shadow, topic)
        with c.create_producer(topic, batch_max_messages=1000) as p:
            for i in range(KEYS):
                p.send_async(f"v{i}".encode(), key=f"k{i}")
            for i in range(0, KEYS, 97):  # updates and deletes of some keys
                p.send_async(b"" if i % 2 else f"w{i}".encode(), key=f"k{i}")
            p.flush()
        c.admin.roll_ledger(topic)
        publish_compaction(etcd_server, str(tmp_path / "shared-storage"), topic, "job-1")
        with c.create_producer(topic) as p:  # after the horizon
            for i in range(50):
                p.send(f"tail{i}".encode(), key=f"k{rnd.randrange(KEYS)}")
        expected = read_all(c, topic, compacted=True)
        table = c.read_table(topic, compacted=True)
        assert rows(table) == expected
        tombstones = table.filter(table.column("is_tombstone"))
        assert tombstones.num_rows == 0  # (publish_compaction drops deletes: none kept)
        assert table.num_rows == len(expected) > KEYS * 0.99
        shadow_table = c.read_table(shadow, compacted=True)
        assert rows(shadow_table) == expected


def test_a_partitioned_topic_reads_every_partition_with_its_index(client, topic):
    client.admin.create_topic(topic, partitions=3)
    with client.create_producer(topic) as p:
        for i in range(300):
            p.send_async(f"v{i}".encode(), key=f"k{i}")
        p.flush()
    table = client.read_table(topic, columns=["key", "payload", "partition"])
    assert table.num_rows == 300
    assert set(table.column("partition").to_pylist()) == {0, 1, 2}
    assert sorted(table.column("payload").to_pylist()) == sorted(
        f"v{i}".encode() for i in range(300))


def test_read_batch_follows_a_live_producer_with_every_id_once(client, topic):
    client.admin.create_topic(topic)
    sent: dict = {}
    done = threading.Event()

    def produce():
        with client.create_producer(topic) as p:
            for i in range(5000):
                p.send_async(f"v{i}".encode(), key=f"k{i % 10}",
                             callback=lambda mid, err, i=i: sent.__setitem__(i, mid))
                if i % 500 == 0:
                    time.sleep(0.05)
            p.flush()
        done.set()
    got: list = []
    with client.create_reader(topic, "earliest") as r:
        t = threading.Thread(target=produce)
        t.start()
        deadline = time.monotonic() + 60
        while len(got) < 5000 and time.monotonic() < deadline:
            batch = r.read_batch(700, timeout=0.5)
            got += list(zip(batch.column("ledger_id").to_pylist(),
                            batch.column("entry_id").to_pylist()))
        t.join(30)
    assert done.is_set()
    ids = [(sent[i].ledger_id, sent[i].entry_id) for i in range(5000)]
    assert got == ids  # every id once, in order


class Counted:
    """Counts the messages the reader's stream hands to `read_batch` (Consumer.batch_receive):
    none while it reads a history as columns."""

    def __init__(self, monkeypatch):
        from shadowtopic.client.consumer import Consumer
        self.messages = 0
        real = Consumer.batch_receive

        def counted(core, *args, **kwargs):
            got = real(core, *args, **kwargs)
            self.messages += len(got)
            return got
        monkeypatch.setattr(Consumer, "batch_receive", counted)


def test_read_batch_reads_a_history_as_columns_then_follows_the_stream(client, topic,
                                                                       monkeypatch):
    """A reader behind the tail gets the history (two sealed ledgers and the open one) as
    columns, no message object on the client; compressed payloads come decompressed; then
    the live messages through the stream, every id once, in order; a seek reads columns
    again from where it landed."""
    client.admin.create_topic(topic)
    ids: dict = {}

    def payload(i: int) -> bytes:  # compresses well when long, not at all when short
        return f'{{"n": {i}, "pad": "{"x" * (i % 300)}"}}'.encode()
    with client.create_producer(topic, compression_type="zstd") as p:
        for i in range(3000):
            p.send_async(payload(i), key=f"k{i % 50}",
                         callback=lambda mid, err, i=i: ids.__setitem__(i, mid))
            if i in (1000, 2000):
                p.flush()
                client.admin.roll_ledger(topic)
        p.flush()
    history = [((ids[i].ledger_id, ids[i].entry_id), f"k{i % 50}".encode(), payload(i))
               for i in range(3000)]
    counted = Counted(monkeypatch)
    got: list = []
    with client.create_reader(topic, "earliest", receiver_queue_size=100) as r:
        deadline = time.monotonic() + 60
        while len(got) < 3000 and time.monotonic() < deadline:
            batch = r.read_batch(700, timeout=5)
            assert batch.num_rows <= 700
            got += batch_rows(batch)
        assert got == history
        assert counted.messages == 0  # columns only, no message object
        assert not r.has_message_available()
        # caught up (a call from the position found nothing): the stream from now on
        assert r.read_batch(10, timeout=0.5).num_rows == 0
        with client.create_producer(topic) as p:  # live: the stream
            live = [p.send(f"live{i}".encode(), key="z") for i in range(20)]
        deadline = time.monotonic() + 30
        while len(got) < 3020 and time.monotonic() < deadline:
            got += batch_rows(r.read_batch(700, timeout=1))
        assert got[3000:] == [((m.ledger_id, m.entry_id), b"z", f"live{i}".encode())
                              for i, m in enumerate(live)]
        assert counted.messages == 20
        r.seek(ids[2500])  # back into the open ledger: columns again
        again: list = []
        deadline = time.monotonic() + 30
        while len(again) < 520 and time.monotonic() < deadline:
            again += batch_rows(r.read_batch(10_000, timeout=5))
        assert again == history[2500:] + got[3000:]
        assert counted.messages == 20
        assert r.read_batch(10, timeout=0.5).num_rows == 0
        with pytest.raises(errors.InvalidArgument):
            r.read_batch(0)


def test_read_batch_of_a_partitioned_topic_reads_each_partition_once(client, topic):
    client.admin.create_topic(topic, partitions=3)
    sent: dict = {}
    with client.create_producer(topic) as p:
        for i in range(600):
            p.send_async(f"v{i}".encode(), key=f"k{i}",
                         callback=lambda mid, err, i=i: sent.__setitem__(i, mid))
        p.flush()
    by_partition: dict = {}
    for i in range(600):
        m = sent[i]
        by_partition.setdefault(m.partition, []).append((m.ledger_id, m.entry_id, f"v{i}"))
    got: dict = {}
    with client.create_reader(topic, "earliest") as r:
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < 600 and time.monotonic() < deadline:
            b = r.read_batch(128, timeout=5, columns=["ledger_id", "entry_id", "payload",
                                                      "partition"])
            assert b.schema.names == ["ledger_id", "entry_id", "payload", "partition"]
            for row in b.to_pylist():
                got.setdefault(row["partition"], []).append(
                    (row["ledger_id"], row["entry_id"], row["payload"].decode()))
        assert got == by_partition  # each partition's ids once, in order
        assert not r.has_message_available()
