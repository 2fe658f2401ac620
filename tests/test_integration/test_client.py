"""The Python client (shadowtopic.client) against a real broker process and real etcd.

Messages round-trip with every field and the exact MessageIds the producer got; errors are
the typed classes of shadowtopic.core.errors; ledgers roll by policy, retention deletes old ledgers,
and a broker restart keeps every acknowledged message readable.
"""
from __future__ import annotations

import threading
import time

import google_crc32c
import grpc
import pytest
from support.waiting import wait_for

from shadowtopic.client import Client
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.policies import Policies
from shadowtopic.pb.v1 import common_pb2, producer_pb2

# ---- helpers ------------------------------------------------------------------------------

def read_all(client: Client, topic: str, start="earliest", inclusive=False, limit=1_000_000):
    """Every message from `start` to the end, with a bounded loop."""
    out = []
    with client.create_reader(topic, start=start, inclusive=inclusive) as r:
        while r.has_message_available():
            out.append(r.read_next(timeout=20))
            assert len(out) <= limit, "reader returned more messages than were produced"
    return out


def send_all(producer, payloads, key=None) -> list[MessageId]:
    """send_async everything, flush, and return the ids in send order."""
    ids: list = [None] * len(payloads)
    failures: list = []

    def cb_for(i):
        def cb(mid, exc):
            if exc is not None:
                failures.append(exc)
            ids[i] = mid
        return cb

    for i, p in enumerate(payloads):
        producer.send_async(p, key=key, callback=cb_for(i))
    producer.flush(timeout=60)
    assert not failures, failures[:3]
    assert all(i is not None for i in ids)
    return ids


def ledgers(client: Client, topic: str) -> list[dict]:
    return client.admin.internal_stats(topic).get("ledgers", [])


def assert_increasing(ids: list[MessageId], what: str = "message ids") -> None:
    bad = [(k, ids[k - 1], ids[k]) for k in range(1, len(ids)) if not ids[k - 1] < ids[k]]
    assert not bad, (f"{what} not strictly increasing in send order: {len(bad)} inversions, "
                     f"first (index, previous, this): {bad[:3]}")


def plain(mid: MessageId) -> MessageId:
    return MessageId(mid.ledger_id, mid.entry_id)


# ---- round trip ----------------------------------------------------------------------------

def test_round_trip_of_every_message_field(client, topic):
    client.admin.create_topic(topic)
    sent = [
        dict(payload=b"plain"),
        dict(payload=b"keyed", key="user-1"),
        dict(payload=b"\x00\xffbinary\n", key=b"\x00bin\xffkey"),
        dict(payload="unicode \u00e9\u4e2d", key="k\u00e9",
             properties={"a": "1", "\u00fc": "\u00e9"}),
        dict(payload=b"timed", key="user-1", event_time=1_700_000_000_123),
        dict(payload=b"", key="user-1"),                        # tombstone
        dict(payload=b"", key=None),                            # keyless empty payload
        dict(payload=b"x" * 500_000, key="big", properties={"size": "500000"}),
    ]
    t0 = int(time.time() * 1000)
    with client.create_producer(topic, producer_name="rt-producer") as p:
        ids = [p.send(**m) for m in sent]
    t1 = int(time.time() * 1000)
    assert all(a < b for a, b in zip(ids, ids[1:]))
    assert all(i.partition == -1 for i in ids)

    got = read_all(client, topic)
    assert [m.message_id for m in got] == ids
    for m, s in zip(got, sent):
        payload = s["payload"].encode() if isinstance(s["payload"], str) else s["payload"]
        key = s.get("key")
        key = key.encode() if isinstance(key, str) else key
        assert m.payload == payload
        assert m.key == key
        assert m.properties == s.get("properties", {})
        assert m.event_time == s.get("event_time", 0)
        assert m.producer_name == "rt-producer"
        assert m.topic == topic
        assert t0 - 1000 <= m.publish_time <= t1 + 1000, (m.publish_time, t0, t1)
        assert m.is_tombstone == (payload == b"")
    assert [m.sequence_id for m in got] == list(range(1, len(sent) + 1))
    assert got[5].is_tombstone and got[5].key == b"user-1"

    # the same ids from a reader started at one of them, inclusive and not
    tail = read_all(client, topic, start=ids[3], inclusive=True)
    assert [m.message_id for m in tail] == ids[3:]
    tail = read_all(client, topic, start=str(ids[3]))
    assert [m.message_id for m in tail] == ids[4:]
    assert client.admin.last_message_id(topic) == ids[-1]


def test_send_returns_strictly_increasing_ids(client, topic):
    client.admin.create_topic(topic)
    with client.create_producer(topic) as p:
        ids = [p.send(f"m{i}") for i in range(200)]
    assert all(a < b for a, b in zip(ids, ids[1:]))
    assert len({i.ledger_id for i in ids}) == 1
    assert [i.entry_id for i in ids] == list(range(ids[0].entry_id, ids[0].entry_id + 200))
    assert [m.message_id for m in read_all(client, topic)] == ids


def test_send_async_callbacks_get_every_id_in_order(client, topic):
    client.admin.create_topic(topic)
    n = 20_000
    calls: list[tuple[int, MessageId | None, Exception | None]] = []
    lock = threading.Lock()

    def cb_for(i):
        def cb(mid, exc):
            with lock:
                calls.append((i, mid, exc))
        return cb

    with client.create_producer(topic, batch_max_messages=333, max_inflight=4) as p:
        for i in range(n):
            p.send_async(f"m{i}".encode(), key=f"k{i % 10}", callback=cb_for(i))
        p.flush(timeout=60)
    assert len(calls) == n, "not every callback ran exactly once"
    assert [c[0] for c in calls] == list(range(n)), "callbacks out of send order"
    assert all(c[2] is None for c in calls)
    ids = [c[1] for c in calls]
    assert all(a < b for a, b in zip(ids, ids[1:]))

    got = read_all(client, topic)
    assert [m.message_id for m in got] == ids
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(n)]


# ---- partitioned topics ----------------------------------------------------------------------

def test_partitioned_topic_routes_by_key_and_reader_reads_all_partitions(client, topic):
    parts = 4
    meta = client.admin.create_topic(topic, partitions=parts)
    assert meta.partitions == parts
    keys = [f"key-{i}" for i in range(12)]
    sent: dict[str, list[tuple[MessageId, bytes]]] = {k: [] for k in keys}
    keyless: list[MessageId] = []
    with client.create_producer(topic) as p:
        for round_ in range(20):
            for k in keys:
                payload = f"{k}/{round_}".encode()
                sent[k].append((p.send(payload, key=k), payload))
        for i in range(8):
            keyless.append(p.send(f"nokey-{i}"))

    for k, items in sent.items():
        partitions = {mid.partition for mid, _ in items}
        assert partitions == {google_crc32c.value(k.encode()) % parts}, (k, partitions)
    assert {mid.partition for mid in keyless} == set(range(parts)), "keyless not spread"
    used = {mid.partition for items in sent.values() for mid, _ in items}
    assert len(used) > 1, "keys all landed on one partition"

    got = read_all(client, topic)
    all_ids = [mid for items in sent.values() for mid, _ in items] + keyless
    assert sorted(m.message_id for m in got) == sorted(all_ids)
    assert len(got) == len(all_ids)
    for m in got:
        assert m.topic == f"{topic}-partition-{m.message_id.partition}"
    for k, items in sent.items():
        mine = [(m.message_id, m.payload) for m in got if m.key == k.encode()]
        assert mine == items, f"order of key {k} not kept"
    # per partition, ids strictly increase
    for part in range(parts):
        ids = [m.message_id for m in got if m.message_id.partition == part]
        assert all(a < b for a, b in zip(ids, ids[1:]))

    # a single partition is a topic of its own
    p0 = read_all(client, f"{topic}-partition-0")
    assert [plain(m.message_id) for m in p0] == [plain(m.message_id) for m in got
                                                 if m.message_id.partition == 0]
    assert [m.payload for m in p0] == [m.payload for m in got if m.message_id.partition == 0]


# ---- has_message_available -----------------------------------------------------------------

def test_has_message_available_ends_read_loops(client, topic):
    client.admin.create_topic(topic)
    with client.create_reader(topic) as r:
        t0 = time.monotonic()
        assert r.has_message_available() is False
        assert time.monotonic() - t0 < 5
        with pytest.raises(errors.Timeout):
            r.read_next(timeout=0.5)

    with client.create_producer(topic) as p:
        ids = [p.send(f"m{i}") for i in range(10)]

    with client.create_reader(topic) as r:
        seen = []
        for _ in range(100):  # bounded; the loop must end on its own after 10
            if not r.has_message_available():
                break
            seen.append(r.read_next(timeout=10).message_id)
        assert seen == ids
        assert r.has_message_available() is False
        with client.create_producer(topic) as p:
            more = p.send("late")
        assert r.has_message_available() is True
        assert r.read_next(timeout=10).message_id == more
        assert r.has_message_available() is False

    with client.create_reader(topic, start="latest") as r:
        assert r.has_message_available() is False
    with client.create_reader(topic, start="latest", inclusive=True) as r:
        assert r.has_message_available() is True
        assert r.read_next(timeout=10).message_id == more
    with client.create_reader(topic, start=more) as r:
        assert r.has_message_available() is False
    with client.create_reader(topic, start=more, inclusive=True) as r:
        assert [m.message_id for m in r] == [more]

    # iteration on a partitioned topic with some empty partitions also ends
    client.admin.create_topic(topic + "-p", partitions=3)
    with client.create_reader(topic + "-p") as r:
        assert r.has_message_available() is False
    with client.create_producer(topic + "-p") as p:
        one = p.send("only", key="k")
    with client.create_reader(topic + "-p") as r:
        assert [m.message_id for m in r] == [one]


# ---- typed errors -----------------------------------------------------------------------------

def _expect(cls, fn, *args, **kwargs):
    with pytest.raises(errors.ShadowTopicError) as info:
        fn(*args, **kwargs)
    err = info.value
    assert type(err) is cls, f"expected {cls.__name__}, got {type(err).__name__}: {err}"
    assert err.reason == cls.__name__
    return err


def test_errors_are_typed_with_reason(client, topic):
    # TopicNotFound, everywhere a topic is named
    for fn in (client.admin.stats, client.admin.internal_stats, client.admin.get_policies,
               client.admin.delete_topic, client.admin.get_topic, client.create_producer,
               client.create_reader, client.admin.last_message_id):
        err = _expect(errors.TopicNotFound, fn, topic)
        assert err.code == grpc.StatusCode.NOT_FOUND
    _expect(errors.TopicNotFound, client.admin.set_policies, topic, Policies(max_message_size=10))

    # InvalidTopicName, client-side and from the server
    for bad in ("non-persistent://a/b/c", "a/b", "persistent://a/b", "", "bad name"):
        err = _expect(errors.InvalidTopicName, client.admin.create_topic, bad)
        assert isinstance(err, errors.InvalidArgument)
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT
        _expect(errors.InvalidTopicName, client.create_producer, bad)
    _expect(errors.InvalidTopicName, client.admin.create_topic, topic + "-partition-0")

    # TopicAlreadyExists
    client.admin.create_topic(topic)
    err = _expect(errors.TopicAlreadyExists, client.admin.create_topic, topic)
    assert err.code == grpc.StatusCode.ALREADY_EXISTS
    _expect(errors.TopicAlreadyExists, client.admin.create_topic, topic, partitions=3)

    # InvalidPolicies (validated by the broker)
    _expect(errors.InvalidPolicies, client.admin.set_policies, topic,
            Policies(ledger_max_entries=0))
    _expect(errors.InvalidPolicies, client.admin.create_topic, topic + "-2",
            policies=Policies(retention_size_bytes=-5))
    _expect(errors.TopicNotFound, client.admin.get_topic, topic + "-2")  # nothing created

    # MessageTooBig, from the broker's max_message_size
    client.admin.set_policies(topic, Policies(max_message_size=1024))
    assert client.admin.get_policies(topic).max_message_size == 1024
    with client.create_producer(topic) as p:
        err = _expect(errors.MessageTooBig, p.send, b"x" * 2000)
        assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        ok = p.send(b"x" * 500)
    assert [m.message_id for m in read_all(client, topic)] == [ok]

    # InvalidMessageId
    _expect(errors.InvalidMessageId, MessageId.parse, "junk")
    _expect(errors.InvalidMessageId, MessageId.deserialize, b"\xff\xff\xff")
    _expect(errors.InvalidMessageId, client.create_reader, topic, start="1:x")


def test_broker_keeps_serving_others_after_bad_requests(client, broker, topic):
    small, other = topic + "-small", topic + "-other"
    client.admin.create_topic(small, policies=Policies(max_message_size=1024))
    client.admin.create_topic(other)

    stop = threading.Event()
    good: list[MessageId] = []
    problems: list[BaseException] = []

    def keep_producing():
        try:
            with Client(broker.url, timeout=20) as c2, c2.create_producer(other) as p:
                for i in range(2000):  # bounded
                    if stop.is_set():
                        return
                    good.append(p.send(f"ok-{i}"))
        except BaseException as exc:  # noqa: BLE001 - checked below
            problems.append(exc)

    th = threading.Thread(target=keep_producing, daemon=True)
    th.start()
    try:
        wait_for(lambda: len(good) >= 5, 20, "the good producer to start")
        with client.create_producer(small, batch_max_messages=50) as bad:
            for _round in range(5):
                failures: list = []
                for i in range(50):
                    size = 4000 if i == 25 else 10  # one big message spoils its batch
                    bad.send_async(b"y" * size,
                                   callback=lambda mid, exc, out=failures: out.append(exc))
                bad.flush(timeout=30)
                assert len(failures) == 50
                assert all(isinstance(e, errors.MessageTooBig) for e in failures), failures[:3]
            after = bad.send(b"fine")  # the same producer stream still works
        before = len(good)
        wait_for(lambda: len(good) >= before + 5, 20, "the good producer to go on")
    finally:
        stop.set()
        th.join(30)
    assert not th.is_alive()
    assert not problems, problems
    assert all(a < b for a, b in zip(good, good[1:]))
    # nothing of the refused batches was stored
    assert [m.message_id for m in read_all(client, small)] == [after]
    assert [m.message_id for m in read_all(client, other)] == good


def test_malformed_produce_requests_get_in_band_errors(client, topic):
    """Raw Produce stream: bad requests get an error receipt each; the stream goes on."""
    client.admin.create_topic(topic)
    conn = client.admin._c  # the client's gRPC connection
    msg = common_pb2.Message(payload=b"good")
    reqs = [
        producer_pb2.ProduceRequest(topic="non-persistent://a/b/c", request_id=1,
                                    messages=[msg]),
        producer_pb2.ProduceRequest(topic=topic, request_id=2),            # no messages
        producer_pb2.ProduceRequest(topic=topic + "-missing", request_id=3, messages=[msg]),
        producer_pb2.ProduceRequest(topic=topic, request_id=4,
                                    messages=[common_pb2.Message(payload=b"z" * (2 << 20))]),
        producer_pb2.ProduceRequest(topic=topic, request_id=5, messages=[msg, msg]),
    ]
    receipts = list(conn.producer.Produce(iter(reqs), timeout=30))
    assert [r.request_id for r in receipts] == [1, 2, 3, 4, 5]
    reasons = [r.error.reason if r.HasField("error") else None for r in receipts]
    assert reasons == ["InvalidTopicName", "InvalidArgument", "TopicNotFound",
                       "MessageTooBig", None]
    assert receipts[4].count == 2
    got = read_all(client, topic)
    assert [m.payload for m in got] == [b"good", b"good"]
    assert got[0].message_id == MessageId(receipts[4].ledger_id, receipts[4].first_entry_id)


# ---- ledgers: rollover, retention -----------------------------------------------------------

def test_rollover_by_ledger_max_entries_reads_across_ledgers(client, topic):
    client.admin.create_topic(topic, policies=Policies(ledger_max_entries=1000))
    assert client.admin.get_policies(topic).ledger_max_entries == 1000
    n = 20_000
    payloads = [f"m{i:05d}".encode() for i in range(n)]
    with client.create_producer(topic, batch_max_messages=100) as p:
        ids = send_all(p, payloads, key="k")
    assert len({i.ledger_id for i in ids}) >= 3, "no rollover happened"
    # one producer's messages keep their order across ledger switches
    assert_increasing(ids, "ids of one producer across rollovers")

    def sealed():
        ls = ledgers(client, topic)
        return ls if sum(1 for l in ls if l["state"] == "SEALED") >= 3 and \
            ls[-1]["state"] == "OPEN" and \
            all(l["state"] == "SEALED" for l in ls[:-1]) else None
    ls = wait_for(sealed, 30, "the rolled ledgers to be sealed")
    assert sum(int(l["entries"]) for l in ls) == n
    ledger_ids = [int(l["ledgerId"]) for l in ls]
    assert ledger_ids == sorted(ledger_ids)
    assert {i.ledger_id for i in ids} <= set(ledger_ids)
    st = client.admin.internal_stats(topic)
    assert int(st["numberOfEntries"]) == n
    assert int(st["entriesAddedCounter"]) == n

    got = read_all(client, topic, limit=n)
    assert [m.message_id for m in got] == ids
    assert [m.payload for m in got] == payloads
    assert [m.sequence_id for m in got] == list(range(1, n + 1))
    # start in the middle of a sealed ledger, and exactly at a ledger boundary
    mid = ids[n // 2]
    assert [m.message_id for m in read_all(client, topic, start=mid, inclusive=True)] == \
        ids[n // 2:]
    boundary = next(k for k in range(1, n) if ids[k].ledger_id != ids[k - 1].ledger_id)
    assert [m.message_id for m in read_all(client, topic, start=ids[boundary - 1])] == \
        ids[boundary:]


def test_rollover_keeps_ledgers_close_to_ledger_max_entries(client, topic):
    """A full ledger takes no more entries (as in Pulsar): a ledger holds at most
    ledger_max_entries plus the one batch that crossed the limit."""
    max_entries, batch = 1000, 100
    client.admin.create_topic(topic, policies=Policies(ledger_max_entries=max_entries))
    with client.create_producer(topic, batch_max_messages=batch) as p:
        ids = send_all(p, [b"x" * 100] * 10_000)
    per_ledger: dict[int, int] = {}
    for i in ids:
        per_ledger[i.ledger_id] = per_ledger.get(i.ledger_id, 0) + 1
    assert max(per_ledger.values()) < max_entries + batch, \
        f"ledger_max_entries={max_entries} but ledgers hold {sorted(per_ledger.values())}"
    assert len(per_ledger) >= 10_000 // (max_entries + batch)


def test_retention_by_size_deletes_old_ledgers(client, topic):
    """Retention runs after each seal: the oldest sealed ledgers go while the topic is over
    retention_size_bytes; readers from earliest start at the first remaining ledger."""
    limit, per_ledger = 150_000, 500
    client.admin.create_topic(topic, policies=Policies(ledger_max_entries=per_ledger,
                                                       retention_size_bytes=limit))
    n = 6000
    payloads = [f"{i:06d}".encode() + b"r" * 100 for i in range(n)]
    with client.create_producer(topic, batch_max_messages=50, max_inflight=2) as p:
        ids = send_all(p, payloads)
    assert len({i.ledger_id for i in ids}) >= 4

    # retention already ran after the seals during the produce
    wait_for(lambda: int(ledgers(client, topic)[0]["ledgerId"]) > ids[0].ledger_id, 20,
               "retention after a seal to delete the first ledger")

    # seal the tail too: the retention after that seal leaves the topic within its limit
    client.admin.roll_ledger(topic)

    def settled():
        ls = ledgers(client, topic)
        if not ls or ls[-1]["state"] != "OPEN" or int(ls[-1]["entries"]) != 0:
            return None
        if any(l["state"] != "SEALED" for l in ls[:-1]):
            return None  # seals (and the retention after each) still running
        return ls if sum(int(l["size"]) for l in ls) <= limit else None
    ls = wait_for(settled, 30, "retention to bring the topic under its size limit")
    sealed = ls[:-1]
    assert sealed, "retention deleted every ledger although one fits in the limit"
    total = sum(int(l["size"]) for l in sealed)
    biggest = max(int(l["size"]) for l in sealed)
    assert total + biggest > limit, f"retention deleted more than needed ({total} bytes left)"

    first_lid = int(sealed[0]["ledgerId"])
    remaining = [i for i in ids if i.ledger_id >= first_lid]
    assert 0 < len(remaining) < n
    assert sum(int(l["entries"]) for l in sealed) == len(remaining)
    st = client.admin.internal_stats(topic)
    assert int(st["numberOfEntries"]) == len(remaining)

    got = read_all(client, topic, limit=n)
    assert got[0].message_id == MessageId(first_lid, 0)
    assert [m.message_id for m in got] == remaining
    assert [m.payload for m in got] == payloads[n - len(remaining):]
    # a reader asked to start at a deleted id starts at the first remaining entry
    old = read_all(client, topic, start=ids[0], inclusive=True, limit=n)
    assert [m.message_id for m in old] == remaining


def test_entries_added_counter_is_exact_with_retention_and_truncate(client, topic):
    """entriesAddedCounter counts entries ever added: retention running beside truncate
    must not count a deleted ledger twice."""
    client.admin.create_topic(topic, policies=Policies(retention_size_bytes=1))
    produced = 0
    deleted = 0
    with client.create_producer(topic) as p:
        for _ in range(10):
            send_all(p, [b"q" * 10] * 10)
            produced += 10
            deleted += int(client.admin.truncate(topic).get("entriesDeleted", 0))
    time.sleep(0.5)  # let any retention task scheduled by the last seal finish
    st = client.admin.internal_stats(topic)
    assert int(st.get("numberOfEntries", 0)) == 0
    assert deleted <= produced
    assert int(st["entriesAddedCounter"]) == produced, st


# ---- restart ---------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["terminate", "kill"])
@pytest.mark.own_broker
def test_broker_restart_keeps_every_message(broker, topic, how):
    with Client(broker.url, timeout=20) as c:
        c.admin.create_topic(topic)
        c.admin.create_topic(topic + "-p", partitions=2)
        with c.create_producer(topic) as p:
            ids = send_all(p, [f"a{i}".encode() for i in range(300)], key="k")
            c.admin.roll_ledger(topic)  # some entries in Parquet, some only in the WAL
            ids += send_all(p, [f"b{i}".encode() for i in range(300)], key="k")
        with c.create_producer(topic + "-p") as p:
            pids = [p.send(f"p{i}", key=f"k{i % 5}") for i in range(40)]
        assert len({i.ledger_id for i in ids}) == 2

    if how == "terminate":
        broker.terminate()
    else:
        broker.kill()
    broker.start(timeout=60)

    with Client(broker.url, timeout=20) as c:
        got = read_all(c, topic)
        assert [m.message_id for m in got] == ids
        assert [m.payload for m in got] == [f"a{i}".encode() for i in range(300)] + \
            [f"b{i}".encode() for i in range(300)]
        assert all(m.key == b"k" for m in got)
        assert sorted(m.message_id for m in read_all(c, topic + "-p")) == sorted(pids)
        assert c.admin.last_message_id(topic) == ids[-1]
        st = c.admin.internal_stats(topic)
        assert int(st["numberOfEntries"]) == 600
        # producing goes on after the old ids
        with c.create_producer(topic) as p:
            new = p.send("after-restart")
        assert new > ids[-1]
        assert [m.message_id for m in read_all(c, topic)] == ids + [new]


@pytest.mark.own_broker
def test_same_client_reads_after_broker_restart(broker, topic):
    """A Client that read before a broker restart can create readers after it (its
    producers already reconnect)."""
    with Client(broker.url, timeout=20) as c:
        c.admin.create_topic(topic)
        with c.create_producer(topic) as p:
            ids = [p.send(f"m{i}") for i in range(5)]
        assert [m.message_id for m in read_all(c, topic)] == ids

        broker.terminate()
        broker.start(timeout=60)

        with c.create_producer(topic) as p:
            ids.append(p.send("after"))
        assert [m.message_id for m in read_all(c, topic)] == ids


def test_many_readers_on_one_stream_each_get_their_own_view(client, topic):
    """Readers of one client share a stream and decoded messages, but each reads from its
    own position, at its own pace, with ids and partitions of its own topic."""
    client.admin.create_topic(topic)
    with client.create_producer(topic) as p:
        ids = [p.send(f"m{i}".encode(), key=f"k{i}") for i in range(60)]
    readers = [client.create_reader(topic, receiver_queue_size=7) for _ in range(5)]
    late = client.create_reader(topic, start=ids[19])
    slow = readers[0]
    assert slow.read_next(10).payload == b"m0"           # one reader barely moves ...
    for r in readers[1:]:                                # ... the others read everything
        assert [m.payload for m in r] == [f"m{i}".encode() for i in range(60)]
    assert [m.message_id for m in late] == ids[20:]
    rest = [slow.read_next(10).payload for _ in range(59)]
    assert rest == [f"m{i}".encode() for i in range(1, 60)]
    assert not slow.has_message_available()
    for r in readers + [late]:
        r.close()


def test_received_messages_are_immutable_so_readers_can_share_them(client, topic):
    client.admin.create_topic(topic)
    with client.create_producer(topic) as p:
        p.send(b"v", properties={"a": "b"})
    with client.create_reader(topic) as r1, client.create_reader(topic) as r2:
        m1, m2 = r1.read_next(10), r2.read_next(10)
    assert m1 == m2 and m1.properties == {"a": "b"}
    with pytest.raises(TypeError):
        m1.properties["a"] = "changed"
    assert m2.properties["a"] == "b" and m1.to_dict()["properties"] == {"a": "b"}
