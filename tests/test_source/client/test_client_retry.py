"""The client's retry loop (source/client/retry.py) on a fake clock: what it retries, how it
backs off, and what it raises once the operation timeout would pass. No real time passes."""
from __future__ import annotations

import pytest

from shadowtopic.client import Client, errors
from shadowtopic.client.options import operation_timeout
from shadowtopic.client.retry import (
    INITIAL_BACKOFF_S,
    MAX_BACKOFF_S,
    MIN_ATTEMPT_S,
    Backoff,
    Deadline,
    Retry,
    not_applied,
    retriable,
)


class Clock:
    """A clock that moves only when the loop sleeps (or a test says)."""

    def __init__(self):
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


def retry(timeout: float, clock: Clock, rand: float = 1.0) -> Retry:
    return Retry(timeout, clock=clock, sleep=clock.sleep, rand=lambda: rand)


def failing(*outcomes):
    """An attempt that raises each of `outcomes` in turn (a non-exception is returned)."""
    calls: list = []

    def attempt(deadline: Deadline):
        calls.append(deadline.left())
        out = outcomes[len(calls) - 1]
        if isinstance(out, BaseException):
            raise out
        return out
    return attempt, calls


def test_retriable_errors_are_retried_until_the_attempt_succeeds():
    clock = Clock()
    attempt, calls = failing(errors.TopicNotOwned("reloading"), errors.ConnectError("down"),
                             errors.ServiceUnavailable("away"), errors.Timeout("slow"), "ok")
    assert retry(30, clock).run(attempt) == "ok"
    assert len(calls) == 5
    assert clock.sleeps == [0.05, 0.1, 0.2, 0.4]  # rand 1.0: the full pause each time


def test_backoff_doubles_to_its_cap_with_jitter():
    clock = Clock()
    attempt, calls = failing(*[errors.ServiceUnavailable("away")] * 8, "ok")
    assert retry(60, clock, rand=0.0).run(attempt) == "ok"
    full = [min(INITIAL_BACKOFF_S * 2 ** i, MAX_BACKOFF_S) for i in range(8)]
    assert clock.sleeps == pytest.approx([f / 2 for f in full])  # rand 0: half the pause
    assert full[-1] == MAX_BACKOFF_S


def test_a_non_retriable_error_is_raised_at_once():
    clock = Clock()
    attempt, calls = failing(errors.NotAllowed("never served"), "ok")
    with pytest.raises(errors.NotAllowed):
        retry(30, clock).run(attempt)
    assert len(calls) == 1 and clock.sleeps == []


def test_other_exceptions_are_not_retried():
    clock = Clock()
    attempt, calls = failing(KeyError("bug"), "ok")
    with pytest.raises(KeyError):
        retry(30, clock).run(attempt)
    assert len(calls) == 1


def test_the_last_retriable_error_is_raised_once_the_timeout_would_pass():
    clock = Clock()
    seen = [errors.ConnectError(f"down {i}") for i in range(100)]
    attempt, calls = failing(*seen[:-1], errors.TopicNotOwned("moving"))
    with pytest.raises(errors.ShadowTopicError) as info:
        retry(3, clock).run(attempt)
    err = info.value
    assert err is seen[len(calls) - 1]  # the last one, typed as it came
    assert err.reason == "ConnectError" and err.retriable
    assert 1 < len(calls) < 100
    assert sum(clock.sleeps) <= 3
    assert clock.now - 100 <= 3  # no sleep past the deadline
    assert any("operation timeout" in note for note in err.__notes__)
    assert calls[-1] == pytest.approx(MIN_ATTEMPT_S)  # a last try just before the deadline
    assert all(left >= MIN_ATTEMPT_S - 1e-9 for left in calls)  # each had time to try


def test_a_timeout_shorter_than_the_first_pause_raises_after_one_attempt():
    clock = Clock()
    attempt, calls = failing(errors.ServiceUnavailable("away"), "ok")
    with pytest.raises(errors.ServiceUnavailable) as info:
        retry(0.01, clock).run(attempt)
    assert len(calls) == 1 and clock.sleeps == []
    assert not getattr(info.value, "__notes__", [])


def test_time_spent_in_attempts_counts_against_the_timeout():
    clock = Clock()
    calls: list = []

    def attempt(deadline: Deadline):
        calls.append(deadline.left())
        clock.now += 2  # each attempt takes 2 s before failing
        raise errors.Timeout("slow")
    with pytest.raises(errors.Timeout):
        retry(5, clock).run(attempt)
    assert len(calls) == 3 and calls[0] == 5  # at 0, ~2.05 and ~4.15 s
    assert clock.now - 100 < 7


def test_not_applied_retries_only_errors_that_guarantee_nothing_was_done():
    for err in (errors.TopicNotOwned("before acting"), errors.ServiceUnavailable("taken back"),
                errors.ConnectError("failed to connect to all addresses; last error: ..."),
                errors.ConnectError("DNS resolution failed for nowhere:1")):
        assert not_applied(err), err
    for err in (errors.MetadataUnavailable("etcd write timed out"), errors.Timeout("late"),
                errors.ConnectError("Socket closed"), errors.ConnectError("Cancelling all calls"),
                errors.Fenced("fenced"), errors.NotAllowed("no")):
        assert not not_applied(err), err
    assert retriable(errors.MetadataUnavailable("x")) and not retriable(errors.NotAllowed("x"))


def test_not_applied_as_the_loop_uses_it():
    clock = Clock()
    attempt, calls = failing(errors.ServiceUnavailable("taken back"),
                             errors.MetadataUnavailable("maybe applied"), "ok")
    with pytest.raises(errors.MetadataUnavailable):
        retry(30, clock).run(attempt, not_applied)
    assert len(calls) == 2


def test_deadline_budget_is_capped_and_never_zero():
    clock = Clock()
    d = Deadline(10, clock)
    assert d.budget(3) == 3 and d.left() == 10
    clock.now += 9
    assert d.budget(3) == pytest.approx(1)
    clock.now += 5
    assert d.left() == 0 and d.budget(3) == MIN_ATTEMPT_S


def test_operation_timeout_option():
    assert operation_timeout(None, 12.5) == 12.5
    assert operation_timeout(2, 30) == 2.0
    for bad in (0, -1, "5", True, float("nan"), float("inf")):
        with pytest.raises(errors.InvalidArgument):
            operation_timeout(bad, 30)
    with Client("127.0.0.1:1", timeout=7) as c:
        assert c._conn.operation_timeout == 7  # default: the per-call timeout
    with Client("127.0.0.1:1", timeout=7, operation_timeout=0.5) as c:
        assert c._conn.operation_timeout == 0.5
    with pytest.raises(errors.InvalidArgument):
        Client("127.0.0.1:1", operation_timeout=-3)


def test_a_timeout_the_operations_end_cut_short_does_not_hide_the_error_before_it():
    clock = Clock()
    away = errors.ServiceUnavailable("the shadow broker is away")

    def attempt(deadline: Deadline):
        if deadline.left() > 1:
            raise away
        clock.now += deadline.left()  # the last attempt runs out of time
        raise errors.Timeout("no answer in time")
    with pytest.raises(errors.ServiceUnavailable) as info:
        retry(3, clock).run(attempt)
    assert info.value is away and isinstance(info.value.__context__, errors.Timeout)
    assert any("operation timeout" in note for note in info.value.__notes__)


def test_only_timeouts_raise_the_timeout():
    clock = Clock()

    def attempt(deadline: Deadline):
        clock.now += deadline.budget(1.0)
        raise errors.Timeout("no answer in time")
    with pytest.raises(errors.Timeout):
        retry(3, clock).run(attempt)


def test_one_backoff_policy_doubles_to_its_cap_jittered_and_starts_over_after_a_reset():
    """`Backoff` is every retry's and reconnect's (retry.py, reconnect.py, producer.py)."""
    draws = iter([1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    backoff = Backoff(lambda: next(draws))
    pauses = [backoff.pause() for _ in range(7)]
    assert pauses == pytest.approx([0.05, 0.1, 0.1, 0.4, 0.8, 1.0, 1.0])  # 3rd: rand 0, half
    assert backoff.pause(limit=0.25) == 0.25  # cut to what is left of the operation
    backoff.reset()
    assert backoff.pause() == pytest.approx(INITIAL_BACKOFF_S)
