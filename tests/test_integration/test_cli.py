"""The `shadowtopic` CLI driven the way a user drives it: real broker process, real etcd,
output parsed as a script would parse it. The quickstart and a dead broker URL run the
installed console script (`binary_cli`); the other tests run their commands in this process
(`cli`: the script's `main`, support/cli_inprocess.py), saving a second of Python start-up on
each of some eighty commands.

Conventions checked throughout: `-o json` prints JSON (one document, or one object per line
for `read`); every error is exactly one line on stderr and exit code 1, with no traceback.
"""
from __future__ import annotations

import json
import threading
import time

import google_crc32c
import pytest
from support.cli_inprocess import runner

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client
from shadowtopic.core.message_id import MessageId

# ---- helpers ------------------------------------------------------------------------------

@pytest.fixture
def cli(broker):
    """This module's commands in this process (see the module's docstring)."""
    return runner(broker.url)


def ok(res) -> str:
    """stdout of a command that must succeed."""
    assert res.returncode == 0, f"exit {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    return res.stdout


def jdoc(res):
    """The one JSON document a `-o json` command printed."""
    return json.loads(ok(res))


def jlines(res) -> list[dict]:
    """The JSON-lines a `read ... -o json` printed (every non-empty line must parse)."""
    out = ok(res)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def one_line_error(res, reason: str) -> str:
    """The command failed as the CLI promises: exit 1, one stderr line naming `reason`."""
    assert res.returncode == 1, (f"expected exit 1, got {res.returncode}\nstdout: {res.stdout}\n"
                                 f"stderr: {res.stderr}")
    lines = res.stderr.splitlines()
    assert len(lines) == 1, f"expected exactly one stderr line, got {len(lines)}:\n{res.stderr}"
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout
    assert reason in lines[0], f"{reason!r} not in {lines[0]!r}"
    return lines[0]


def mid(text: str) -> MessageId:
    return MessageId.parse(text)


def internal(cli, topic: str) -> dict:
    return jdoc(cli("topics", "stats-internal", topic, "-o", "json"))


# ---- docs/CLI.md's first commands (100,000 messages) --------------------------------------

def test_quickstart_100k_messages_round_trip(binary_cli, topic):
    cli = binary_cli
    meta = jdoc(cli("topics", "create", topic, "-o", "json"))
    assert meta["topic"] == topic

    out = ok(cli("produce", topic, "-k", "user-1", "-m", "hello", "-n", "100000"))
    assert "100000" in out and "produced" in out, out

    msgs = jlines(cli("read", topic, "--until-end", "-o", "json"))
    assert len(msgs) == 100_000
    ids = [mid(m["message_id"]) for m in msgs]
    assert all(a < b for a, b in zip(ids, ids[1:])), "message ids not strictly increasing"
    assert len(set(ids)) == 100_000
    assert all(m["key"] == "user-1" and m["payload"] == "hello" for m in msgs)
    assert all(m["topic"] == topic for m in msgs)
    # the CLI producer numbers its messages 1..N
    assert [m["sequence_id"] for m in msgs[:3]] == [1, 2, 3]
    assert msgs[-1]["sequence_id"] == 100_000

    head = ok(cli("read", topic, "-n", "3"))
    lines = [ln for ln in head.splitlines() if ln.strip()]
    assert len(lines) == 3, head
    for line, m in zip(lines, msgs[:3]):
        assert line.split("\t")[:3] == [m["message_id"], "user-1", "hello"]

    # the produce JSON summary names the first and last id the reader saw
    summary = jdoc(cli("produce", topic, "-m", "tail", "-o", "json"))
    assert summary["produced"] == 1
    assert mid(summary["first_message_id"]) == mid(summary["last_message_id"]) > ids[-1]


# ---- JSON output of admin commands ------------------------------------------------------------

def test_json_output_of_admin_commands(cli, topic):
    meta = jdoc(cli("topics", "create", topic, "-p", "team=core", "-o", "json"))
    assert meta["topic"] == topic
    assert meta["kind"] == "source"
    assert meta["partitions"] == 0
    assert meta["properties"] == {"team": "core"}
    assert meta["policies"]["max_message_size"] == 1 << 20  # the effective defaults
    assert meta["policies"]["retention_size_bytes"] == -1

    ok(cli("produce", topic, "-m", "a", "-m", "bb", "-n", "5", "-p", "x=1"))

    listed = jdoc(cli("topics", "list", "-o", "json"))
    assert isinstance(listed, list)
    row = next(r for r in listed if r["topic"] == topic)
    assert row["kind"] == "source" and row["partitions"] == 0
    ns = topic.split("://")[1].rsplit("/", 1)[0]
    only = jdoc(cli("topics", "list", ns, "-o", "json"))
    assert [r["topic"] for r in only] == [topic]

    stats = jdoc(cli("topics", "stats", topic, "-o", "json"))
    for name in ("msgInCounter", "bytesInCounter", "msgOutCounter", "storageSize",
                 "msgRateIn", "msgRateOut", "averageMsgSize", "ownerBroker"):
        assert name in stats, f"stats lack {name}: {sorted(stats)}"
    assert int(stats["msgInCounter"]) == 10
    assert int(stats["storageSize"]) > 0
    assert int(stats["bytesInCounter"]) > 0
    assert "msg_in_counter" not in stats  # Pulsar's camelCase names, not the proto names

    st = internal(cli, topic)
    assert int(st["numberOfEntries"]) == 10
    assert st["ledgers"], st
    led = st["ledgers"][-1]
    for name in ("ledgerId", "state", "entries"):
        assert name in led, led
    assert led["state"] == "OPEN"
    assert int(led["entries"]) == 10
    last = mid(st["lastConfirmedEntry"])
    assert last.ledger_id == int(led["ledgerId"]) and last.entry_id == 9

    pol = jdoc(cli("topics", "get-policies", topic, "-o", "json"))
    assert pol["max_message_size"] == 1 << 20
    assert pol["retention_time_seconds"] == -1
    assert "ledger_max_entries" in pol

    look = jdoc(cli("topics", "lookup", topic, "-o", "json"))
    assert look["brokerUrl"] == stats["ownerBroker"]

    lm = jdoc(cli("topics", "last-message-id", topic, "-o", "json"))
    assert mid(lm["message_id"]) == last


def test_max_message_size_policy_rejects_big_message(cli, topic):
    ok(cli("topics", "create", topic))
    pol = jdoc(cli("topics", "set-policies", topic, "--max-message-size", "1K", "-o", "json"))
    assert pol["max_message_size"] == 1024
    assert jdoc(cli("topics", "get-policies", topic, "-o", "json"))["max_message_size"] == 1024

    res = cli("produce", topic, "-m", "x" * 2000)
    one_line_error(res, "MessageTooBig")

    # nothing of the refused message was stored; small messages still go through
    assert jlines(cli("read", topic, "--until-end", "-o", "json")) == []
    ok(cli("produce", topic, "-m", "small"))
    msgs = jlines(cli("read", topic, "--until-end", "-o", "json"))
    assert [m["payload"] for m in msgs] == ["small"]

    # raising the limit again lets the big message in
    ok(cli("topics", "set-policies", topic, "--max-message-size", "4K"))
    ok(cli("produce", topic, "-m", "x" * 2000))
    msgs = jlines(cli("read", topic, "--until-end", "-o", "json"))
    assert [len(m["payload"]) for m in msgs] == [5, 2000]


def test_set_policies_without_flags_is_one_line_error(cli, topic):
    ok(cli("topics", "create", topic))
    res = cli("topics", "set-policies", topic)
    assert res.returncode == 1
    assert len(res.stderr.splitlines()) == 1, res.stderr


# ---- errors -----------------------------------------------------------------------------------

def test_bad_topic_names_are_one_line_errors(cli):
    for name in ("non-persistent://a/b/c", "a/b"):
        for args in (("topics", "create", name), ("produce", name, "-m", "x"),
                     ("read", name, "-n", "1", "--timeout", "1"), ("topics", "stats", name)):
            one_line_error(cli(*args), "InvalidTopicName")


def test_missing_topic_is_topic_not_found(cli, topic):
    for args in (("topics", "stats", topic), ("topics", "stats-internal", topic),
                 ("topics", "get-policies", topic), ("topics", "delete", topic),
                 ("produce", topic, "-m", "x"), ("read", topic, "-n", "1", "--timeout", "1"),
                 ("topics", "set-policies", topic, "--max-message-size", "1K")):
        one_line_error(cli(*args), "TopicNotFound")


def test_create_existing_topic_is_topic_already_exists(cli, topic):
    ok(cli("topics", "create", topic))
    one_line_error(cli("topics", "create", topic), "TopicAlreadyExists")
    one_line_error(cli("topics", "create", topic, "--partitions", "2"), "TopicAlreadyExists")
    # the first topic is untouched
    listed = jdoc(cli("topics", "list", "-o", "json"))
    assert [r["partitions"] for r in listed if r["topic"] == topic] == [0]


def test_no_broker_listening_is_one_line_error(binary_cli, topic):
    cli = binary_cli
    url = f"127.0.0.1:{free_port()}"  # nothing listens there
    quick = ("--operation-timeout", "1")  # the first call keeps the CLI's default (10 s)
    for args in (("topics", "list"), ("topics", "create", topic, *quick),
                 ("produce", topic, "-m", "x", *quick), ("read", topic, "-n", "1", *quick)):
        t0 = time.monotonic()
        res = cli(*args, "--url", url, timeout=60)
        line = one_line_error(res, "")
        assert line.startswith("error:"), line
        assert time.monotonic() - t0 < 30, "CLI hung against a dead URL"


# ---- partitioned topics ----------------------------------------------------------------------

def _keys_covering(partitions: int) -> list[str]:
    """One key per partition under the documented routing crc32c(key) % partitions."""
    found: dict[int, str] = {}
    for i in range(1000):
        k = f"key-{i}"
        found.setdefault(google_crc32c.value(k.encode()) % partitions, k)
        if len(found) == partitions:
            break
    return [found[p] for p in range(partitions)]


def test_partitioned_topic_routes_by_key_and_keeps_key_order(cli, topic):
    meta = jdoc(cli("topics", "create", topic, "--partitions", "3", "-o", "json"))
    assert meta["partitions"] == 3
    keys = _keys_covering(3)
    for k in keys:
        args = ["produce", topic, "-k", k]
        for i in range(10):
            args += ["-m", f"{k}/{i}"]
        out = jdoc(cli(*args, "-o", "json"))
        assert out["produced"] == 10

    msgs = jlines(cli("read", topic, "--until-end", "-o", "json"))
    assert len(msgs) == 30
    by_key: dict[str, list] = {}
    for m in msgs:
        by_key.setdefault(m["key"], []).append(m)
    assert sorted(by_key) == sorted(keys)
    partitions_seen = set()
    for k, ms in by_key.items():
        ids = [mid(m["message_id"]) for m in ms]
        assert all(i.partition >= 0 for i in ids), "partitioned ids need the :P part"
        parts = {i.partition for i in ids}
        assert len(parts) == 1, f"key {k} spread over partitions {parts}"
        partitions_seen |= parts
        assert [m["payload"] for m in ms] == [f"{k}/{i}" for i in range(10)], "key order lost"
        assert all(a < b for a, b in zip(ids, ids[1:]))
        assert all(m["topic"] == f"{topic}-partition-{i.partition}" for m, i in zip(ms, ids))
    assert partitions_seen == {0, 1, 2}

    st = internal(cli, topic)
    assert sorted(st) == [f"{topic}-partition-{i}" for i in range(3)]
    assert sum(int(v["numberOfEntries"]) for v in st.values()) == 30
    stats = jdoc(cli("topics", "stats", topic, "-o", "json"))
    assert int(stats["msgInCounter"]) == 30
    lm = jdoc(cli("topics", "last-message-id", topic, "-o", "json"))
    assert sorted(lm) == sorted(st)
    assert all(mid(v).partition == int(k.rsplit("-", 1)[1]) for k, v in lm.items())


# ---- read positions ------------------------------------------------------------------------

def test_read_from_message_id_exclusive_and_inclusive(cli, topic):
    ok(cli("topics", "create", topic))
    ok(cli("produce", topic, *sum((["-m", f"m{i}"] for i in range(10)), [])))
    msgs = jlines(cli("read", topic, "--until-end", "-o", "json"))
    assert [m["payload"] for m in msgs] == [f"m{i}" for i in range(10)]
    start = msgs[4]["message_id"]

    after = jlines(cli("read", topic, "--start", start, "-n", "1", "-o", "json"))
    assert [m["payload"] for m in after] == ["m5"]
    incl = jlines(cli("read", topic, "--start", start, "--inclusive", "-n", "1", "-o", "json"))
    assert [(m["message_id"], m["payload"]) for m in incl] == [(start, "m4")]

    rest = jlines(cli("read", topic, "--start", start, "--until-end", "-o", "json"))
    assert [m["payload"] for m in rest] == [f"m{i}" for i in range(5, 10)]
    rest_incl = jlines(cli("read", topic, "--start", start, "--inclusive", "--until-end",
                           "-o", "json"))
    assert [m["payload"] for m in rest_incl] == [f"m{i}" for i in range(4, 10)]

    # from the last id, exclusive: nothing left
    assert jlines(cli("read", topic, "--start", msgs[-1]["message_id"], "--until-end",
                      "-o", "json")) == []
    one_line_error(cli("read", topic, "--start", "junk", "-n", "1"), "InvalidMessageId")


def test_read_latest_times_out_then_gets_a_later_message(cli, broker, topic):
    ok(cli("topics", "create", topic))
    ok(cli("produce", topic, "-m", "old"))
    old = jlines(cli("read", topic, "--until-end", "-o", "json"))
    assert [m["payload"] for m in old] == ["old"]
    old_id = mid(old[0]["message_id"])

    t0 = time.monotonic()
    res = cli("read", topic, "--start", "latest", "-n", "1", "--timeout", "2")
    one_line_error(res, "Timeout")
    assert time.monotonic() - t0 < 20
    assert res.stdout.strip() == ""

    # a message produced after the reader started is the one it reads
    stop = threading.Event()
    sent: list[MessageId] = []
    problems: list[BaseException] = []

    def produce_late():
        try:
            with Client(broker.url, timeout=10) as c, c.create_producer(topic) as p:
                for i in range(120):  # bounded: at most ~30 s
                    if stop.wait(0.25):
                        return
                    sent.append(p.send(f"late-{i}"))
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            problems.append(exc)

    th = threading.Thread(target=produce_late, daemon=True)
    th.start()
    try:
        got = jlines(cli("read", topic, "--start", "latest", "-n", "1", "--timeout", "30",
                         "-o", "json"))
    finally:
        stop.set()
        th.join(15)
    assert not problems, problems
    assert len(got) == 1
    assert got[0]["payload"].startswith("late-")
    assert mid(got[0]["message_id"]) > old_id
    assert mid(got[0]["message_id"]) in sent


# ---- ledgers: roll, truncate ---------------------------------------------------------------

def test_roll_ledger_then_truncate(cli, topic):
    ok(cli("topics", "create", topic))
    ok(cli("produce", topic, "-k", "k", "-m", "first", "-n", "50"))
    before = internal(cli, topic)
    assert [l["state"] for l in before["ledgers"]] == ["OPEN"]
    first_lid = int(before["ledgers"][0]["ledgerId"])

    rolled = jdoc(cli("topics", "roll-ledger", topic, "-o", "json"))
    assert rolled["state"] == "SEALED" and int(rolled["ledgerId"]) == first_lid
    assert int(rolled["entries"]) == 50

    st = internal(cli, topic)
    states = [(int(l["ledgerId"]), l["state"]) for l in st["ledgers"]]
    assert states[0] == (first_lid, "SEALED")
    assert states[-1][1] == "OPEN" and states[-1][0] > first_lid
    assert len(states) == 2
    assert int(st["ledgers"][0]["entries"]) == 50
    assert int(st["numberOfEntries"]) == 50

    ok(cli("produce", topic, "-k", "k", "-m", "second", "-n", "5"))
    msgs = jlines(cli("read", topic, "--until-end", "-o", "json"))
    assert [m["payload"] for m in msgs] == ["first"] * 50 + ["second"] * 5
    ids = [mid(m["message_id"]) for m in msgs]
    assert all(i.ledger_id == first_lid for i in ids[:50])  # read back from Parquet
    assert [i.entry_id for i in ids[:50]] == list(range(50))
    assert all(a < b for a, b in zip(ids, ids[1:]))

    trunc = jdoc(cli("topics", "truncate", topic, "-o", "json"))
    assert int(trunc["ledgersDeleted"]) == 2
    assert int(trunc["entriesDeleted"]) == 55
    st = internal(cli, topic)
    assert all(l["state"] == "OPEN" for l in st["ledgers"]), st["ledgers"]
    assert int(st["numberOfEntries"]) == 0
    assert jlines(cli("read", topic, "--until-end", "-o", "json")) == []

    ok(cli("produce", topic, "-m", "after-1", "-m", "after-2"))
    msgs = jlines(cli("read", topic, "--until-end", "-o", "json"))
    assert [m["payload"] for m in msgs] == ["after-1", "after-2"]
    assert all(mid(m["message_id"]) > ids[-1] for m in msgs)
    one = jlines(cli("read", topic, "-n", "1", "-o", "json"))
    assert [m["payload"] for m in one] == ["after-1"]


# ---- delete ------------------------------------------------------------------------------

def test_delete_topic(cli, topic):
    ok(cli("topics", "create", topic))
    ok(cli("produce", topic, "-m", "x", "-n", "3"))
    assert topic in [r["topic"] for r in jdoc(cli("topics", "list", "-o", "json"))]

    out = ok(cli("topics", "delete", topic))
    assert "deleted" in out
    assert topic not in [r["topic"] for r in jdoc(cli("topics", "list", "-o", "json"))]
    one_line_error(cli("produce", topic, "-m", "x"), "TopicNotFound")
    one_line_error(cli("read", topic, "-n", "1", "--timeout", "1"), "TopicNotFound")
    one_line_error(cli("topics", "delete", topic), "TopicNotFound")

    # the name can be used again and starts empty
    ok(cli("topics", "create", topic))
    assert jlines(cli("read", topic, "--until-end", "-o", "json")) == []


def test_delete_partitioned_topic(cli, topic):
    ok(cli("topics", "create", topic, "--partitions", "2"))
    ok(cli("produce", topic, "-m", "x", "-n", "4"))
    one_line_error(cli("topics", "delete", f"{topic}-partition-0"), "NotAllowed")
    ok(cli("topics", "delete", topic))
    assert topic not in [r["topic"] for r in jdoc(cli("topics", "list", "-o", "json"))]
    one_line_error(cli("produce", topic, "-m", "x"), "TopicNotFound")
    one_line_error(cli("topics", "stats", f"{topic}-partition-1"), "TopicNotFound")
