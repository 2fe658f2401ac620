"""The one set of waiting helpers of the tests: polling a condition until it holds
(`wait_for`, and `wait_for_async` inside a coroutine, whose condition may be a coroutine
function), retrying a check until its assertions pass (`eventually`), receiving a number of
messages from a consumer (`drain`) and checking that no more come (`nothing_more`). Every
loop here is bounded in count and in time; a wait that runs out fails the test with an
AssertionError naming what it waited for."""
from __future__ import annotations

import asyncio
import inspect
import time

from shadowtopic.client import errors


def wait_for(cond, timeout: float = 20.0, what: str = "condition", *,
             interval: float = 0.1, ignore: tuple[type[BaseException], ...] = ()):
    """Poll `cond()` every `interval` seconds until it returns something true, for
    `timeout` seconds at most; that value. An exception of a type in `ignore` raised by
    `cond()` counts as not yet (e.g. a restarted broker that does not own a topic yet)."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / interval) + 2):
        try:
            value = cond()
        except ignore:
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


async def wait_for_async(cond, timeout: float = 20.0, what: str = "condition", *,
                         interval: float = 0.02):
    """`wait_for` inside a coroutine: poll `cond()` (a plain function, or one returning an
    awaitable) every `interval` seconds without blocking the loop; its first true value."""
    deadline = time.monotonic() + timeout
    value = None
    for _ in range(int(timeout / interval) + 2):
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {value!r})")


def eventually(check, timeout: float = 20.0, interval: float = 0.2):
    """Retry `check()` until it returns without an AssertionError, for `timeout` seconds
    at most; its value (the last AssertionError if it never passes)."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / interval) + 2):
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(interval)
    return check()


def drain(consumer, n: int, timeout: float = 20.0, ack: bool = True) -> list:
    """Receive `n` messages within `timeout` seconds (acknowledging each unless `ack` is
    false); the messages, in the order received."""
    out: list = []
    deadline = time.monotonic() + timeout
    for _ in range(n + 2 * int(timeout) + 10):  # a message or a receive slice of <= 1 s each
        if len(out) >= n:
            return out
        left = deadline - time.monotonic()
        assert left > 0, f"got {len(out)} of {n} messages"
        try:
            msg = consumer.receive(timeout=min(left, 1.0))
        except errors.Timeout:
            continue
        out.append(msg)
        if ack:
            consumer.acknowledge(msg)
    assert len(out) >= n, f"got {len(out)} of {n} messages"
    return out


def nothing_more(consumer, wait: float = 0.5) -> bool:
    """True when `consumer` receives nothing within `wait` seconds."""
    try:
        consumer.receive(timeout=wait)
    except errors.Timeout:
        return True
    return False


def wait_cursors_saved(client, topic: str, timeout: float = 60.0) -> None:
    """Wait until no cursor of `topic` is unsaved (internal stats' `cursorsUnsaved`: changed
    and not yet written by a cursor flush), so a kill -9 now takes back no acknowledgement
    that reached the broker. Call it once the acks are known to have arrived (a backlog
    check): acks still on their way are not counted."""
    def saved() -> bool:
        cursors = client.admin.internal_stats(topic)["cursors"]
        return bool(cursors) and all(int(c.get("cursorsUnsaved", 0)) == 0
                                     for c in cursors.values())
    wait_for(saved, timeout, f"the cursors of {topic} to be saved")
