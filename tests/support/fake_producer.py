"""A stand-in for the client's `Producer` where dead and retry letters are sent: it records
each send (payload, key, properties, event time) and, with a `log`, the origin id of each;
`fail=True` makes every send time out."""
from __future__ import annotations

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId


class FakeProducer:
    def __init__(self, log: list | None = None, fail: bool = False):
        self.log = log
        self.fail = fail
        self.sent: list[tuple] = []
        self.closed = False

    def send(self, payload, key=None, properties=None, event_time=0, timeout=None):
        if self.fail:
            raise errors.Timeout("no receipt")
        self.sent.append((payload, key, dict(properties or {}), event_time))
        if self.log is not None:
            self.log.append(("sent", dict(properties or {}).get("ORIGIN_MESSAGE_ID")))
        return MessageId(9, len(self.sent) - 1)

    def close(self):
        self.closed = True
