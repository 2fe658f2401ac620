"""The worker starts Spark's JVM once more when it exits before it answers (a JVM that did
not come up), and lets every other failure through. Without Spark: `build_session` is
replaced by one that fails as told."""
from __future__ import annotations

import pytest
from pyspark.errors.exceptions.base import PySparkRuntimeError

from shadowtopic.compaction import worker


def _failing(failures: list[Exception]):
    calls = []

    def build(master, conf):
        calls.append(master)
        if failures:
            raise failures.pop(0)
        return "session"

    return build, calls


def _gateway_exited() -> PySparkRuntimeError:
    return PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})


def test_a_jvm_that_exits_while_starting_is_started_once_more(monkeypatch):
    build, calls = _failing([_gateway_exited()])
    monkeypatch.setattr(worker, "build_session", build)
    assert worker.start_spark("local[1]", {}) == "session"
    assert calls == ["local[1]", "local[1]"]


def test_a_second_exit_and_other_failures_are_raised(monkeypatch):
    build, calls = _failing([_gateway_exited(), _gateway_exited()])
    monkeypatch.setattr(worker, "build_session", build)
    with pytest.raises(PySparkRuntimeError):
        worker.start_spark("local[1]", {})
    assert len(calls) == 2
    build, calls = _failing([ValueError("bad spark.master")])
    monkeypatch.setattr(worker, "build_session", build)
    with pytest.raises(ValueError):
        worker.start_spark("nonsense", {})
    assert calls == ["nonsense"]


def test_keep_warm_is_30_seconds_by_default_0_turns_it_off_and_a_negative_is_refused(capsys):
    assert worker.parse_args(["--cluster", "c"]).keep_warm == 30.0
    assert worker.parse_args(["--keep-warm", "0"]).keep_warm == 0.0
    with pytest.raises(SystemExit):
        worker.parse_args(["--keep-warm", "-1"])
    assert "--keep-warm must be 0 (off) or more seconds, got -1" in capsys.readouterr().err
