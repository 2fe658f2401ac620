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
from typing import Any, Callable, Coroutine

import pytest

PROCESS_FIXTURES = {"etcd_server", "spark"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "test_integration" in item.path.parts or PROCESS_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def etcd_server():
    """One real etcd for the whole run (temp data dir, free loopback ports)."""
    from shadowtopic.metadata.etcd_server import EtcdServer

    server = EtcdServer()
    server.start(timeout=30)
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
