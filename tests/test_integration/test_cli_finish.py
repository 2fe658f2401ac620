"""The CLI as a new user finds it (issue 20, item 6, and `brokers health` of item 2): the
installed `shadowtopic` console script against real broker processes and the session's
etcd, its output parsed back as a script would.

`--version`; `broker --help`; `produce -f FILE|-` with `--key-separator`, read back; Ctrl-C
while producing says how many messages were acknowledged; Ctrl-C while the CLI starts prints
no traceback; `topics last-message-id --compacted`; `-o json` of create-subscription, delete
and delete-shadow-topic; tables piped at full width; `topics list` loads no heavy module;
`brokers health` against real brokers and a registered one that does not answer."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from importlib.metadata import version

from support.compacted_read import ITEMS, produce, publish_compaction, storage_root
from support.etcd_support import on_etcd
from support.waiting import eventually, wait_for

from shadowtopic import failpoints
from shadowtopic.broker.server import free_port
from shadowtopic.client import Client
from shadowtopic.metadata import keys
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

EXE = os.path.join(os.path.dirname(sys.executable), "shadowtopic")


# ---- helpers --------------------------------------------------------------------------------

def env_for(url: str | None = None, **extra: str) -> dict[str, str]:
    """This process's environment for the CLI: SHADOWTOPIC_URL = `url`, no COLUMNS (the
    width of piped tables is under test), no failpoints unless given."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SHADOWTOPIC_URL", "COLUMNS", failpoints.ENV)}
    if url is not None:
        env["SHADOWTOPIC_URL"] = url
    env.update(extra)
    return env


def run(url: str | None, *args: str, input: bytes | None = None,
        **extra: str) -> subprocess.CompletedProcess:
    """The CLI, stdout and stderr piped (text), `input` on its stdin."""
    res = subprocess.run([EXE, *args], input=input, capture_output=True, timeout=120,
                         env=env_for(url, **extra),
                         stdin=None if input is not None else subprocess.DEVNULL)
    res.stdout, res.stderr = res.stdout.decode(), res.stderr.decode()
    return res


def ok(res) -> str:
    assert res.returncode == 0, f"exit {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    return res.stdout


def jdoc(res):
    return json.loads(ok(res))


def one_line_error(res, text: str) -> str:
    assert res.returncode == 1, f"exit {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert text in lines[0], f"{text!r} not in {lines[0]!r}"
    return lines[0]


def read_back(url: str, topic: str) -> list[tuple[str | None, str]]:
    """(key, payload) of every message of `topic`, through `shadowtopic read`."""
    res = run(url, "read", topic, "--until-end", "-o", "json")
    return [(m["key"], m["payload"]) for m in map(json.loads, ok(res).splitlines())]


def stderr_line(proc: subprocess.Popen, timeout: float = 60.0) -> str:
    """The next line the process writes on stderr (bounded in time)."""
    ready, _, _ = select.select([proc.stderr], [], [], timeout)
    assert ready, "no line on stderr in time"
    return proc.stderr.readline().decode()


# ---- --version, broker --help -----------------------------------------------------------------

def test_version_is_the_installed_package_version():
    res = run(None, "--version")
    assert ok(res) == f"shadowtopic {version('shadowtopic')}\n"


def test_broker_help_lists_the_broker_flags():
    """`shadowtopic broker --help` (also after a global option) prints the broker's own
    flags and exits 0; it starts no broker."""
    for args in (["broker", "--help"], ["-o", "json", "broker", "-h"]):
        out = ok(run(None, *args))
        assert out.startswith("usage: ") and "broker" in out.splitlines()[0], out
        for flag in ("--etcd", "--data-dir", "--storage-root", "--entry-cache-bytes"):
            assert flag in out, (args, flag)
    assert "shadowtopic broker --help" in ok(run(None, "--help"))
    one_line_error(run(None, "topics", "list", "--no-such-flag"),
                   "unrecognized arguments: --no-such-flag")


# ---- produce from a file or stdin ---------------------------------------------------------------

def test_produce_stdin_with_key_separator_reads_back(broker, topic):
    """One message per line, split at the first separator; CRLF and empty lines; a key with
    nothing after the separator is a tombstone; the rest of the line (separators included)
    is the payload. Then a file with -k, and a line without the separator."""
    ok(run(broker.url, "topics", "create", topic))
    lines = ["user-1:hello", "user-2:a:b:c", "", "user-1:", "ключ:значение 🙂", "k5:crlf\r",
             "  k6 :  spaced  "]
    res = run(broker.url, "produce", topic, "-f", "-", "--key-separator", ":", "-o", "json",
              input=("\n".join(lines) + "\n").encode())
    assert jdoc(res)["produced"] == 6
    expected = [("user-1", "hello"), ("user-2", "a:b:c"), ("user-1", ""),
                ("ключ", "значение 🙂"), ("k5", "crlf"), ("  k6 ", "  spaced  ")]
    assert read_back(broker.url, topic) == expected

    path = os.path.join(broker.data_dir, f"input-{uuid.uuid4().hex[:6]}.txt")
    with open(path, "wb") as f:
        f.write(b"first\nsecond")  # no newline at the end: still a message
    out = ok(run(broker.url, "produce", topic, "-f", path, "-k", "fixed"))
    assert out.startswith(f"2 messages produced to {topic} (")
    assert read_back(broker.url, topic)[6:] == [("fixed", "first"), ("fixed", "second")]

    res = run(broker.url, "produce", topic, "-f", "-", "--key-separator", "=",
              input=b"a=1\nno separator\nb=2\n")
    one_line_error(res, "line 2 of stdin has no key separator '='")
    assert "(1 of 1 messages acknowledged before the error)" in res.stderr
    assert read_back(broker.url, topic)[8:] == [("a", "1")]


def test_produce_input_usage_errors(broker, topic):
    one_line_error(run(broker.url, "produce", topic),
                   "one of the arguments -m/--message -f/--file is required")
    one_line_error(run(broker.url, "produce", topic, "-m", "x", "-f", "-", input=b"y\n"),
                   "argument -f/--file: not allowed with argument -m/--message")
    one_line_error(run(broker.url, "produce", topic, "-f", "/no/such/file"),
                   "cannot read /no/such/file")
    one_line_error(run(broker.url, "produce", topic, "-m", "a:b", "-k", "k",
                       "--key-separator", ":"), "exclude each other")
    one_line_error(run(broker.url, "produce", topic, "-f", "-", "-n", "2", input=b"x\n"),
                   "cannot be used with -f")


# ---- Ctrl-C ----------------------------------------------------------------------------------

def test_ctrl_c_while_producing_from_stdin_says_what_was_acknowledged(broker, topic):
    ok(run(broker.url, "topics", "create", topic))
    proc = subprocess.Popen([EXE, "produce", topic, "-f", "-", "--key-separator", "="],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env_for(broker.url))
    try:
        proc.stdin.write(b"k1=a\nk2=b\nk3=c\n")
        proc.stdin.flush()  # the input stays open: the CLI waits for more
        with Client(broker.url) as c:
            wait_for(lambda: c.admin.stats(topic)["msgInCounter"] == 3, 30,
                     "3 messages stored")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.decode().splitlines() == ["interrupted: 3 of 3 messages sent were acknowledged"]
    assert out == b""
    assert read_back(broker.url, topic) == [("k1", "a"), ("k2", "b"), ("k3", "c")]


def test_ctrl_c_while_producing_many_waits_for_the_receipts(broker, topic):
    """Interrupted while it sends: it stops sending, waits for the receipts of what it sent
    and says so; what it says was acknowledged is what the topic holds."""
    ok(run(broker.url, "topics", "create", topic))
    proc = subprocess.Popen([EXE, "produce", topic, "-m", "x" * 100, "-n", "100000000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env_for(broker.url))
    try:
        with Client(broker.url) as c:
            wait_for(lambda: c.admin.stats(topic)["msgInCounter"] > 0, 30, "a message stored")
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=120)
            stored = c.admin.stats(topic)["msgInCounter"]
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    lines = err.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted: "), lines
    words = lines[0].split()  # interrupted: A of S messages sent were acknowledged
    acked, sent = int(words[1]), int(words[3])
    assert 0 < acked == sent == stored, (lines[0], stored)


def test_ctrl_c_while_the_cli_loads_prints_no_traceback(broker):
    """Held at a failpoint in the middle of loading its modules, or at the end of its main
    module, Ctrl-C ends it with 130 (once loaded) and nothing on stderr but the failpoint's
    own line; and Ctrl-C at a few
    times after the start of a command that retries for long (no broker at its URL) prints
    nothing."""
    for point in ("cli.loading", "cli.loaded"):  # in the imports; after them, before main()
        proc = subprocess.Popen([EXE, "topics", "list"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE,
                                env=env_for(broker.url, **failpoints.env({point: "sleep(3)"})))
        try:
            assert f"failpoint {point}" in stderr_line(proc)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert (proc.returncode, out, err) == (130, b"", b""), (point, proc.returncode, err)

    # timed from the CLI's own first lines (the failpoint's line, not held: `sleep(0)`), not
    # from the process start: Python's own start-up took over 1.2 s on a loaded machine, and
    # a Ctrl-C before the CLI runs ends it as Python does
    nobody = f"127.0.0.1:{free_port()}"
    for delay in (0.3, 1.0, 2.0):
        proc = subprocess.Popen([EXE, "topics", "list", "--operation-timeout", "60"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env_for(nobody, **failpoints.env({"cli.loading": "sleep(0)"})))
        try:
            assert "failpoint cli.loading" in stderr_line(proc)
            time.sleep(delay)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert (proc.returncode, out, err) == (130, b"", b""), (delay, proc.returncode, err)


# ---- topics last-message-id --compacted ---------------------------------------------------------

def test_last_message_id_compacted(etcd_server, broker, client, topic):
    """The newest id a compacted reader reads (the last survivor: `c` and `d` end in
    tombstones) against the newest id of the topic."""
    client.admin.create_topic(topic)
    ids = produce(client, topic, ITEMS)
    client.admin.roll_ledger(topic)
    publish_compaction(etcd_server, storage_root(broker), topic, "job-cli")

    def compacted():
        res = run(broker.url, "topics", "last-message-id", topic, "--compacted", "-o", "json")
        assert jdoc(res) == {"message_id": str(ids[4])}

    eventually(compacted)
    assert jdoc(run(broker.url, "topics", "last-message-id", topic, "-o", "json")) == \
        {"message_id": str(ids[-1])}
    out = ok(run(broker.url, "topics", "last-message-id", topic, "--compacted"))
    assert str(ids[4]) in out and str(ids[-1]) not in out


# ---- -o json of what printed text ------------------------------------------------------------

def test_create_subscription_and_delete_print_json(broker, topic):
    ok(run(broker.url, "topics", "create", topic))
    res = run(broker.url, "topics", "create-subscription", topic, "-s", "sub-1", "-m",
              "earliest", "-o", "json")
    assert jdoc(res) == {"topic": topic, "subscription": "sub-1", "position": "earliest",
                         "created": True}
    assert jdoc(run(broker.url, "topics", "subscriptions", topic, "-o", "json")) == ["sub-1"]
    assert ok(run(broker.url, "topics", "create-subscription", topic, "-s", "sub-2")) == \
        f"created subscription sub-2 on {topic}\n"
    res = run(broker.url, "topics", "delete", topic, "-f", "-o", "json")
    assert jdoc(res) == {"topic": topic, "deleted": True}
    one_line_error(run(broker.url, "topics", "stats", topic), "TopicNotFound")


# ---- tables piped ------------------------------------------------------------------------------

def test_piped_tables_keep_long_names_whole(broker):
    """Piped (not a terminal, no $COLUMNS), a table is as wide as its rows: a 150-character
    topic name stays on one line, whole."""
    namespace = f"public/ns-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://{namespace}/" + "a-rather-long-topic-name-" * 5 + "end"
    ok(run(broker.url, "topics", "create", topic))
    out = ok(run(broker.url, "topics", "list", namespace))
    rows = [line for line in out.splitlines() if topic in line]
    assert len(rows) == 1 and "source" in rows[0], out
    out = ok(run(broker.url, "topics", "list", namespace, COLUMNS="60"))  # asked for: kept
    assert topic not in out and max(len(line) for line in out.splitlines()) <= 60, out


# ---- what `topics list` loads ----------------------------------------------------------------

HEAVY = ("pyarrow", "numpy", "etcd3", "pyspark", "prometheus_client", "shadowtopic.broker",
         "shadowtopic.ledger", "shadowtopic.metadata", "shadowtopic.read",
         "shadowtopic.subscriptions", "shadowtopic.shadow", "shadowtopic.compaction")

LOADED = """
import json, sys
from shadowtopic.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def loaded_by(url: str, *args: str) -> set[str]:
    res = subprocess.run([sys.executable, "-c", LOADED, *args], capture_output=True, text=True,
                         timeout=120, env=env_for(url), stdin=subprocess.DEVNULL)
    report = json.loads(res.stderr.splitlines()[-1])
    assert report["code"] in (0, None), res.stderr
    return set(report["modules"])


def test_topics_list_loads_no_heavy_module(broker):
    for args, rich in ((["topics", "list", "-o", "json"], False), (["topics", "list"], True)):
        modules = loaded_by(broker.url, *args)
        assert "grpc" in modules and "shadowtopic.client.admin" in modules
        heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY or m.startswith(HEAVY))
        assert heavy == [], (args, heavy)
        assert ("rich.table" in modules) == rich, args


# ---- brokers health --------------------------------------------------------------------------

def test_brokers_health_reads_the_registry_and_asks_each_broker(etcd_server, start_pair,
                                                                 topic):
    """A source and a shadow broker of a cluster of their own, then a registration whose
    broker does not answer; and delete-shadow-topic's JSON on the way."""
    src, sh = start_pair()
    cluster = next(a for a in src.extra_args if a.startswith("c-"))
    etcd = etcd_server.endpoint

    res = run(None, "brokers", "health", "--etcd", etcd, "--cluster", cluster, "-o", "json")
    rows = jdoc(res)
    assert [(r["url"], r["roles"], r["status"]) for r in sorted(rows, key=lambda r: r["url"])] \
        == sorted([(src.url, ["source"], "SERVING"), (sh.url, ["shadow"], "SERVING")])
    by_url = {r["url"]: r for r in rows}
    assert by_url[src.url]["services"] == {"admin": "SERVING", "producer": "SERVING",
                                           "consumer": "SERVING"}
    assert by_url[sh.url]["services"]["replication"] == "SERVING"
    assert {r["cluster"] for r in rows} == {cluster} and all("metrics_url" in r for r in rows)
    table = ok(run(None, "brokers", "health", "--cluster", cluster, SHADOWTOPIC_ETCD=etcd))
    assert src.url in table and sh.url in table and "SERVING" in table

    shadow = topic + "-shadow"
    ok(run(src.url, "topics", "create", topic))
    ok(run(src.url, "topics", "create-shadow-topic", shadow, "--source", topic))
    assert jdoc(run(src.url, "topics", "delete-shadow-topic", shadow, "-o", "json")) == \
        {"topic": shadow, "deleted": True}
    assert jdoc(run(src.url, "topics", "get-shadow-topics", topic, "-o", "json")) == []

    dead = mpb.BrokerInfo(broker_id="broker-gone", url=f"127.0.0.1:{free_port()}",
                          roles=["source"], started_ms=1)
    key = keys.broker(cluster, dead.broker_id)
    on_etcd(etcd_server, lambda s: s.put(key, dead.SerializeToString()))
    try:
        res = run(None, "brokers", "health", "--etcd", etcd, "--cluster", cluster, "-o", "json")
        line = one_line_error(res, "1 of 3 brokers not serving: broker-gone (UNREACHABLE")
        rows = {r["broker_id"]: r for r in json.loads(res.stdout)}
        assert rows["broker-gone"]["status"] == "UNREACHABLE" and rows["broker-gone"]["error"]
        assert src.url not in line
    finally:
        on_etcd(etcd_server, lambda s: s.delete(key))

    empty = f"c-{uuid.uuid4().hex[:8]}"
    one_line_error(run(None, "brokers", "health", "--etcd", etcd, "--cluster", empty),
                   f"no broker is registered in etcd at {etcd} (cluster {empty})")
    nobody = f"127.0.0.1:{free_port()}"
    one_line_error(run(None, "brokers", "health", "--etcd", nobody, "--timeout", "1"),
                   f"etcd at {nobody}")
