"""Per-topic counters and rates (Pulsar's msgRateIn/Out over a one-minute window).

Counters are plain integers bumped on the hot path; rates come from (time, counter) samples
taken at most once a second when someone reads them or bumps them.
"""
from __future__ import annotations

import datetime
import time
from collections import deque

WINDOW_S = 60.0


class TopicCounters:
    __slots__ = ("msg_in", "bytes_in", "msg_out", "bytes_out", "_samples")

    def __init__(self) -> None:
        self.msg_in = self.bytes_in = self.msg_out = self.bytes_out = 0
        self._samples: deque[tuple[float, int, int, int, int]] = deque()

    def add_in(self, msgs: int, size: int) -> None:
        self.msg_in += msgs
        self.bytes_in += size

    def add_out(self, msgs: int, size: int) -> None:
        self.msg_out += msgs
        self.bytes_out += size

    def rates(self) -> tuple[float, float, float, float]:
        """(msg_rate_in, throughput_in, msg_rate_out, throughput_out) per second."""
        now = time.monotonic()
        s = self._samples
        if not s or now - s[-1][0] >= 1.0:
            s.append((now, self.msg_in, self.bytes_in, self.msg_out, self.bytes_out))
        while len(s) > 1 and now - s[0][0] > WINDOW_S:
            s.popleft()
        t0, mi, bi, mo, bo = s[0]
        dt = now - t0
        if dt <= 0:
            return 0.0, 0.0, 0.0, 0.0
        return ((self.msg_in - mi) / dt, (self.bytes_in - bi) / dt,
                (self.msg_out - mo) / dt, (self.bytes_out - bo) / dt)


class Publisher:
    """One producer on one topic (a Produce stream that wrote to the topic)."""

    __slots__ = ("producer_name", "address", "connected_since", "counters")

    def __init__(self, producer_name: str, address: str):
        self.producer_name = producer_name
        self.address = address
        self.connected_since = datetime.datetime.now(datetime.UTC).isoformat()
        self.counters = TopicCounters()
