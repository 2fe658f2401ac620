"""Topics a broker gave up lately (load shedding: source/broker/shedding.py) and does not take
back yet: for `hold_s` (HOLD_S) it neither opens them nor names itself for them in a lookup,
so a client still coming here goes to the broker that took the topic."""
from __future__ import annotations

import time

from shadowtopic.core.names import TopicName

HOLD_S = 30.0


class HeldTopics:
    """Topics this broker gave up lately (load shedding) and does not take back yet."""

    def __init__(self, hold_s: float = HOLD_S):
        self.hold_s = hold_s
        self._since: dict[TopicName, float] = {}

    def hold(self, topic: TopicName) -> None:
        self._since[topic] = time.monotonic()

    def refuses(self, topic: TopicName) -> bool:
        """Whether `topic` was given up here less than `hold_s` ago."""
        at = self._since.get(topic)
        if at is None:
            return False
        if time.monotonic() - at >= self.hold_s:
            del self._since[topic]
            return False
        return True

    def held(self) -> list[TopicName]:
        return [t for t in list(self._since) if self.refuses(t)]
