"""F6: a paused former owner cannot append once another broker took its topic."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from shadowtopic.client import Client
from shadowtopic.core import errors


@pytest.mark.slow
def test_paused_owner_is_fenced_and_history_does_not_diverge(two_brokers, topic):
    a, b = two_brokers
    acked_a: list[tuple[bytes, str]] = []
    stop = threading.Event()

    def produce_on_a() -> None:
        with Client(a.url, timeout=5) as c:
            p = c.create_producer(topic)
            i = 0
            while not stop.is_set() and i < 100_000:
                payload = f"a{i}".encode()
                try:
                    acked_a.append((payload, str(p.send(payload, timeout=5))))
                except errors.ShadowTopicError:
                    time.sleep(0.05)
                i += 1

    try:
        with Client(a.url) as c:
            c.admin.create_topic(topic)
        pump = threading.Thread(target=produce_on_a, daemon=True)
        pump.start()
        deadline = time.monotonic() + 30
        while len(acked_a) < 20:
            assert time.monotonic() < deadline, "A never acknowledged anything"
            time.sleep(0.05)
        os.kill(a.proc.pid, signal.SIGSTOP)          # A pauses past its lease
        paused_at = len(acked_a)
        time.sleep(1.0)
        b_id = None
        with Client(b.url, timeout=5) as c:
            deadline = time.monotonic() + 30
            while b_id is None:                      # B takes the topic once A's lease expires
                try:  # (until then Lookup names A, which does not answer: a new attempt)
                    with c.create_producer(topic) as p:
                        b_id = p.send(b"b0", timeout=5)
                except (errors.TopicNotOwned, errors.ServiceUnavailable, errors.Timeout):
                    assert time.monotonic() < deadline, "B could not take the topic"
                    time.sleep(0.2)
        os.kill(a.proc.pid, signal.SIGCONT)          # A wakes up still believing it owns it
        time.sleep(3.0)
        stop.set()
        pump.join(30)
        assert not pump.is_alive()
        assert a.proc.poll() is None, "A crashed instead of fencing itself"

        with Client(b.url) as c, c.create_reader(topic) as r:
            log = [(m.payload, str(m.message_id)) for m in r]
        in_log = dict(log)
        lost = [(pl, mid) for pl, mid in acked_a if in_log.get(pl) != mid]
        assert not lost, f"A acknowledged {len(lost)} messages that are not in the log: {lost[:3]}"
        assert in_log.get(b"b0") == str(b_id)
        after_takeover = [pl for pl, _ in acked_a[paused_at:]]
        assert all(in_log.get(pl) for pl in after_takeover)
        ids = [mid for _, mid in log]
        assert len(set(ids)) == len(ids)
    finally:
        stop.set()
