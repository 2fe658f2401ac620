"""The ack timeout's pieces without a broker (source/client/ack_timeout.py): the pure
"unacknowledged since" tracker, the option's range, and the one timer thread."""
from __future__ import annotations

import threading
import time

import pytest

from shadowtopic.client.ack_timeout import AckTimer, UnackedTracker, check_ack_timeout
from shadowtopic.core import errors


def test_due_takes_out_what_waited_the_timeout_oldest_first():
    t: UnackedTracker[str, int] = UnackedTracker(1.0)
    assert t.next_due() is None
    assert t.add("a", 1, now=10.0) is True          # was empty: a new deadline
    assert t.add("b", 2, now=10.5) is False
    assert t.next_due() == 11.0
    assert t.due(10.99) == []
    assert t.due(11.0) == [("a", 1)]
    assert t.next_due() == 11.5 and len(t) == 1
    assert t.due(100.0) == [("b", 2)]
    assert t.due(200.0) == [] and t.next_due() is None


def test_adding_again_restarts_a_timer_and_removing_stops_it():
    t: UnackedTracker[str, str] = UnackedTracker(1.0)
    t.add("a", "first", now=0.0)
    t.add("b", "b", now=0.2)
    t.add("a", "again", now=0.5)                     # received again: timed anew
    assert t.due(1.2) == [("b", "b")]
    assert t.due(1.5) == [("a", "again")]
    t.add("c", "c", now=2.0)
    assert t.remove("c") == "c" and t.remove("c") is None
    assert t.due(10.0) == []


def test_remove_where_and_clear():
    t: UnackedTracker[tuple[int, int], None] = UnackedTracker(1.0)
    for i in range(6):
        t.add((i % 2, i), None, now=float(i))
    t.remove_where(lambda k: k[0] == 0 and k[1] <= 2)   # a cumulative ack of partition 0
    assert (0, 0) not in t and (0, 2) not in t and (0, 4) in t and (1, 1) in t
    assert [k for k, _ in t.due(100.0)] == [(1, 1), (1, 3), (0, 4), (1, 5)]
    t.add((0, 9), None, now=0.0)
    t.clear()
    assert len(t) == 0 and t.next_due() is None


@pytest.mark.parametrize("ms", [0, 1000, 30_000, (1 << 32) - 1])
def test_ack_timeout_accepts_off_and_from_one_second(ms):
    assert check_ack_timeout(ms) == ms


@pytest.mark.parametrize("ms", [1, 999, -1, 1 << 32, 1.5, "1000", True, None])
def test_ack_timeout_refuses_the_rest(ms):
    with pytest.raises(errors.InvalidArgument):
        check_ack_timeout(ms)


def test_the_timer_calls_a_check_at_its_deadline_and_stops_with_no_checks():
    calls: list[float] = []
    fired = threading.Event()
    start = time.monotonic()

    def tick(now: float) -> float | None:
        calls.append(now)
        if now >= start + 0.3:
            fired.set()
            return None
        return start + 0.3

    timer = AckTimer()
    tick_id = timer.register(tick)
    assert fired.wait(5)
    assert calls[-1] >= start + 0.3 and len(calls) <= 5   # waits for the deadline, no polling
    timer.unregister(tick_id)
    thread = timer._thread
    if thread is not None:
        thread.join(5)
    assert timer._thread is None                          # no check: no thread
    again = threading.Event()
    timer.register(lambda now: again.set())               # a new check starts one again
    assert again.wait(5)
    timer.close()
    with pytest.raises(errors.AlreadyClosed):
        timer.register(lambda now: None)


def test_a_wake_shortens_the_wait_and_a_failing_check_stops_no_other():
    deadline = [time.monotonic() + 60.0]
    seen = threading.Event()

    def late(now: float) -> float | None:
        if now >= deadline[0]:
            seen.set()
            return None
        return deadline[0]

    def broken(now: float) -> float | None:
        raise RuntimeError("boom")

    timer = AckTimer()
    timer.register(broken)
    timer.register(late)
    time.sleep(0.1)
    deadline[0] = time.monotonic() + 0.2                  # came earlier: told so
    timer.wake()
    assert seen.wait(5)
    timer.close()
