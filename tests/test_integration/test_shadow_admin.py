"""Shadow topics' admin lifecycle (docs/BEHAVIOURS.md S1-S6) and R4, driven as a user drives them:
the `shadowtopic` CLI and the Python client against a real broker process and real etcd.
The CLI's commands run in this process (`cli`: the console script's `main`,
support/cli_inprocess.py; test_shadow_cli.py runs the installed script on shadows).
What must not change is checked where it lives: etcd's keys (values and mod revisions) and
the files under the broker's storage root, byte for byte."""
from __future__ import annotations

import hashlib
import json
import os
import re
import time

import grpc
import pytest
from support.cli_inprocess import runner
from support.etcd_support import etcd_prefix, etcd_put

from shadowtopic.client import errors
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.storage import topic_dir
from shadowtopic.metadata import keys
from shadowtopic.pb.storage.v1 import cursors_pb2 as cpb
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import admin_pb2 as apb
from shadowtopic.pb.v1 import admin_pb2_grpc, producer_pb2, producer_pb2_grpc

SHADOW, SOURCE = mpb.TopicKind.SHADOW, mpb.TopicKind.SOURCE


# ---- helpers ---------------------------------------------------------------------------------

@pytest.fixture
def cli(broker):
    """The CLI in this process, against the test broker."""
    return runner(broker.url)


def ok(res) -> str:
    assert res.returncode == 0, f"exit {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    return res.stdout


def jdoc(res):
    return json.loads(ok(res))


def one_line_error(res, expected: str) -> str:
    """exit 1 and exactly one stderr line, `error: <expected>`."""
    assert res.returncode == 1, f"exit {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0] == f"error: {expected}", lines[0]
    return lines[0]


def etcd(etcd_server, prefix: str) -> dict[str, tuple[bytes, int]]:
    """key -> (value, mod_revision) of every key under `prefix`."""
    return {k: (kv.value, kv.mod_revision) for k, kv in etcd_prefix(etcd_server, prefix).items()}


def info_of(etcd_server, topic: str) -> mpb.TopicInfo | None:
    kv = etcd(etcd_server, keys.topic_info(TopicName.parse(topic))).get(
        keys.topic_info(TopicName.parse(topic)))
    return mpb.TopicInfo.FromString(kv[0]) if kv else None


def shadow_list(etcd_server, source: str) -> list[str] | None:
    key = keys.shadows(TopicName.parse(source))
    kv = etcd(etcd_server, key).get(key)
    return list(mpb.ShadowList.FromString(kv[0]).shadows) if kv else None


def storage_root(broker) -> str:
    return os.path.join(broker.data_dir, "storage")


def files(broker, of: str | None = None) -> dict[str, str]:
    """relative path -> sha256 of every file under the broker's storage root (with `of`, a
    topic: only the files of its namespace, which its test has to itself; another test's
    cursor flush on the shared broker may land at any time)."""
    root = storage_root(broker)
    mark = f"{os.sep}{TopicName.parse(of).namespace}{os.sep}" if of else ""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            if n.startswith(".disk-probe-"):  # a broker's write probe (source/ledger/disk.py)
                continue
            path = os.path.join(d, n)
            if mark and mark not in path:
                continue
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def ns_prefix(topic: str) -> str:
    return keys.topics_prefix(TopicName.parse(topic).namespace_name)


def ns_state(etcd_server, topic: str) -> dict[str, tuple[bytes, int]]:
    """Every key of the topic's namespace: topics and their ownership."""
    ns = TopicName.parse(topic).namespace_name
    owners = f"{keys.ROOT}/clusters/standalone/ownership/persistent/{ns}/"
    return {**etcd(etcd_server, ns_prefix(topic)), **etcd(etcd_server, owners)}


def source_with_data(client, topic: str, sealed: int = 40, open_: int = 15,
                     partitions: int = 0) -> int:
    """A source topic holding `sealed` messages in sealed ledgers and `open_` more in an
    open one (per partition, keyless round robin); returns how many it holds."""
    client.admin.create_topic(topic, partitions)
    with client.create_producer(topic) as p:
        for i in range(sealed * max(partitions, 1)):
            p.send(f"s{i}".encode())
        p.flush()
        for part in ([f"{topic}-partition-{i}" for i in range(partitions)] or [topic]):
            client.admin.roll_ledger(part)
        for i in range(open_ * max(partitions, 1)):
            p.send(f"o{i}".encode())
    return (sealed + open_) * max(partitions, 1)


def read_all(client, topic: str) -> list[str]:
    with client.create_reader(topic, start="earliest") as r:
        return [m.payload.decode() for m in r]


# ---- S1 ----------------------------------------------------------------------------------------

def test_s1_create_a_shadow_lists_it_and_writes_no_ledger(cli, client, broker, topic,
                                                          etcd_server):
    shadow = f"{topic}-shadow"
    n = source_with_data(client, topic)
    before_files = files(broker)
    assert any(p.endswith(".parquet") for p in before_files)   # the source has data to share
    t0 = time.time() * 1000

    meta = jdoc(cli("topics", "create-shadow-topic", shadow, "--source", topic,
                    "-p", "team=search", "-p", "tier=gold", "-o", "json"))
    assert meta == {"topic": shadow, "kind": "shadow", "partitions": 0, "source": topic,
                    "properties": {"team": "search", "tier": "gold"},
                    "policies": meta["policies"]}

    assert jdoc(cli("topics", "get-shadow-topics", topic, "-o", "json")) == [shadow]
    assert shadow in ok(cli("topics", "get-shadow-topics", topic))
    assert ok(cli("topics", "get-shadow-source", shadow)) == topic + "\n"
    assert jdoc(cli("topics", "get-shadow-source", shadow, "-o", "json")) == {
        "topic": shadow, "source": topic}
    assert client.admin.get_shadow_topics(topic) == [shadow]
    assert client.admin.get_shadow_source(shadow) == topic
    assert client.admin.get_shadow_topics(shadow) == []          # a shadow has no shadows

    got = client.admin.get_topic(shadow)
    assert (got.kind, got.source, got.partitions, got.properties) == (
        "shadow", topic, 0, {"team": "search", "tier": "gold"})
    assert client.admin.get_topic(topic).kind == "source"
    listed = {r["topic"]: r for r in jdoc(cli("topics", "list", TopicName.parse(topic)
                                              .namespace_name, "-o", "json"))}
    assert listed == {topic: {"topic": topic, "kind": "source", "partitions": 0, "source": ""},
                      shadow: {"topic": shadow, "kind": "shadow", "partitions": 0,
                               "source": topic}}

    # etcd: the shadow is its info and its name in the source's list, nothing else
    s = TopicName.parse(shadow)
    assert list(etcd(etcd_server, keys.topic_prefix(s))) == [keys.topic_info(s)]
    info = info_of(etcd_server, shadow)
    assert (info.name, info.kind, info.source, dict(info.properties), info.partitions,
            info.partition_index) == (shadow, SHADOW, topic,
                                      {"team": "search", "tier": "gold"}, 0, -1)
    assert t0 - 1000 <= info.created_ms <= time.time() * 1000 + 1000
    assert shadow_list(etcd_server, topic) == [shadow]
    assert not etcd(etcd_server, keys.ownership("standalone", s))
    # storage: not one file more (no ledger, no WAL, no directory of the shadow's)
    assert files(broker) == before_files
    assert not [d for d, _, _ in os.walk(storage_root(broker)) if topic_dir(s) in d]
    # and the source is as it was
    assert len(read_all(client, topic)) == n
    assert client.admin.stats(topic)["msgInCounter"] == n


# ---- S2 ----------------------------------------------------------------------------------------

def test_s2_refused_shadows_create_nothing(cli, client, broker, topic, etcd_server):
    other = f"{topic}-other"
    client.admin.create_topic(topic)
    client.admin.create_topic(other)
    client.admin.create_shadow_topic(f"{topic}-s", topic)
    ns = TopicName.parse(topic).namespace_name
    before = ns_state(etcd_server, topic)
    missing = f"persistent://{ns}/missing"

    one_line_error(cli("topics", "create-shadow-topic", f"{topic}-x", "--source", missing),
                   f"TopicNotFound: source topic {missing} does not exist")
    one_line_error(cli("topics", "create-shadow-topic", topic, "--source", topic),
                   f"InvalidArgument: topic {topic} cannot be a shadow of itself")
    one_line_error(cli("topics", "create-shadow-topic", f"{topic}-x", "--source",
                       f"{topic}-s"),
                   f"NotAllowed: {topic}-s is itself a shadow of {topic}: the source of a "
                   "shadow must be a source topic")
    one_line_error(cli("topics", "create-shadow-topic", other, "--source", topic),
                   f"TopicAlreadyExists: topic {other} already exists")
    one_line_error(cli("topics", "create-shadow-topic", f"{topic}-partition-0", "--source",
                       topic),
                   f"InvalidTopicName: {topic}-partition-0: names ending in -partition-<n> "
                   "are reserved for partitions")
    res = cli("topics", "create-shadow-topic", f"non-persistent://{ns}/x", "--source", topic)
    assert "InvalidTopicName" in one_line_error(res, res.stderr.strip()[len("error: "):])
    with pytest.raises(errors.TopicNotFound):
        client.admin.create_shadow_topic(f"{topic}-x", missing)

    # the broker's own answer (not only the client's check) for a non-persistent name
    with grpc.insecure_channel(broker.url) as ch:
        stub = admin_pb2_grpc.AdminStub(ch)
        for shadow, source in [(f"non-persistent://{ns}/x", topic),
                               (f"{topic}-x", f"non-persistent://{ns}/t")]:
            with pytest.raises(grpc.RpcError) as exc:
                stub.CreateShadowTopic(apb.CreateShadowTopicRequest(shadow=shadow,
                                                                    source=source), timeout=10)
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert ("x-shadowtopic-reason", "InvalidTopicName") in exc.value.trailing_metadata()
        with pytest.raises(grpc.RpcError) as exc:
            stub.CreateShadowTopic(apb.CreateShadowTopicRequest(shadow=f"{topic}-x",
                                                                source=missing), timeout=10)
        assert exc.value.code() == grpc.StatusCode.NOT_FOUND

    assert ns_state(etcd_server, topic) == before             # not one key written or touched
    assert client.admin.get_shadow_topics(topic) == [f"{topic}-s"]
    assert client.admin.get_shadow_topics(other) == []
    with pytest.raises(errors.TopicNotFound, match="does not exist"):
        client.admin.get_shadow_topics(missing)
    with pytest.raises(errors.NotAllowed, match=f"{topic} is not a shadow topic"):
        client.admin.get_shadow_source(topic)
    one_line_error(cli("topics", "get-shadow-source", topic),
                   f"NotAllowed: {topic} is not a shadow topic")


# ---- S3 ----------------------------------------------------------------------------------------

def test_s3_the_link_to_the_source_cannot_change(cli, client, topic, etcd_server):
    shadow, b = f"{topic}-shadow", f"{topic}-b"
    client.admin.create_topic(topic)
    client.admin.create_topic(b)
    client.admin.create_shadow_topic(shadow, topic, {"k": "v"})
    link = etcd(etcd_server, keys.topic_info(TopicName.parse(shadow)))

    one_line_error(cli("topics", "create-shadow-topic", shadow, "--source", b),
                   f"TopicAlreadyExists: topic {shadow} already exists as a shadow of {topic} "
                   "(the source of a shadow cannot change)")
    with pytest.raises(errors.TopicAlreadyExists):
        client.admin.create_shadow_topic(shadow, topic)           # the same link again
    one_line_error(cli("topics", "create", shadow),
                   f"TopicAlreadyExists: topic {shadow} already exists")
    assert etcd(etcd_server, keys.topic_info(TopicName.parse(shadow))) == link

    # policies of a shadow change; its kind, source and properties do not
    pol = jdoc(cli("topics", "set-policies", shadow, "--max-subscriptions", "7", "-o", "json"))
    assert pol["max_subscriptions"] == 7
    info = info_of(etcd_server, shadow)
    assert (info.kind, info.source, dict(info.properties)) == (SHADOW, topic, {"k": "v"})
    assert info.policies.max_subscriptions == 7
    assert client.admin.get_shadow_source(shadow) == topic
    assert shadow_list(etcd_server, topic) == [shadow]
    assert shadow_list(etcd_server, b) is None

    # the contract has no call that sets or moves a shadow's source
    rpcs = set(apb.DESCRIPTOR.services_by_name["Admin"].methods_by_name)
    assert {r for r in rpcs if "Shadow" in r} == {
        "CreateShadowTopic", "DeleteShadowTopic", "GetShadowTopics", "GetShadowSource"}


# ---- S4 ----------------------------------------------------------------------------------------

def test_s4_a_partitioned_source_gets_a_partitioned_shadow(cli, client, broker, topic,
                                                           etcd_server):
    shadow = f"{topic}-shadow"
    source_with_data(client, topic, sealed=5, open_=3, partitions=3)
    before_files = files(broker)
    meta = jdoc(cli("topics", "create-shadow-topic", shadow, "-s", topic, "-o", "json"))
    assert (meta["kind"], meta["partitions"], meta["source"]) == ("shadow", 3, topic)
    assert client.admin.get_topic(shadow).partitions == 3

    for i in range(3):
        part = info_of(etcd_server, f"{shadow}-partition-{i}")
        assert (part.kind, part.source, part.partition_of, part.partition_index) == (
            SHADOW, f"{topic}-partition-{i}", shadow, i)
        p = TopicName.parse(f"{shadow}-partition-{i}")
        assert list(etcd(etcd_server, keys.topic_prefix(p))) == [keys.topic_info(p)]
        assert client.admin.get_shadow_source(f"{shadow}-partition-{i}") == \
            f"{topic}-partition-{i}"
    assert info_of(etcd_server, f"{shadow}-partition-3") is None
    assert client.admin.get_shadow_topics(f"{topic}-partition-1") == [f"{shadow}-partition-1"]
    assert shadow_list(etcd_server, topic) == [shadow]
    assert files(broker) == before_files

    with client.create_producer(shadow) as p:                     # R4, partition by partition
        with pytest.raises(errors.NotAllowed) as exc:
            p.send(b"x", key="k")
    assert re.fullmatch(rf"topic {shadow}-partition-(\d) is a read-only shadow of "
                        rf"{topic}-partition-\1", exc.value.message), exc.value.message
    with pytest.raises(errors.NotAllowed) as exc:
        client.admin.truncate(shadow)
    assert exc.value.message == f"topic {shadow} is a read-only shadow of {topic}"
    assert files(broker) == before_files

    ok(cli("topics", "delete-shadow-topic", shadow))
    assert not [k for k in etcd(etcd_server, ns_prefix(topic)) if "-shadow" in k]
    assert shadow_list(etcd_server, topic) is None
    assert files(broker) == before_files


def test_s4_many_partitions_are_created_and_deleted_in_chunks(client, topic, etcd_server):
    """120 partitions: more than one etcd transaction of 100 operations holds."""
    shadow = f"{topic}-shadow"
    client.admin.create_topic(topic, 120)
    client.admin.create_shadow_topic(shadow, topic)
    infos = {k: mpb.TopicInfo.FromString(v) for k, (v, _) in
             etcd(etcd_server, ns_prefix(topic)).items() if k.endswith("/info")}
    shadows = {i.name: i for i in infos.values() if i.kind == SHADOW}
    assert len(shadows) == 121
    assert all(shadows[f"{shadow}-partition-{i}"].source == f"{topic}-partition-{i}"
               for i in range(120))
    assert client.admin.get_shadow_topics(topic) == [shadow]
    client.admin.delete_topic(shadow)                            # `topics delete` of a shadow
    assert [k for k in etcd(etcd_server, ns_prefix(topic)) if "-shadow" in k] == []
    client.admin.delete_topic(topic)
    assert etcd(etcd_server, ns_prefix(topic)) == {}


# ---- S5 ----------------------------------------------------------------------------------------

def test_s5_a_source_with_shadows_is_not_deleted(cli, client, broker, topic, etcd_server):
    s1, s2 = f"{topic}-s1", f"{topic}-s2"
    n = source_with_data(client, topic)
    client.admin.create_shadow_topic(s1, topic)
    client.admin.create_shadow_topic(s2, topic)
    before = etcd(etcd_server, ns_prefix(topic))
    before_files = files(broker)

    one_line_error(cli("topics", "delete", topic),
                   f"HasShadowTopics: {topic} has shadow topics: {s1}, {s2}; delete them first")
    with pytest.raises(errors.HasShadowTopics) as exc:
        client.admin.delete_topic(topic, force=True)
    assert exc.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert s1 in exc.value.message and s2 in exc.value.message
    assert etcd(etcd_server, ns_prefix(topic)) == before
    assert files(broker) == before_files
    assert len(read_all(client, topic)) == n

    ok(cli("topics", "delete-shadow-topic", s1))
    one_line_error(cli("topics", "delete", topic),
                   f"HasShadowTopics: {topic} has shadow topics: {s2}; delete them first")
    assert ok(cli("topics", "delete", s2)) == f"deleted {s2}\n"
    assert ok(cli("topics", "delete", topic)) == f"deleted {topic}\n"
    assert etcd(etcd_server, ns_prefix(topic)) == {}
    assert not [p for p in files(broker) if topic_dir(TopicName.parse(topic)) in p]


# ---- S6 ----------------------------------------------------------------------------------------

def _shadow_subscription(etcd_server, broker, shadow: str, name: str) -> str:
    """What a shadow broker leaves for a subscription of `shadow`: its meta key, the cursor
    pointer and a cursor file (this source broker does not serve shadows). Returns the file."""
    t = TopicName.parse(shadow)
    meta = mpb.SubscriptionMeta(name=name, type=mpb.SubscriptionType.SHARED, created_ms=1)
    etcd_put(etcd_server, keys.subscription(t, name), meta.SerializeToString())
    rel = f"cursors/{topic_dir(t)}/{1:020d}-abcd0123.full"
    path = os.path.join(storage_root(broker), rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"cursor bytes")
    ptr = cpb.CursorPointer(sequence=1)
    ptr.full.path = rel
    etcd_put(etcd_server, keys.cursors(t), ptr.SerializeToString())
    return rel


def test_s6_deleting_a_shadow_never_touches_the_source(cli, client, broker, topic,
                                                       etcd_server):
    s1, s2 = f"{topic}-s1", f"{topic}-s2"
    n = source_with_data(client, topic)
    client.admin.create_subscription(topic, "src-sub", "earliest")
    time.sleep(2.5)                      # past the source's cursor flush: its keys stay put
    client.admin.create_shadow_topic(s1, topic)
    client.admin.create_shadow_topic(s2, topic)
    f1 = _shadow_subscription(etcd_server, broker, s1, "a")
    f2 = _shadow_subscription(etcd_server, broker, s2, "a")
    src = TopicName.parse(topic)
    # the replicators' positions (source side) of both shadows
    r1, r2 = (keys.replicator(src, TopicName.parse(s)) for s in (s1, s2))
    etcd_put(etcd_server, r1, b"1:5")
    etcd_put(etcd_server, r2, b"1:7")
    source_keys = etcd(etcd_server, keys.topic_prefix(src))
    assert keys.ledgers(src) in source_keys and keys.subscription(src, "src-sub") in source_keys
    s2_keys = etcd(etcd_server, keys.topic_prefix(TopicName.parse(s2)))
    assert len(s2_keys) == 3
    before_files = files(broker)
    src_files = {p: h for p, h in before_files.items() if f"/{topic_dir(src)}/" in p}
    assert [p for p in src_files if p.endswith(".parquet")] and \
        [p for p in src_files if p.endswith(".wal")]

    assert ok(cli("topics", "delete-shadow-topic", s1)) == f"deleted shadow topic {s1}\n"

    assert etcd(etcd_server, keys.topic_prefix(TopicName.parse(s1))) == {}   # info, sub, cursors
    after = files(broker)
    assert f1 not in after and f2 in after
    assert after == {p: h for p, h in before_files.items() if p != f1}      # only its cursors
    after_keys = etcd(etcd_server, keys.topic_prefix(src))
    shadows_key = keys.shadows(src)
    assert {k: v for k, v in after_keys.items() if k != shadows_key} == \
        {k: v for k, v in source_keys.items() if k not in (shadows_key, r1)}  # byte + revision
    assert r1 not in after_keys and after_keys[r2][0] == b"1:7"
    assert shadow_list(etcd_server, topic) == [s2]
    assert etcd(etcd_server, keys.topic_prefix(TopicName.parse(s2))) == s2_keys
    assert len(read_all(client, topic)) == n

    client.admin.delete_topic(s2)                                # `topics delete` does the same
    assert f2 not in files(broker)
    assert etcd(etcd_server, keys.topic_prefix(TopicName.parse(s2))) == {}
    assert shadow_list(etcd_server, topic) is None
    assert {k: v for k, v in etcd(etcd_server, keys.topic_prefix(src)).items()
            if k != shadows_key} == {k: v for k, v in source_keys.items()
                                     if k not in (shadows_key, r1, r2)}
    assert files(broker) == {p: h for p, h in before_files.items() if p not in (f1, f2)}
    assert src_files
    with client.subscribe(topic, "src-sub") as c:                # the source's cursor is intact
        assert c.receive(timeout=10).payload == b"s0"
    one_line_error(cli("topics", "delete-shadow-topic", topic),
                   f"NotAllowed: {topic} is not a shadow topic (topics delete deletes a "
                   "source topic)")
    one_line_error(cli("topics", "delete-shadow-topic", s1),
                   f"TopicNotFound: topic {s1} does not exist")


# ---- R4 ----------------------------------------------------------------------------------------

def test_r4_a_shadow_is_read_only_and_nothing_is_written(cli, client, broker, topic,
                                                         etcd_server):
    shadow = f"{topic}-shadow"
    n = source_with_data(client, topic)
    client.admin.create_shadow_topic(shadow, topic)
    before = ns_state(etcd_server, topic)
    before_files = files(broker, topic)
    assert before_files  # the source's sealed ledger at least
    refused = f"topic {shadow} is a read-only shadow of {topic}"

    one_line_error(cli("produce", shadow, "-m", "x", "-n", "3"),
                   f"NotAllowed: {refused} (0 of 3 messages acknowledged before the error)")
    with client.create_producer(shadow) as p:
        with pytest.raises(errors.NotAllowed) as exc:
            p.send(b"x")
    assert exc.value.message == refused
    with grpc.insecure_channel(broker.url) as ch:                 # the receipt, on the wire
        produce = producer_pb2_grpc.ProducerStub(ch).Produce
        req = producer_pb2.ProduceRequest(topic=shadow, request_id=7, producer_name="raw")
        req.messages.add(payload=b"x")
        [receipt] = list(produce(iter([req]), timeout=10))
    assert (receipt.request_id, receipt.error.code, receipt.error.reason,
            receipt.error.message) == (7, "FAILED_PRECONDITION", "NotAllowed", refused)

    one_line_error(cli("topics", "roll-ledger", shadow), f"NotAllowed: {refused}")
    one_line_error(cli("topics", "truncate", shadow), f"NotAllowed: {refused}")
    with pytest.raises(errors.NotAllowed, match="served by a shadow broker"):
        read_all(client, shadow)
    with pytest.raises(errors.NotAllowed, match="served by a shadow broker"):
        client.admin.create_subscription(shadow, "sub")

    stats = client.admin.stats(shadow)                            # asking works, loads nothing
    assert (stats["kind"], stats["source"], stats["storageSize"]) == ("SHADOW", topic, 0)
    assert client.admin.stats(topic)["msgInCounter"] == n

    assert ns_state(etcd_server, topic) == before   # no ownership, epoch, ledger list: nothing
    assert files(broker, topic) == before_files
    assert len(read_all(client, topic)) == n
