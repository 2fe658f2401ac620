"""The failpoint module (source/failpoints.py): its grammar, its actions, the registry of
points staying true to the code, and a process enabled through the one variable."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shadowtopic import failpoints
from shadowtopic.failpoints import Action, FailpointError

ROOT = Path(__file__).resolve().parents[2]
POINT = "ledger.seal.before_publish"


def test_a_spec_parses_into_actions():
    got = failpoints.parse(f" {POINT}=2*sleep(0.5) ; compaction.before_publish=kill ;")
    assert got == {POINT: Action("sleep", 0.5, "", 2),
                   "compaction.before_publish": Action("kill")}
    assert failpoints.parse("compaction.phase_start=error(disk on fire)") == {
        "compaction.phase_start": Action("error", text="disk on fire")}


@pytest.mark.parametrize("spec, says", [
    ("no.such.point=kill", "unknown failpoint 'no.such.point'"),
    (f"{POINT}=explode", "is not kill, off, sleep(S) or error(TEXT)"),
    (f"{POINT}=sleep(x)", "is not kill, off, sleep(S) or error(TEXT)"),
    (POINT, "is not point=action"),
])
def test_a_bad_spec_is_refused_with_the_reason(spec, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        failpoints.parse(spec)


def test_nothing_happens_unless_enabled():
    failpoints.hit(POINT)   # off: returns
    with failpoints.enabled({POINT: "error(boom)"}):
        with pytest.raises(FailpointError, match="boom"):
            failpoints.hit(POINT)
    failpoints.hit(POINT)   # restored: off again


def test_a_count_limits_how_often_a_point_acts():
    with failpoints.enabled({POINT: "2*error(x)"}):
        for _ in range(2):
            with pytest.raises(FailpointError):
                failpoints.hit(POINT)
        failpoints.hit(POINT)   # the third time: off


def test_a_chain_acts_term_after_term():
    """`2*off->1*error(x)->kill` is parsed as three linked actions; `2*off->error(x)` lets
    two passes through, then acts at every later one."""
    assert failpoints.parse(f"{POINT}=2*off->1*error(x)->kill") == {
        POINT: Action("off", remaining=2,
                      then=Action("error", text="x", remaining=1, then=Action("kill")))}
    with failpoints.enabled({POINT: "2*off->error(x)"}):
        failpoints.hit(POINT)
        failpoints.hit(POINT)
        for _ in range(3):
            with pytest.raises(FailpointError, match="x"):
                failpoints.hit(POINT)
    with failpoints.enabled({POINT: "1*off->1*error(y)"}):
        failpoints.hit(POINT)
        with pytest.raises(FailpointError, match="y"):
            failpoints.hit(POINT)
        failpoints.hit(POINT)   # the chain ran out: off


def test_a_chain_term_without_a_count_is_refused():
    with pytest.raises(ValueError, match="has no N\\* count"):
        failpoints.parse(f"{POINT}=off->kill")


def test_sleep_holds_the_calling_thread():
    with failpoints.enabled({POINT: "sleep(0.2)"}):
        t = time.monotonic()
        failpoints.hit(POINT)
        assert time.monotonic() - t >= 0.2


def test_env_checks_names_in_the_test():
    assert failpoints.env({POINT: "kill"}) == {failpoints.ENV: f"{POINT}=kill"}
    with pytest.raises(ValueError, match="unknown failpoint"):
        failpoints.env({"ledger.seal.befor_publish": "kill"})


def _child(spec: str) -> subprocess.CompletedProcess:
    code = ("from shadowtopic import failpoints; print('started', flush=True); "
            f"failpoints.hit({POINT!r}); print('passed')")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, **{failpoints.ENV: spec}))


def test_kill_through_the_variable_kills_the_process_at_the_point():
    res = _child(f"{POINT}=kill")
    assert res.returncode == -signal.SIGKILL
    assert res.stdout == "started\n"


def test_a_typo_in_the_variable_fails_the_process_at_start():
    res = _child("ledger.seal.before_publsh=kill")
    assert res.returncode == 1 and "started" not in res.stdout
    assert "unknown failpoint 'ledger.seal.before_publsh'" in res.stderr


def test_every_point_is_in_the_code_and_every_hit_is_a_point():
    """The registry names exactly the points the code has (and no test variable besides)."""
    hits: set[str] = set()
    for part in ("source", "shadow", "compaction"):
        for path in (ROOT / part).rglob("*.py"):
            hits |= set(re.findall(r"failpoints\.hit\(\"([^\"]+)\"\)", path.read_text()))
    assert hits == set(failpoints.POINTS)
