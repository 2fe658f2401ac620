"""`shadowtopic read`, `consume` and the admin commands work on shadow topics unchanged, driven
as a user drives them against a source broker and a shadow broker (`python -m
shadowtopic.shadow.broker`) on one storage root and the session's etcd. The CLI is told the
SOURCE broker's URL (or any broker's): Lookup sends it to the shadow broker.

The commands run in this process (support/cli_inprocess.py: the console script's `main`, a
second of Python start-up saved on each of some hundred commands); one test runs the
installed `shadowtopic` console script for each command it uses (`binary_cli`).

Conventions as in test_cli.py: `-o json` prints one document (`read`/`consume`: one object
per line); every error is exactly one `error: ...` line on stderr and exit code 1."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.cli_inprocess import run_main
from support.waiting import wait_for

EXE = os.path.join(os.path.dirname(sys.executable), "shadowtopic")


# ---- fixtures -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(start_module_pair):
    """(source broker, shadow broker), see conftest's `start_pair`: one pair for the
    module's tests that stop neither broker (the one that kills its shadow broker has
    `own_pair`)."""
    return start_module_pair()


@pytest.fixture
def own_pair(start_pair):
    """A (source broker, shadow broker) of this test alone."""
    return start_pair()


def cli_of(src, binary: bool = False):
    """cli(*args, url=...) -> CompletedProcess: the CLI with SHADOWTOPIC_URL = the source
    broker `src`'s URL; `url=X` runs it with `--url X` and no SHADOWTOPIC_URL instead. In
    this process, or with `binary` the installed console script."""

    def run(*args: str, url: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
        if url is not None:
            args = (*args, "--url", url)
        if not binary:
            return run_main(args, {"SHADOWTOPIC_URL": src.url if url is None else None})
        env = {k: v for k, v in os.environ.items() if k != "SHADOWTOPIC_URL"}
        if url is None:
            env["SHADOWTOPIC_URL"] = src.url
        return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout,
                              env=env, stdin=subprocess.DEVNULL)

    return run


@pytest.fixture
def cli(pair):
    """`cli_of` the module's pair, in this process."""
    return cli_of(pair[0])


@pytest.fixture
def binary_cli(pair):
    """`cli_of` the module's pair, the installed console script."""
    return cli_of(pair[0], binary=True)


# ---- helpers --------------------------------------------------------------------------------

def ok(res) -> str:
    assert res.returncode == 0, f"exit {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    return res.stdout


def jdoc(res):
    return json.loads(ok(res))


def jlines(res) -> list[dict]:
    return [json.loads(line) for line in ok(res).splitlines() if line.strip()]


def one_line_error(res, expected: str | None = None, contains: str | None = None) -> str:
    """exit 1, exactly one stderr line, no traceback; `error: <expected>` (or containing)."""
    assert res.returncode == 1, f"exit {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr + res.stdout, res.stderr
    if expected is not None:
        assert lines[0] == f"error: {expected}", lines[0]
    if contains is not None:
        assert lines[0].startswith("error: ") and contains in lines[0], lines[0]
    return lines[0]


def ids(msgs: list[dict]) -> list[str]:
    return [m["message_id"] for m in msgs]


def content(msgs: list[dict]) -> list[tuple]:
    """Everything of a message but its topic (and a redelivery count)."""
    return [(m["message_id"], m["key"], m["payload"], m["properties"], m["event_time"],
             m["publish_time"], m["producer_name"], m["sequence_id"]) for m in msgs]


def ledger_ids(doc: dict) -> list[int]:
    return [int(lg["ledgerId"]) for lg in doc.get("ledgers", [])]


# ---- the whole life of a shadow through the CLI -----------------------------------------------

def test_read_consume_and_admin_commands_work_on_a_shadow_through_the_source_brokers_url(
        cli, topic):
    shadow = f"{topic}-shadow"
    meta = jdoc(cli("topics", "create", topic, "-o", "json"))
    assert (meta["topic"], meta["kind"]) == (topic, "source")
    # 60 messages: two sealed ledgers of 20 and 20 more in the open one
    for i in range(3):
        summary = ok(cli("produce", topic, "-m", "a", "-m", "b", "-m", "c", "-m", "d",
                         "-k", "k1", "-p", "x=1", "-n", "5"))
        assert summary.startswith(f"20 messages produced to {topic}"), summary
        if i < 2:
            ok(cli("topics", "roll-ledger", topic))

    meta = jdoc(cli("topics", "create-shadow-topic", shadow, "--source", topic, "-o", "json"))
    assert (meta["topic"], meta["kind"], meta["source"], meta["partitions"]) == (
        shadow, "shadow", topic, 0)
    assert jdoc(cli("topics", "get-shadow-topics", topic, "-o", "json")) == [shadow]
    assert shadow in ok(cli("topics", "get-shadow-topics", topic))
    assert ok(cli("topics", "get-shadow-source", shadow)) == topic + "\n"

    # read: the source's messages, with the source's ids
    want = jlines(cli("read", topic, "--start", "earliest", "-n", "60", "-o", "json"))
    assert len(want) == 60 and len({m["message_id"].split(":")[0] for m in want}) == 3
    got = jlines(cli("read", shadow, "--start", "earliest", "-n", "60", "-o", "json"))
    assert content(got) == content(want)
    assert {m["topic"] for m in got} == {shadow}
    assert ids(jlines(cli("read", shadow, "--start", "earliest", "--until-end",
                          "-o", "json"))) == ids(want)
    after = want[29]["message_id"]                       # `--start L:E`: the messages after it
    assert ids(jlines(cli("read", shadow, "--start", after, "-n", "5", "-o", "json"))) == \
        ids(want[30:35])
    assert ids(jlines(cli("read", shadow, "--start", after, "--inclusive", "-n", "1",
                          "-o", "json"))) == [after]
    table = ok(cli("read", shadow, "--start", "earliest", "-n", "2"))
    assert table.splitlines()[:2] == [f"{want[0]['message_id']}\tk1\ta\tx=1",
                                      f"{want[1]['message_id']}\tk1\tb\tx=1"], table

    # consume: a durable subscription of the shadow's own
    consumed = jlines(cli("consume", shadow, "-s", "sub", "-n", "60", "-p", "earliest",
                          "-o", "json"))
    assert content(consumed) == content(want)
    one_line_error(cli("consume", shadow, "-s", "sub", "-n", "1", "--timeout", "3"),
                   contains="Timeout")                  # all 60 were acknowledged
    assert jdoc(cli("topics", "subscriptions", shadow, "-o", "json")) == ["sub"]
    assert jdoc(cli("topics", "subscriptions", topic, "-o", "json")) == []  # its own only

    # produce: refused, one line, nothing acknowledged
    one_line_error(cli("produce", shadow, "-m", "x"),
                   f"NotAllowed: topic {shadow} is a read-only shadow of {topic} "
                   "(0 of 1 messages acknowledged before the error)")

    # live messages reach the shadow's subscription, with their ids
    live = json.loads(ok(cli("produce", topic, "-m", "live", "-n", "5", "-o", "json")))
    live_msgs = jlines(cli("read", topic, "--start", want[-1]["message_id"], "-n", "5",
                           "-o", "json"))
    assert [m["payload"] for m in live_msgs] == ["live"] * 5, live
    got = jlines(cli("consume", shadow, "-s", "sub", "-n", "5", "--timeout", "30",
                     "-o", "json"))
    assert content(got) == content(live_msgs)
    last = live_msgs[-1]["message_id"]

    # stats: the source shows its shadow's replication; the shadow its subscription
    def replicated():
        st = jdoc(cli("topics", "stats", topic, "-o", "json"))
        rep = st.get("shadowReplication", {}).get(shadow)
        return rep if rep and rep.get("connected") and rep.get("replicatedPosition") == last \
            else None
    rep = wait_for(replicated, 30, "shadowReplication of the source's stats to catch up",
                   interval=0.2)
    # a new shadow's replicator starts at the tail (the history is read from the ledgers):
    # it carried the 5 live messages' ids
    assert int(rep.get("replicationBacklog", 0)) == 0 and int(rep["msgOutCounter"]) >= 5, rep
    st = jdoc(cli("topics", "stats", shadow, "-o", "json"))
    assert (st["kind"], st["source"]) == ("SHADOW", topic)
    sub = st["subscriptions"]["sub"]
    assert (sub["markDeletePosition"], int(sub["msgBacklog"]), sub["durable"]) == (last, 0, True)
    assert int(sub["msgOutCounter"]) >= 65
    assert "sub" in ok(cli("topics", "stats", shadow))  # the table shows it too
    assert jdoc(cli("topics", "last-message-id", shadow, "-o", "json")) == \
        jdoc(cli("topics", "last-message-id", topic, "-o", "json"))

    # delete: not the source while it has a shadow; the shadow, then the source
    one_line_error(cli("topics", "delete", topic),
                   f"HasShadowTopics: {topic} has shadow topics: {shadow}; delete them first")
    assert len(jlines(cli("read", topic, "--start", "earliest", "--until-end",
                          "-o", "json"))) == 65
    assert ok(cli("topics", "delete-shadow-topic", shadow)) == f"deleted shadow topic {shadow}\n"
    assert jdoc(cli("topics", "get-shadow-topics", topic, "-o", "json")) == []
    one_line_error(cli("read", shadow, "--start", "earliest", "-n", "1"),
                   contains="TopicNotFound")
    assert len(jlines(cli("read", topic, "--start", "earliest", "--until-end",
                          "-o", "json"))) == 65  # deleting the shadow took nothing of the source
    assert ok(cli("topics", "delete", topic)) == f"deleted {topic}\n"
    one_line_error(cli("topics", "get-shadow-topics", topic), contains="TopicNotFound")


def test_any_brokers_url_reaches_a_shadow_and_its_source(pair, binary_cli, topic):
    """The installed script, told any broker's URL by `--url` (no SHADOWTOPIC_URL)."""
    src, sh = pair
    cli = binary_cli
    shadow = f"{topic}-shadow"
    ok(cli("topics", "create", topic, url=sh.url))               # asked of the shadow broker
    ok(cli("produce", topic, "-m", "m", "-n", "10", url=sh.url))
    ok(cli("topics", "create-shadow-topic", shadow, "--source", topic, url=sh.url))
    want = ids(jlines(cli("read", topic, "--start", "earliest", "-n", "10", "-o", "json",
                          url=src.url)))
    assert len(want) == 10
    for url in (src.url, sh.url):
        assert ids(jlines(cli("read", shadow, "--start", "earliest", "-n", "10", "-o", "json",
                              url=url))) == want, url
        assert ids(jlines(cli("read", topic, "--start", "earliest", "-n", "10", "-o", "json",
                              url=url))) == want, url
    assert ids(jlines(cli("consume", shadow, "-s", "s", "-p", "earliest", "-n", "10",
                          "-o", "json", url=sh.url))) == want
    assert jdoc(cli("topics", "get-shadow-topics", topic, "-o", "json", url=sh.url)) == [shadow]
    assert ok(cli("topics", "get-shadow-source", shadow, url=sh.url)) == topic + "\n"
    one_line_error(cli("produce", shadow, "-m", "x", url=sh.url), contains="NotAllowed")


def test_a_partitioned_sources_shadow_reads_every_partition_with_its_ids(cli, topic):
    shadow = f"{topic}-shadow"
    ok(cli("topics", "create", topic, "--partitions", "3"))
    for k in range(6):                                    # keys route to partitions
        ok(cli("produce", topic, "-k", f"key-{k}", "-m", f"v{k}", "-n", "4"))
    meta = jdoc(cli("topics", "create-shadow-topic", shadow, "--source", topic, "-o", "json"))
    assert (meta["kind"], meta["partitions"]) == ("shadow", 3)
    want = jlines(cli("read", topic, "--start", "earliest", "--until-end", "-o", "json"))
    assert len(want) == 24

    def by_id(msgs):
        return sorted((m["message_id"], m["key"], m["payload"]) for m in msgs)
    got = jlines(cli("read", shadow, "--start", "earliest", "-n", "24", "-o", "json"))
    assert by_id(got) == by_id(want)
    consumed = jlines(cli("consume", shadow, "-s", "sub", "-p", "earliest", "-n", "24",
                          "-o", "json"))
    assert by_id(consumed) == by_id(want)
    one_line_error(cli("produce", shadow, "-k", "key-0", "-m", "x"), contains="NotAllowed")
    one_line_error(cli("topics", "delete", topic), contains="HasShadowTopics")
    ok(cli("topics", "delete", shadow))                  # `topics delete` deletes a shadow too
    ok(cli("topics", "delete", topic))


def test_stats_internal_of_a_shadow_lists_the_sources_ledger_ids(own_pair, topic):
    """"A shadow's internal stats list the source's ledger ids, so users can see the data is
    shared": while the shadow broker serves it, and while nobody serves it (as an unserved
    source's stats-internal answers from etcd's ledger list)."""
    src, sh = own_pair
    cli = cli_of(src)
    shadow = f"{topic}-shadow"
    ok(cli("topics", "create", topic))
    for n in ("10", "10", "5"):                           # ledgers of 10, 10 and 5 entries
        ok(cli("produce", topic, "-m", "m", "-n", n))
        if n == "10":
            ok(cli("topics", "roll-ledger", topic))
    src = jdoc(cli("topics", "stats-internal", topic, "-o", "json"))
    assert len(ledger_ids(src)) == 3 and int(src["numberOfEntries"]) == 25, src
    ok(cli("topics", "create-shadow-topic", shadow, "--source", topic))

    assert len(jlines(cli("read", shadow, "--start", "earliest", "-n", "25", "-o", "json"))) == 25
    served = jdoc(cli("topics", "stats-internal", shadow, "-o", "json"))
    assert ledger_ids(served) == ledger_ids(src), served
    assert (int(served["numberOfEntries"]), served["lastConfirmedEntry"]) == (
        25, src["lastConfirmedEntry"]), served

    sh.kill()                                             # nobody serves the shadow now
    # (each lookup gives up after 1 s: the CLI's default retries 10 s for a broker to come)
    wait_for(lambda: cli("topics", "lookup", shadow, "--operation-timeout", "1").returncode
             == 1, 30, "the shadow broker's registration to lapse", interval=0.2)
    unserved = jdoc(cli("topics", "stats-internal", shadow, "-o", "json"))
    assert ledger_ids(unserved) == ledger_ids(src), \
        f"the shadow's stats-internal while nobody serves it: {unserved}"
    assert int(unserved["numberOfEntries"]) == 25, unserved
