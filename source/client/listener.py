"""Message listeners: messages pushed to a callback instead of pulled with `receive`.

One `Listeners` (one thread) serves every consumer of a `Client.subscribe_many` call that
passed `message_listener=`: a consumer that gets entries while idle is queued once; the
thread takes its buffered messages and calls `callback(consumer, message)` for each, in
order. Nothing is polled: 100,000 idle consumers cost no CPU here. A callback that raises
is logged and the next message goes on (Pulsar's MessageListener behaves alike); a slow
callback holds back the consumers queued behind it, never the stream (each consumer's
buffer is bounded by its permits, `receiver_queue_size`).
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from source.client.consumer import Consumer
    from source.client.message import Message

log = logging.getLogger(__name__)

Callback = Callable[["Consumer", "Message"], None]


class Listeners:
    def __init__(self, callback: Callback):
        self._callback = callback
        self._ready: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, daemon=True, name="consumer-listener")
        self._thread.start()

    def ready(self, consumer: "Consumer") -> None:
        """`consumer` has messages buffered (called with its condition held, at most once
        until the thread took them)."""
        self._ready.put(consumer)

    def close(self) -> None:
        self._ready.put(None)

    def _run(self) -> None:
        while (consumer := self._ready.get()) is not None:
            for msg in consumer._take_ready():
                try:
                    self._callback(consumer, msg)
                except Exception:  # noqa: BLE001 - a user callback must not stop the others
                    log.exception("message listener failed on %s", msg.message_id)
