"""Failpoints: the named places where a test may crash, pause or fail a process (after etcd's
gofail and TiKV's fail-rs). Every point is listed in `POINTS`; all are off unless enabled.

A process enables points from one environment variable, read when this module is first
imported (a test sets it in the environment of the child it starts, never in its own):

    SHADOWTOPIC_FAILPOINTS="compaction.before_publish=kill;compaction.phase_start=sleep(3)"

`;`-separated `point=action` pairs. Actions:

    kill         SIGKILL this process at the point (a crash: no finally, no flush, no atexit)
    sleep(S)     hold the calling thread S seconds (a pause; S may be fractional), then go on
    error(TEXT)  raise `FailpointError(TEXT)` at the point (an injected failure)
    off          nothing: the same as not naming the point

An action may be prefixed with `N*` to act only the first N times the point is reached
(`1*kill`, `2*sleep(0.5)`); after that the point is off, or, when `->` follows, does what
comes next (as TiKV's fail-rs): `1*off->kill` lets the first pass go and kills at the second
(a worker's second job), `2*off->sleep(30)` holds from the third pass on.

A name not in `POINTS` or an action that does not parse raises `ValueError` when the
variable is read, so a typo fails the process at start-up instead of quietly testing nothing.

In code, a point is one call: `failpoints.hit("compaction.before_publish")`. When nothing is
enabled that is a dictionary lookup. Unit tests in one process use `enabled(...)` (a context
manager) instead of the variable; `env(...)` builds the variable's value for a child.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

ENV = "SHADOWTOPIC_FAILPOINTS"

log = logging.getLogger(__name__)

# Every failpoint, with where it is and what a test uses it for.
POINTS: dict[str, str] = {
    "compaction.phase_start":
        "the compaction worker, in the Spark job's thread, when a phase of a job begins "
        "(after the phase is in the job's record): `sleep(S)` holds each phase so a test "
        "sees every phase, or kills the worker while Spark has the job",
    "compaction.before_publish":
        "the compaction worker after the job's output is written and its record says "
        "COMMITTING, before the one etcd transaction that moves the compaction pointer",
    "metadata.watch.events":
        "any process, in an etcd watch's reader thread, before a batch of events goes to "
        "the watcher: `sleep(S)` delays what every watch of the process hears (a slow "
        "watch), while direct reads answer at once",
    "wal.object.after_put":
        "a source broker with the WAL on object storage, after a flush window's object is "
        "written and before the etcd transaction that commits it: `kill` leaves an object "
        "no commit names (nothing in it was acknowledged)",
    "wal.object.after_commit":
        "a source broker with the WAL on object storage, after a flush window is committed "
        "in etcd and before its appends are acknowledged: `kill` leaves committed batches "
        "whose producers resend them (idempotent producing keeps them once)",
    "produce.before_receipt":
        "a source broker after a produce batch is stored (its WAL frame fsynced, or found a "
        "duplicate of a stored one), before its receipt is sent: `1*kill` makes the producer "
        "resend a batch the broker already stored (idempotent producing)",
    "ledger.seal.write":
        "a source broker, in the executor thread that writes a ledger's Parquet file, before "
        "it writes: `1*sleep(S)` holds that one seal while the broker goes on (a later "
        "ledger's seal finishes first, as a slow object store makes happen). A ledger sealed "
        "ahead (source/ledger/seal_ahead.py) hits it as its seal finishes the file, and "
        "again if that fails and the seal writes the file whole",
    "ledger.seal_ahead.step":
        "a source broker, in the executor thread of a step of an open ledger's seal-ahead "
        "(source/ledger/seal_ahead.py), before it writes: `1*error(TEXT)` ends that "
        "ledger's seal-ahead, and its seal writes it whole from the WAL",
    "ledger.seal.before_publish":
        "a source broker after a ledger's Parquet file is written and fsynced, before the "
        "ledger list marks the ledger SEALED",
    "compaction.ledger.open":
        "a broker, in the executor thread that opens a topic's compacted ledger for "
        "`read_compacted` reads (compaction/view.py), before it opens the files: "
        "`N*error(TEXT)` fails the first N opens as an unreachable object store does "
        "(`DataLoss`), so a test sees the view broken and then opened again",
    "producer.attach_sent":
        "a client's producer after it sent its attach requests on a new stream, before it "
        "waits for their answers: `sleep(S)` lets the broker's answers arrive and be counted "
        "by the receiver thread first (a producer that read how many to wait for from that "
        "count waited for none: tests/test_source/client/test_producer_attach.py)",
    "cli.loading":
        "the `shadowtopic` CLI while it loads its modules (source/cli/main.py), before the "
        "client library: `sleep(S)` holds it there so a test presses Ctrl-C during start-up",
    "cli.loaded":
        "the `shadowtopic` CLI at the end of its main module, its Ctrl-C still held: "
        "`sleep(S)` lets a test press Ctrl-C after the imports, before main() runs",
}

_ACTION = re.compile(r"(?:(\d+)\*)?(kill|off|sleep\(([0-9.]+)\)|error\((.*)\))", re.S)


class FailpointError(RuntimeError):
    """What an `error(TEXT)` failpoint raises."""


@dataclass
class Action:
    kind: str                 # "kill" | "sleep" | "error" | "off"
    seconds: float = 0.0      # sleep
    text: str = ""            # error
    remaining: int | None = None   # None: every time
    then: Action | None = None     # what the point does once `remaining` ran out

    @classmethod
    def parse(cls, text: str) -> Action:
        """One action, or a chain `N*a->b->...` (each term but the last counted)."""
        first, arrow, rest = text.partition("->")
        action = cls._term(first)
        if arrow:
            if action.remaining is None:
                raise ValueError(f"failpoint action {first.strip()!r} is followed by '->' "
                                 f"but has no N* count: it would never end")
            action.then = cls.parse(rest)
        return action

    @classmethod
    def _term(cls, text: str) -> Action:
        m = _ACTION.fullmatch(text.strip())
        if m is None:
            raise ValueError(f"failpoint action {text!r} is not kill, off, sleep(S) or "
                             f"error(TEXT), optionally prefixed by N*")
        count, word, seconds, message = m.groups()
        kind = word.split("(")[0]
        return cls(kind, float(seconds) if seconds else 0.0, message or "",
                   int(count) if count else None)


def parse(spec: str) -> dict[str, Action]:
    """`"a=kill;b=sleep(2)"` -> {name: Action}; raises ValueError naming what is wrong."""
    points: dict[str, Action] = {}
    for pair in filter(None, (p.strip() for p in spec.split(";"))):
        name, sep, action = pair.partition("=")
        name = name.strip()
        if not sep:
            raise ValueError(f"failpoint {pair!r} is not point=action")
        if name not in POINTS:
            raise ValueError(f"unknown failpoint {name!r} (known: {', '.join(sorted(POINTS))})")
        points[name] = Action.parse(action)
    return points


_lock = threading.Lock()
_active: dict[str, Action] = parse(os.environ.get(ENV, ""))


def hit(name: str) -> None:
    """The point `name` is reached: do what it is enabled to do (usually nothing)."""
    if not _active:
        return
    if name not in POINTS:
        raise ValueError(f"unknown failpoint {name!r}")
    with _lock:
        action = _active.get(name)
        if action is None:
            return
        if action.remaining is not None:
            action.remaining -= 1
            if action.remaining <= 0:
                if action.then is None:
                    del _active[name]
                else:
                    _active[name] = action.then
        if action.kind == "off":
            return
    log.warning("failpoint %s: %s", name, action.kind)
    if action.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action.kind == "sleep":
        time.sleep(action.seconds)
    elif action.kind == "error":
        raise FailpointError(action.text or f"failpoint {name}")


def env(points: dict[str, str]) -> dict[str, str]:
    """The environment entry that enables `points` in a child process:
    `env({"compaction.before_publish": "kill"})` -> {ENV: "compaction.before_publish=kill"}.
    Checked here, so a test's typo fails in the test."""
    spec = ";".join(f"{name}={action}" for name, action in points.items())
    parse(spec)
    return {ENV: spec}


@contextmanager
def enabled(points: dict[str, str]) -> Iterator[None]:
    """Enable `points` in this process for the block (unit tests), then restore."""
    parsed = parse(";".join(f"{n}={a}" for n, a in points.items()))
    with _lock:
        saved = dict(_active)
        _active.update(parsed)
    try:
        yield
    finally:
        with _lock:
            _active.clear()
            _active.update(saved)
