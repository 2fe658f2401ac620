"""The producer's linger thread (source/client/producer.py, `_linger_loop`): it closes a batch
`linger_ms` after its first message and sleeps while no batch is open. It used to wake every
`linger_ms` whatever there was to do: 100 idle producers with linger_ms=1 in one process were
100,000 wakeups a second, enough to starve their own sender threads (bench/object_wal.py at
100 topics), and linger_ms=0 spun.

The thread's wakeups are counted by the kernel (/proc/self/task/<tid>/schedstat, its third
field: the times the thread was scheduled), so the test counts them, not seconds."""
from __future__ import annotations

import os
import time

import pytest

from shadowtopic.client.producer import Producer

TOPIC = "persistent://public/default/linger"


class NoBroker:
    """What a non-idempotent producer reads of its connection before its first batch."""

    timeout = 5.0
    operation_timeout = 5.0


def scheduled(thread) -> int:
    with open(f"/proc/self/task/{thread.native_id}/schedstat") as f:
        return int(f.read().split()[2])


pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/task"),
                                reason="needs Linux's /proc/<pid>/task/<tid>/schedstat")


@pytest.mark.parametrize("linger_ms", [0, 1])
def test_an_idle_producers_linger_thread_sleeps(linger_ms):
    p = Producer(NoBroker(), TOPIC, idempotent=False, linger_ms=linger_ms)  # type: ignore[arg-type]
    try:
        time.sleep(0.1)  # the thread has started and gone to sleep
        before = scheduled(p._flusher)
        time.sleep(0.5)  # 500 linger periods of 1 ms
        woke = scheduled(p._flusher) - before
    finally:
        p.close()  # no batch: nothing to flush
        p._flusher.join(5)
    assert woke <= 5, f"an idle linger thread was scheduled {woke} times in 0.5 s"
    assert not p._flusher.is_alive(), "close did not wake the linger thread"

