"""Ctrl-C reaches a user blocked in the client: `receive`, `read_next`, `send` and a table
view's wait raise KeyboardInterrupt within about a second, from a real SIGINT delivered to the
thread that waits, and the object goes on working afterwards (against a real broker, paused
with SIGSTOP where the wait must be on the broker)."""
from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from shadowtopic.client import Client

PRESS_AFTER_S = 0.5
PROMPT_S = 3.0  # how soon after the press the call must have raised


@contextmanager
def ctrl_c_after(seconds: float = PRESS_AFTER_S) -> Iterator[list[float]]:
    """SIGINT to this (the main) thread `seconds` from now, Python's default handler in place
    (KeyboardInterrupt); yields a list that holds the press's monotonic time once pressed."""
    # Python runs signal handlers in the main thread only: a test run elsewhere would prove
    # nothing, so it fails instead of skipping
    assert threading.current_thread() is threading.main_thread(), \
        "Ctrl-C tests must run in the main thread"
    main = threading.main_thread().ident
    assert main is not None
    pressed: list[float] = []

    def press() -> None:
        pressed.append(time.monotonic())
        signal.pthread_kill(main, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(seconds, press)
    timer.start()
    try:
        yield pressed
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGINT, previous)


def interrupted(call) -> float:
    """Run `call()` until Ctrl-C ends it; how long after the press it raised."""
    with ctrl_c_after() as pressed, pytest.raises(KeyboardInterrupt):
        call()
    assert pressed, "the call returned before Ctrl-C"
    waited = time.monotonic() - pressed[0]
    assert waited < PROMPT_S, f"KeyboardInterrupt came {waited:.1f}s after Ctrl-C"
    return waited


@contextmanager
def paused(broker) -> Iterator[None]:
    os.kill(broker.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(broker.proc.pid, signal.SIGCONT)


def test_ctrl_c_ends_a_blocked_receive_and_read_and_both_go_on(client, topic):
    client.admin.create_topic(topic)
    with client.subscribe(topic, "s", initial_position="earliest") as consumer, \
            client.create_reader(topic, "earliest") as reader:
        interrupted(lambda: consumer.receive(timeout=20))   # (a Timeout: not interrupted)
        interrupted(lambda: reader.read_next(timeout=20))
        with client.create_producer(topic) as p:
            p.send(b"after")
        assert consumer.receive(timeout=20).payload == b"after"
        assert reader.read_next(timeout=20).payload == b"after"


@pytest.mark.own_broker
def test_ctrl_c_ends_a_send_waiting_for_its_receipt_and_the_producer_goes_on(broker, topic):
    with Client(broker.url, timeout=60) as c:
        c.admin.create_topic(topic)
        with c.create_producer(topic) as p:
            p.send(b"before")
            with paused(broker):
                interrupted(lambda: p.send(b"while paused", timeout=20))
            mid = p.send(b"after", timeout=60)
        with c.create_reader(topic, "earliest") as r:
            got = [r.read_next(timeout=20) for _ in range(3)]
    # the interrupted send was queued: it is stored once, in order (idempotent producing)
    assert [m.payload for m in got] == [b"before", b"while paused", b"after"]
    assert got[-1].message_id == mid


@pytest.mark.own_broker
def test_ctrl_c_ends_a_table_views_wait_and_the_view_goes_on(broker, topic):
    with Client(broker.url, timeout=60) as c:
        c.admin.create_topic(topic)
        with c.create_producer(topic) as p:
            p.send(b"1", key="a")
        with c.table_view(topic, timeout=30) as view:
            with paused(broker):
                interrupted(lambda: view.refresh(timeout=20))
            with c.create_producer(topic) as p:
                p.send(b"2", key="a")
            view.refresh(timeout=30)
            assert view.get("a").payload == b"2"
        with paused(broker):
            interrupted(lambda: c.table_view(topic, timeout=20))
