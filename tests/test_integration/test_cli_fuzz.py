"""Junk at the CLI: every command, with names holding `.`/`..`/`/`/NUL/unicode/over-long
text, negative and huge numbers, empty and malformed values. Whatever comes in, the CLI
either succeeds or prints exactly one `error:` line (never a traceback, never an internal
error) and exits 1; the broker keeps serving. Runs `shadowtopic`'s `main()` in-process (the
binary's own exit paths are covered in test_cli_edges.py), against a real broker."""
from __future__ import annotations

import contextlib
import io
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadowtopic.cli.main import main
from shadowtopic.client import Client

NAMES = st.sampled_from([
    "", ".", "..", "../../etc", "public/default/..", "./default/x", "persistent://../../..",
    "persistent://a/../x", "a/b/c/d", "x\x00y", "tópico", "日本", "with space", "-p",
    "non-persistent://a/b/c", "t" * 5000, "a/b/" + "x" * 300, "x-partition-3", "%s", "{}",
]) | st.text(max_size=40)
NUMBERS = st.sampled_from([
    "-5", "-1", "0", "1", "-99999999999999999999", "99999999999999999999", "1e400", "NaN",
    "abc", "", "0x10", "100G", "5Q", "-2", "4294967296", "18446744073709551616", "1.5",
])
SIZES = NUMBERS | st.sampled_from(["10M", "-1G", "1T", "999999T", "K"])
JUNK = NAMES | NUMBERS | st.text(max_size=20)


def commands(url: str, fresh: str) -> st.SearchStrategy[list[str]]:
    """Argument lists for every CLI command. Fresh-namespace names never exist, so nothing
    can loop on data; `read` always stops at the end, `produce -n` is never large."""
    name = NAMES | st.just(fresh)
    small_n = st.sampled_from(["-5", "0", "abc", "", "-99999999999999999999", "1e3"])
    one = st.sampled_from(["stats", "stats-internal", "lookup", "last-message-id",
                           "roll-ledger", "truncate", "get-policies", "delete"])
    policy = st.sampled_from(["--retention-time", "--retention-size", "--max-message-size",
                              "--compaction-threshold", "--retain-null-key",
                              "--replicator-auto-reset-backlog-entries",
                              "--ledger-max-entries", "--ledger-max-bytes", "--ledger-max-age"])
    topics = st.one_of(
        st.tuples(st.just("create"), name, st.just("--partitions"), NUMBERS),
        st.tuples(st.just("create"), name, policy, SIZES),
        st.tuples(st.just("create"), name, st.just("-p"), JUNK),
        st.tuples(one, name),
        st.tuples(st.just("set-policies"), name, policy, SIZES),
        st.tuples(st.just("list"), NAMES),
    ).map(lambda t: ["topics", *t])
    produce = st.tuples(name, JUNK, JUNK, small_n, JUNK).map(
        lambda t: ["produce", t[0], "-m", t[1], "-k", t[2], "-n", t[3], "-p", t[4]])
    read = st.tuples(name, JUNK, NUMBERS, NUMBERS).map(
        lambda t: ["read", t[0], "--start", t[1], "-n", t[2], "--timeout", t[3],
                   "--until-end"])
    junk = st.lists(JUNK, max_size=4)
    return st.one_of(topics, produce, read, junk).map(lambda argv: ["--url", url, *argv])


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def test_the_cli_answers_junk_with_one_line_and_keeps_the_broker_serving(broker):
    fresh = f"persistent://public/fz-{uuid.uuid4().hex[:8]}/none"
    seen = {"ok": 0, "error": 0}

    @settings(max_examples=250, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(argv=commands(broker.url, fresh))
    def check(argv):
        code, out, err = run_cli(argv)
        shown = f"shadowtopic {argv!r} -> exit {code}\nstdout: {out[:500]}\nstderr: {err[:500]}"
        assert "Traceback" not in out + err, shown
        assert code in (0, 1), shown
        if code == 1:
            lines = err.splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), shown
            # never the broker's Internal error (a usage error may name `stats-internal`)
            low = lines[0].lower()
            assert not low.startswith("error: internal") and "internal error" not in low, shown
            seen["error"] += 1
        else:
            seen["ok"] += 1

    check()
    assert seen["error"] > 100  # the junk really was junk, mostly
    with Client(broker.url, timeout=20) as c:         # and the broker still serves
        topic = f"persistent://public/fz-{uuid.uuid4().hex[:8]}/after"
        c.admin.create_topic(topic)
        with c.create_producer(topic) as p:
            mid = p.send(b"still serving")
        assert c.admin.last_message_id(topic) == mid


@pytest.mark.parametrize("argv", [
    ["topics", "create", "a/b/c/d"], ["topics", "set-policies", "x", "--max-message-size", "-5"],
    ["read", "x", "-n", "-1"], ["produce", "../../etc", "-m", "x"], ["no-such-command"],
])
def test_known_junk_gets_one_line_each(broker, argv):
    code, out, err = run_cli(["--url", broker.url, *argv])
    assert code == 1 and len(err.splitlines()) == 1 and err.startswith("error: "), (out, err)
