"""Child processes of the standalone (and of tests): they die with their parent, and a
`Supervisor` keeps one running, restarting it with a bounded back-off.

`spawn()` starts a child in a session of its own (the terminal's Ctrl-C reaches only the
parent, which stops its children in order) with Linux's PR_SET_PDEATHSIG = SIGKILL (set by
util-linux `setpriv` before it execs the command; a prctl `preexec_fn` where setpriv is
missing), so a
`kill -9` of the parent takes its children along instead of leaving them under PID 1 holding
the ports. The kernel sends that signal when the *thread* that forked the child exits, so it
is only set when spawning from the main thread (a child forked from a worker thread, like a
test's `asyncio.to_thread`, would otherwise die with that thread). Off Linux, and for children
forked from other threads, only the parent's own clean-up (finally blocks, atexit) stops them.

`Supervisor` drives one `Role` (the source broker, the shadow broker or the compaction
worker) from the standalone's main loop, without blocking it:

    starting --ready--> running --exit--> backoff --delay--> starting ...
        \\--exit / timeout / launch error--> backoff, or failed

A failure before the role was ever ready is final (a broken setup fails fast, with its log);
after that each failure is restarted after 0.5 s, doubling up to 8 s, and `max_failures`
failures within `window` seconds give up (state `failed`, reason in `error`).
"""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()
#: util-linux's setpriv (Linux): sets PR_SET_PDEATHSIG, then execs the command
_SETPRIV = shutil.which("setpriv") if sys.platform.startswith("linux") else None


def _die_with(prctl: Callable[..., int], parent_pid: int) -> Callable[[], None]:
    """preexec_fn: SIGKILL this child when its parent dies (resolved before the fork)."""
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), sigkill)

    return preexec


def spawn(args: list[str], log_path: str | os.PathLike[str],
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `args` (stdin /dev/null, stdout+stderr appended to `log_path`), in its own
    session, dying with this process when spawned from the main thread on Linux."""
    preexec = None
    if threading.current_thread() is threading.main_thread():
        if _SETPRIV is not None:
            # setpriv sets PDEATHSIG and execs: no Python runs between fork and exec. A
            # `preexec_fn` makes CPython fork the slow way, holding the import lock and
            # running fork handlers, which deadlocked once in a process full of gRPC threads
            args = [_SETPRIV, "--pdeathsig", "KILL", "--", *args]
        elif _PRCTL is not None:
            preexec = _die_with(_PRCTL, os.getpid())
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                preexec_fn=preexec)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True if something listens on host:port (bind test, SO_REUSEADDR like gRPC and etcd, so
    a previous run's TIME_WAIT connections do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def describe_exit(code: int) -> str:
    """'exited with code 1', 'exited with code -9 (SIGKILL)'."""
    if code < 0:
        try:
            return f"exited with code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exited with code {code}"


class Role(Protocol):
    """One kind of child process the standalone runs (`BrokerProcess` is one)."""

    role: str        # "broker": the name in messages
    log_path: str

    def launch(self) -> None:
        """Start the process and return without waiting (OSError: could not start)."""

    def exit_code(self) -> int | None:
        """None while the process launched last is running."""

    def ready(self) -> bool:
        """One quick readiness probe (e.g. gRPC health SERVING)."""

    def terminate(self) -> int:
        """Stop gracefully (escalating to SIGKILL); returns the exit code."""

    def kill(self) -> None:
        """SIGKILL and reap."""

    def log_tail(self, n: int = 40) -> str:
        """The last `n` lines of the log."""


STARTING, RUNNING, BACKOFF, FAILED, STOPPED = "starting", "running", "backoff", "failed", "stopped"


R = TypeVar("R", bound=Role)


class Supervisor(Generic[R]):
    """Keeps one `Role` running; call `start()` once, then `poll()` from the main loop.
    Generic in the role's class, so its holder reaches what that class adds (`child`)."""

    def __init__(self, child: R, start_timeout: float = 60.0, first_delay: float = 0.5,
                 max_delay: float = 8.0, max_failures: int = 5, window: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self.child = child
        self.start_timeout = start_timeout
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.max_failures = max_failures
        self.window = window
        self.clock = clock
        self.state = STOPPED
        self.error = ""          # why the state is FAILED
        self.ever_ready = False
        self._failures: list[float] = []
        self._since = 0.0        # when the current start began
        self._restart_at = 0.0

    def start(self) -> str:
        self._launch()
        return self.state

    def poll(self) -> str:
        """Advance: notice exits and readiness, restart when the back-off is over."""
        now = self.clock()
        if self.state == BACKOFF and now >= self._restart_at:
            self._launch()
            now = self.clock()
        if self.state == STARTING:
            code = self.child.exit_code()
            if code is not None:
                self._failed(describe_exit(code), now)
            elif self.child.ready():
                self.state = RUNNING
                if self.ever_ready:
                    print(f"{self.child.role} restarted (ready)", flush=True)
                self.ever_ready = True
            elif now - self._since > self.start_timeout:
                self.child.kill()
                self._failed(f"was not ready after {self.start_timeout:g} s", now)
        elif self.state == RUNNING:
            code = self.child.exit_code()
            if code is not None:
                self._failed(describe_exit(code), now)
        return self.state

    def stop(self) -> None:
        """Stop the child gracefully; no restart after this."""
        if self.state in (STARTING, RUNNING):
            self.child.terminate()
        self.state = STOPPED

    def _launch(self) -> None:
        self._since = self.clock()
        try:
            self.child.launch()
        except OSError as exc:
            self._failed(f"could not start: {exc}", self._since)
            return
        self.state = STARTING

    def _failed(self, what: str, now: float) -> None:
        name, log = self.child.role, self.child.log_path
        if not self.ever_ready:
            self.state, self.error = FAILED, f"{name} {what}"
            return
        self._failures = [t for t in self._failures if now - t < self.window] + [now]
        if len(self._failures) >= self.max_failures:
            self.state = FAILED
            self.error = (f"{name} {what}; {len(self._failures)} failures within "
                          f"{self.window:g} s, giving up (see {log})")
            return
        delay = min(self.max_delay, self.first_delay * 2 ** (len(self._failures) - 1))
        self.state, self._restart_at = BACKOFF, now + delay
        print(f"{name} {what}; restarting in {delay:g} s (see {log})", file=sys.stderr,
              flush=True)
