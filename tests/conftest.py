"""Shared fixtures. There is no pytest-asyncio: tests run coroutines with `arun(...)`
(asyncio.run with a time bound) inside plain test functions.

Unit and integration tests: an integration test needs a real process (etcd, a broker, a
compaction worker, Spark). It is one when it lives in tests/test_integration, uses a process
fixture (`etcd_server`, `spark`), or says so with `@pytest.mark.integration` (a contract
suite's real-etcd parameter does, with `pytest.param("etcd", marks=pytest.mark.integration)`).
`make test-unit` runs everything else (`-m "not integration"`); `make test` runs all.
"""
from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def _not_the_repo(entry: str) -> bool:
    """False for a sys.path / PYTHONPATH entry that makes the repo root importable ('', '.',
    the root itself): with it, `import source` would work and a broken package mapping could
    pass the tests. The package must come through the installed distribution."""
    return entry not in ("", ".") and Path(entry).resolve() != REPO


# pytest-xdist workers put the cwd on sys.path and on PYTHONPATH (which every subprocess a
# test starts inherits): take it out of both before any test imports anything, and keep
# `python -m ...` / `python -c ...` subprocesses from putting their cwd first (PYTHONSAFEPATH).
os.environ["PYTHONSAFEPATH"] = "1"
sys.path[:] = [e for e in sys.path if _not_the_repo(e)]
if "PYTHONPATH" in os.environ:
    kept = [e for e in os.environ["PYTHONPATH"].split(os.pathsep) if _not_the_repo(e)]
    if kept:
        os.environ["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        del os.environ["PYTHONPATH"]

# Spark's JVM starts dozens of times in a run (every compaction worker, every SparkSession),
# and a start is CPU-bound: with C1 only and the serial GC it takes about 11 CPU seconds here
# against 19 (wall 12 s against 13.5), which on 2 cores is time the other test processes get.
# Tests only: a worker in production keeps the JVM's defaults (C2 for long jobs).
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

# With PYTHONDONTWRITEBYTECODE in the environment (this machine's has it) no process
# writes bytecode: every broker, worker and CLI process a test starts (hundreds in a run)
# compiled the package from source again, about 0.2 CPU seconds of a CLI start and 0.4 of a
# broker's, and each test process compiled every test module it collects (10 CPU seconds).
# So the package (its link tree) is compiled once before the run, and the test processes
# write their test modules' bytecode (pytest's cache of the rewritten modules, in the
# ignored __pycache__ folders). Processes only read them; a changed source is compiled
# afresh as always. Without the variable this changes nothing.
sys.dont_write_bytecode = False


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller compiled it
        return
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("shadowtopic")
    package = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in [*package, str(REPO / "tests" / "support")]:
        compileall.compile_dir(folder, quiet=2)


PROCESS_FIXTURES = {"etcd_server", "spark"}

#: The files whose tests use the test process's compaction worker (`worker` below, a Spark
#: JVM: 10-25 s to start on the 2-core CI machine, and heavy on both cores while it does).
#: Under `--dist loadfile` they are one unit of work (`pytest_xdist_make_scheduler`), so one
#: test process runs them all and starts the worker once, not once in each process that one
#: of them lands in. A test of another file that uses `worker` fails the collection until its
#: file is named here.
SHARED_WORKER_FILES = (
    "tests/test_docs/test_readme_examples.py",
    "tests/test_integration/test_compaction.py",
    "tests/test_integration/test_compacted_reopen.py",
    "tests/test_integration/test_compaction_deletes.py",
    "tests/test_integration/test_metrics.py",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "test_integration" in item.path.parts or PROCESS_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.integration)
        if "worker" in item.fixturenames and \
                item.path.relative_to(REPO).as_posix() not in SHARED_WORKER_FILES:
            raise pytest.UsageError(f"{item.nodeid} uses the shared compaction worker: name "
                                    "its file in SHARED_WORKER_FILES (tests/conftest.py)")


#: Seconds the slowest files took in one `make test` (`--durations=0`, summed per file, on the
#: 2-core machine), to hand out the longest work first: xdist orders files by their number
#: of tests, so a long file of few tests (a Spark worker restarted three times) started
#: last, and two test processes waited for the third (~50 s of a 966 s run). Rough figures
#: are enough; a file not listed counts 2 s per test in tests/test_integration, 0.1 else.
SLOW_FILES = {
    "tests/test_integration/test_compaction_failpoints.py": 45,
    "tests/test_integration/test_iceberg_tables.py": 104,
    "tests/test_bench/test_bench_smoke.py": 99,
    "tests/test_integration/test_standalone.py": 89,
    "tests/test_integration/test_crash.py": 86,
    "tests/test_integration/test_rpc_fuzz.py": 85,
    "tests/test_integration/test_multi_host.py": 74,
    "tests/test_integration/test_subscriptions.py": 65,
    "tests/test_integration/test_cli.py": 63,
    "tests/test_integration/test_cli_finish.py": 60,
    "tests/test_integration/test_shadows.py": 59,
    "tests/test_integration/test_logs.py": 58,
    "tests/test_integration/test_arrow_reads.py": 56,
    "tests/test_integration/test_s3_storage.py": 55,
    "tests/test_integration/test_reconnect.py": 52,
    "tests/test_integration/test_disk_faults.py": 49,
    "tests/test_docs/test_readme_examples.py": 49,
    "tests/test_compaction/test_spark_job.py": 49,
    "tests/test_integration/test_broadcast.py": 48,
    "tests/test_integration/test_cli_edges.py": 45,
    "tests/test_integration/test_memory_limits.py": 41,
    "tests/test_integration/test_client.py": 41,
    "tests/test_integration/test_compaction.py": 40,
    "tests/test_integration/test_subscriptions_crash.py": 38,
    "tests/test_integration/test_shadow_scale.py": 38,
}


def _unit_seconds(scope: str, tests: int) -> float:
    """What one unit of work (a file, or the shared worker's files) is expected to take."""
    files = SHARED_WORKER_FILES if scope == SHARED_WORKER_FILES[0] else (scope,)
    return sum(SLOW_FILES.get(f, tests * (2.0 if "/test_integration/" in f else 0.1))
               for f in files)


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, except that the files of `SHARED_WORKER_FILES` are one unit, and the
    longest units go first (`SLOW_FILES`)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedWorkerFiles(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return SHARED_WORKER_FILES[0] if scope in SHARED_WORKER_FILES else scope

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the first assignment: the queue is whole
                self.ordered = True
                units = sorted(self.workqueue.items(),
                               key=lambda unit: -_unit_seconds(unit[0], len(unit[1])))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return SharedWorkerFiles(config, log)


@pytest.fixture(scope="session")
def etcd_server():
    """One real etcd for the whole run (temp data dir, free loopback ports), started the way
    users start theirs (shadowtopic.testing)."""
    from shadowtopic.testing import start_etcd

    server = start_etcd(timeout=30)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def arun() -> Callable[..., Any]:
    """`arun(coro, timeout=30)`: run a coroutine on a fresh event loop, bounded in time."""

    def run(coro: Coroutine, timeout: float = 30.0) -> Any:
        return asyncio.run(asyncio.wait_for(coro, timeout))

    return run


@pytest.fixture(scope="session")
def spark():
    """The test run's one SparkSession (local[2]), built on first use (compaction tests).
    Jobs cut any input into a task per core (no least bytes per task), so small test data
    still runs several tasks and writes several parts."""
    from shadowtopic.compaction.session import build_session
    from shadowtopic.compaction.spark_job import MIN_TASK_BYTES
    from shadowtopic.compaction.worker import stop_spark

    session = build_session("local[2]", {"spark.driver.memory": "1g", MIN_TASK_BYTES: "0"})
    try:
        yield session
    finally:
        stop_spark(session)


@pytest.fixture(scope="session")
def cluster():
    """A cluster name of this test process's own (the compaction tests' worker serves it;
    their brokers are of it, their topics their own)."""
    import uuid

    return f"c-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def worker(etcd_server, tmp_path_factory, cluster):
    """The compaction worker of `cluster`: one per test process, started by the first test
    that needs it and shared by every module after (a start is mostly Spark's JVM, 20 s
    and more on a loaded machine); the files that use it run in one test process
    (`SHARED_WORKER_FILES`). A test that needs a worker it may kill or hold with
    failpoints starts one of its own (test_compaction_failpoints.py)."""
    from support.compaction_support import start_worker

    w = start_worker(etcd_server, str(tmp_path_factory.mktemp("worker")), cluster)
    try:
        yield w
    finally:
        w.kill()
