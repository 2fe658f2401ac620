"""Closing a reader or a client is prompt and leaves nothing behind that could hang the
process: a `read_next` blocked in another thread ends with `AlreadyClosed`, and the Connect
stream's call object is released by `Client.close`, not by the garbage collector at exit.

The last point is the cause of a CLI that printed everything and then hung in a futex wait
with one thread left: gRPC raises the call object itself, so it sat in a reference cycle; the
collector freed it during interpreter shutdown, after daemon threads were frozen, and its
`__del__` waited for the call's lock, which a frozen gRPC thread could hold.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import weakref

import pytest

from shadowtopic.client import Client, errors


def _blocked_read(reader) -> tuple[threading.Thread, list]:
    """Start read_next(timeout=30) on an empty topic in a thread; return it once blocked."""
    outcome: list = []

    def run():
        try:
            outcome.append(reader.read_next(timeout=30))
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    time.sleep(0.5)  # let it reach the queue wait
    assert th.is_alive() and not outcome, outcome
    return th, outcome


def _ends_with_already_closed(th: threading.Thread, outcome: list) -> None:
    th.join(5)
    assert not th.is_alive(), "read_next still blocked after close"
    assert len(outcome) == 1 and isinstance(outcome[0], errors.AlreadyClosed), outcome


def test_reader_close_wakes_a_blocked_read_next(client, topic):
    client.admin.create_topic(topic)
    reader = client.create_reader(topic, start="earliest")
    th, outcome = _blocked_read(reader)
    t0 = time.monotonic()
    reader.close()
    assert time.monotonic() - t0 < 2
    _ends_with_already_closed(th, outcome)
    assert time.monotonic() - t0 < 3
    with pytest.raises(errors.AlreadyClosed):
        reader.read_next(timeout=1)
    with pytest.raises(errors.AlreadyClosed):
        reader.has_message_available()


def test_client_close_wakes_a_blocked_read_next(broker, topic):
    c = Client(broker.url, timeout=10)
    c.admin.create_topic(topic)
    reader = c.create_reader(topic, start="earliest")
    th, outcome = _blocked_read(reader)
    t0 = time.monotonic()
    c.close()
    assert time.monotonic() - t0 < 5
    _ends_with_already_closed(th, outcome)
    c.close()  # twice is fine
    with pytest.raises(errors.AlreadyClosed):
        c.create_reader(topic)
    with pytest.raises(errors.AlreadyClosed):
        c.admin.get_topic(topic)


def test_client_close_ends_the_stream_thread_and_frees_the_call(broker, topic):
    with Client(broker.url, timeout=10) as c:
        c.admin.create_topic(topic)
        with c.create_producer(topic) as p:
            for i in range(50):
                p.send_async(f"m{i}")
        reader = c.create_reader(topic, start="earliest")
        assert [reader.read_next(timeout=10).value() for _ in range(3)] == ["m0", "m1", "m2"]
        mux = c._multiplexer()  # the stream to the broker serving the topic (the only one)
        call = weakref.ref(mux._responses)
        rx = mux._thread
    # no garbage collection needed: refcounting alone freed it while every thread ran
    assert not rx.is_alive()
    assert call() is None, "the Connect call object outlived Client.close"


SCRIPT = """
import gc, sys, threading, time
from shadowtopic.client import Client

gc.disable()  # as when no collection happens to run between close and exit


def read_one(url, topic):  # like the CLI: the client lives in a function, not in a global
    with Client(url, timeout=10) as client:
        with client.create_reader(topic, start="earliest") as reader:
            reader.read_next(timeout=10)
            return client._multiplexer()._responses._state.condition  # gRPC's lock of the call


def frozen_grpc_thread(lock):  # a daemon thread stopped inside the lock at exit
    with lock:
        time.sleep(600)


threading.Thread(target=frozen_grpc_thread, args=(read_one(*sys.argv[1:]),),
                 daemon=True).start()
time.sleep(0.2)
print("exiting", flush=True)
"""


def test_exit_while_a_grpc_thread_holds_the_call_lock_does_not_hang(client, broker, topic):
    client.admin.create_topic(topic)
    with client.create_producer(topic) as p:
        p.send("m0")
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SCRIPT), broker.url, topic],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the process hung at exit (the call object was finalized at shutdown)")
    assert proc.returncode == 0, err
    assert out.strip() == "exiting"
