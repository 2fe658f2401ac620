"""The sync client: one channel to a broker, admin calls, producers and readers.

    with Client("localhost:6650") as client:
        client.admin.create_topic("my-topic")
        with client.create_producer("my-topic") as p:
            p.send(b"hello", key="k1")
        with client.create_reader("my-topic", start="earliest") as r:
            for msg in r:
                print(msg)  # id, key, payload (as text), properties
"""
from __future__ import annotations

import threading

from source.client.admin import Admin
from source.client.connection import Connection
from source.client.producer import Producer
from source.client.reader import Multiplexer, Reader
from source.core import errors
from source.core.message_id import MessageId
from source.core.names import canonical


class Client:
    def __init__(self, url: str | None = None, timeout: float = 30.0):
        self._conn = Connection(url, timeout)
        self.url = self._conn.url
        self.admin = Admin(self._conn)
        self._mux: Multiplexer | None = None
        self._lock = threading.Lock()
        self._children: list = []
        self._closed = False

    def _partitions(self, topic: str) -> int:
        return self.admin.get_topic(topic).partitions

    def create_producer(self, topic: str, producer_name: str = "", **options) -> Producer:
        """A producer; options: batch_max_messages, batch_max_bytes, linger_ms, max_inflight."""
        topic = canonical(topic)
        p = Producer(self._conn, topic, self._partitions(topic), producer_name, **options)
        self._children.append(p)
        return p

    def create_reader(self, topic: str, start: str | MessageId = "earliest",
                      inclusive: bool = False, receiver_queue_size: int = 1000) -> Reader:
        """A non-durable reader from "earliest", "latest" or a MessageId ("L:E" text too)."""
        topic = canonical(topic)
        partitions = self._partitions(topic)
        with self._lock:
            if self._closed:
                raise errors.AlreadyClosed("client is closed")
            if self._mux is None or self._mux.dead:  # a broken stream is replaced
                if self._mux is not None:
                    self._mux.close()
                self._mux = Multiplexer(self._conn)
            mux = self._mux
        r = Reader(self._conn, mux, topic, partitions, start, inclusive, receiver_queue_size)
        self._children.append(r)
        return r

    def close(self) -> None:
        """Close every producer and reader, then the consumer stream, then the channel (even
        when something before fails). A `read_next` waiting in another thread raises
        `AlreadyClosed`; later calls raise it too. Closing twice is a no-op."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            children, self._children = self._children, []
            mux = self._mux
        try:
            for child in children:
                try:
                    child.close()
                except Exception:  # noqa: BLE001 - closing everything regardless
                    pass
            if mux is not None:
                mux.close()
        finally:
            self._conn.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
