"""The `shadowtopic` CLI run in the test's own process: the console script's `main(argv)`
with stdout and stderr captured, its exit code from its `SystemExit`, and the environment
variables given for the run set around it. The same command the installed script runs,
without its Python start-up and imports (a second and more per command on the loaded 2-core
CI machine), for tests that run dozens of commands to check what they do; the tests that
keep running the installed script (every command family has some) check the process
itself: its exit status, its streams, its environment."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
from collections.abc import Iterator

from shadowtopic.cli.main import main


@contextlib.contextmanager
def environment(env: dict[str, str | None]) -> Iterator[None]:
    """os.environ with `env` applied (None: unset) for the block, restored after."""
    saved = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_main(args: list[str] | tuple[str, ...],
             env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """`shadowtopic *args` by `main` in this process, as a CompletedProcess (text stdout and
    stderr). `env`: environment variables for the run (None: unset), e.g. SHADOWTOPIC_URL."""
    out, err = io.StringIO(), io.StringIO()
    with environment(env or {}), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def runner(url: str):
    """cli(*args, check=False) -> CompletedProcess: `run_main` with SHADOWTOPIC_URL = `url`,
    the in-process twin of tests/test_integration/conftest.py's `binary_cli` (a `timeout`
    is accepted and left to pytest-timeout: the command runs in the test's own thread)."""

    def run(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
        res = run_main(args, {"SHADOWTOPIC_URL": url})
        if check and res.returncode != 0:
            raise AssertionError(f"shadowtopic {' '.join(args)} failed: {res.stderr}")
        return res

    return run
