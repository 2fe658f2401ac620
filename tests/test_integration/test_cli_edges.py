"""Edges of the `shadowtopic` CLI: a reader of its output that goes away (`| head`), global
options before or after the subcommand, usage errors and bad values as one `error:` line with
exit code 1, a producer failing mid-run, and the client page's first Python example
(docs/CLIENT.md; the README's examples: tests/test_docs/test_readme_examples.py).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shadowtopic.client import Client, Policies

EXE = os.path.join(os.path.dirname(sys.executable), "shadowtopic")
CLIENT_DOC = Path(__file__).resolve().parents[2] / "docs" / "CLIENT.md"


def one_line_error(res, *needles: str) -> str:
    """Exit 1 and exactly one stderr line, `error: ...` naming every needle; no traceback."""
    assert res.returncode == 1, (f"expected exit 1, got {res.returncode}\nstdout: {res.stdout}\n"
                                 f"stderr: {res.stderr}")
    lines = res.stderr.splitlines()
    assert len(lines) == 1, f"expected exactly one stderr line, got {len(lines)}:\n{res.stderr}"
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in res.stderr + res.stdout
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def _env(url: str) -> dict:
    return dict(os.environ, SHADOWTOPIC_URL=url)


def _finish(proc: subprocess.Popen, what: str, timeout: float = 10) -> int:
    """The exit code, within `timeout` seconds; else kill the process group and fail."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait(5)
        pytest.fail(f"{what}: still running {timeout}s after its output pipe was closed")


# ---- the reader of the output goes away ---------------------------------------------------

@pytest.fixture
def filled_topic(broker, topic):
    """A topic with 600 messages of ~200 bytes: more JSON than a pipe buffer holds, so the
    CLI is still writing when its reader goes away."""
    with Client(broker.url, timeout=20) as c:
        c.admin.create_topic(topic)
        with c.create_producer(topic) as p:
            for i in range(600):
                p.send_async(f"{i:05d}-" + "x" * 200, key="k")
    return topic


def _close_pipe_after_one_line(url: str, topic: str, times: int) -> None:
    """`read --until-end -o json`, its stdout closed after one line: the CLI exits 0, quietly,
    within seconds, every time."""
    for i in range(times):
        proc = subprocess.Popen([EXE, "read", topic, "--until-end", "-o", "json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env=_env(url), start_new_session=True)
        first = json.loads(proc.stdout.readline())
        assert first["payload"].startswith("00000-"), first
        proc.stdout.close()
        code = _finish(proc, f"run {i}")
        err = proc.stderr.read().decode()
        proc.stderr.close()
        assert (code, err) == (0, ""), f"run {i}: exit {code}, stderr: {err}"


def _pipe_into_head(url: str, topic: str, times: int) -> None:
    """`shadowtopic read ... | head -1` in a real shell pipeline (pipefail: the CLI's exit
    code counts): one line out, exit 0, within seconds, every time."""
    cmd = f"{shlex.quote(EXE)} read {shlex.quote(topic)} --until-end -o json | head -1"
    for i in range(times):
        proc = subprocess.Popen(["bash", "-o", "pipefail", "-c", cmd], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                env=_env(url), start_new_session=True)
        code = _finish(proc, f"run {i}")
        out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
        proc.stdout.close()
        proc.stderr.close()
        assert (code, err) == (0, ""), f"run {i}: exit {code}, stderr: {err}"
        assert len(out.splitlines()) == 1 and json.loads(out)["payload"].startswith("00000-")


def test_closed_output_pipe_ends_the_cli(broker, filled_topic):
    _close_pipe_after_one_line(broker.url, filled_topic, 5)
    _pipe_into_head(broker.url, filled_topic, 5)


@pytest.mark.slow
def test_closed_output_pipe_ends_the_cli_8_times_in_a_row(broker, filled_topic):
    """The hang this guards against was intermittent (a CLI that printed everything and hung
    at exit: see `Multiplexer.close`): 8 runs of each beside the 5 above (it was 50 of each,
    90 s of make test, then 20, 36 s; each run starts a CLI)."""
    _close_pipe_after_one_line(broker.url, filled_topic, 8)
    _pipe_into_head(broker.url, filled_topic, 8)


# ---- global options ---------------------------------------------------------------------------

def test_url_and_output_before_or_after_the_subcommand(broker, topic):
    with Client(broker.url) as c:
        c.admin.create_topic(topic)
    env = {k: v for k, v in os.environ.items() if k != "SHADOWTOPIC_URL"}
    dead = "127.0.0.1:1"  # nothing listens there

    def topics(*args: str) -> list[str]:
        res = subprocess.run([EXE, *args], capture_output=True, text=True, timeout=60, env=env,
                             stdin=subprocess.DEVNULL)
        assert res.returncode == 0, res.stderr
        return [row["topic"] for row in json.loads(res.stdout)]

    for args in (["--url", broker.url, "-o", "json", "topics", "list"],
                 ["topics", "list", "--url", broker.url, "-o", "json"],
                 ["--url", broker.url, "topics", "list", "-o", "json"],
                 ["-o", "json", "topics", "list", "--url", broker.url],
                 ["--url", dead, "topics", "list", "--url", broker.url, "-o", "json"]):
        assert topic in topics(*args), args  # the one after the subcommand wins

    # (retrying 1 s, not the default 10 s: test_cli.py's dead-URL test keeps the default)
    res = subprocess.run([EXE, "--url", dead, "topics", "list", "--operation-timeout", "1"],
                         capture_output=True, text=True, timeout=60, env=env,
                         stdin=subprocess.DEVNULL)
    one_line_error(res, "ConnectError")


# ---- usage errors and bad values --------------------------------------------------------------

def _offline(*args: str) -> subprocess.CompletedProcess:
    """The CLI where no broker listens: usage errors need none."""
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=60,
                          env=_env("127.0.0.1:1"), stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args, needles", [
    (["topics", "create", "t", "--partitions", "abc"], ["--partitions", "abc"]),
    (["read", "t", "-n", "-1"], ["-n/--num-messages", "-1"]),
    (["read", "t", "-n", "x"], ["-n/--num-messages", "x"]),
    (["read", "t", "--timeout", "-1"], ["--timeout"]),
    (["produce", "t", "-m", "x", "-n", "0"], ["-n/--num-produce"]),
    (["topics", "set-policies", "t", "--max-message-size", "10Q"], ["--max-message-size"]),
    (["topics", "set-policies", "t", "--retention-time", "soon"], ["--retention-time"]),
    (["topics", "create", "t", "-p", "novalue"], ["--property"]),
    (["topics", "list", "-o", "yaml"], ["yaml"]),
    (["nonsense"], ["nonsense"]),
    (["topics", "frobnicate", "t"], ["frobnicate"]),
    ([], ["required"]),
    (["topics"], ["required"]),
    (["produce", "t"], ["-m/--message"]),
    (["read", "t", "--no-such-flag"], ["--no-such-flag"]),
])
def test_usage_errors_are_one_line(args, needles):
    one_line_error(_offline(*args), *needles)


def test_help_still_works():
    for args in (["--help"], ["read", "--help"], ["topics", "create", "-h"]):
        res = _offline(*args)
        assert res.returncode == 0 and res.stdout.startswith("usage: shadowtopic"), res
        assert res.stderr == ""


def test_out_of_range_values_are_one_line_typed_errors(cli, topic):
    one_line_error(cli("topics", "create", topic, "--partitions", "-2"), "InvalidArgument")
    one_line_error(cli("topics", "create", topic, "--max-message-size", "-5"), "InvalidPolicies")
    one_line_error(cli("topics", "create", topic, "--max-message-size", "100G"),
                   "InvalidPolicies")
    assert cli("topics", "create", topic).returncode == 0
    one_line_error(cli("topics", "set-policies", topic, "--max-message-size", "100G"),
                   "InvalidPolicies")


def test_read_n_zero_means_no_limit(cli, topic):
    assert cli("topics", "create", topic).returncode == 0
    assert cli("produce", topic, "-m", "x", "-n", "3").returncode == 0
    res = cli("read", topic, "-n", "0", "--until-end", "-o", "json")
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == 3


# ---- a producer failing mid-run ---------------------------------------------------------------

def test_producer_failing_mid_run_says_how_many_were_acknowledged(broker, topic):
    total = 3_000_000
    with Client(broker.url, timeout=20) as c:
        c.admin.create_topic(topic)
        proc = subprocess.Popen([EXE, "produce", topic, "-m", "hello", "-n", str(total)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, env=_env(broker.url),
                                start_new_session=True)
        deadline = time.monotonic() + 30
        while int(c.admin.stats(topic)["msgInCounter"]) == 0:
            assert time.monotonic() < deadline and proc.poll() is None, "nothing produced"
            time.sleep(0.05)
        # from now on every batch is refused: "hello" is 5 bytes
        c.admin.set_policies(topic, Policies(max_message_size=1))
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.communicate()
            pytest.fail("the producer did not stop after its messages were refused")
        stored = int(c.admin.stats(topic)["msgInCounter"])
    res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    line = one_line_error(res, "error: MessageTooBig: ")
    m = re.search(r"\((\d+) of (\d+) messages acknowledged before the error\)$", line)
    assert m, line
    acked = int(m.group(1))
    assert int(m.group(2)) == total
    assert 0 < acked < total
    assert acked == stored  # every acknowledged message is stored, and nothing else


# ---- docs/CLIENT.md's first Python example ------------------------------------------------

def test_client_doc_python_example_runs_twice_and_prints_text(broker, topic):
    code = re.search(r"```python\n(.*?)```", CLIENT_DOC.read_text(), re.S).group(1)
    assert '"localhost:6650"' in code and '"my-topic"' in code
    code = code.replace('"localhost:6650"', repr(broker.url)).replace('"my-topic"', repr(topic))
    for run in (1, 2):  # the second run finds the topic there already
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60, cwd=CLIENT_DOC.parent, stdin=subprocess.DEVNULL)
        assert res.returncode == 0, res.stderr
        lines = res.stdout.splitlines()
        assert len(lines) == run, res.stdout
        for line in lines:
            mid, key, payload, props = line.split("\t")
            assert (key, payload, props) == ("user-1", "hello", "k=v"), line
            assert re.fullmatch(r"\d+:\d+", mid), line
