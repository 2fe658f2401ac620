"""The asyncio client: the same client as `Client` (source/client/client.py), awaited.

    async with AsyncClient("localhost:6650") as client:
        await client.admin.create_topic("my-topic")
        async with await client.create_producer("my-topic") as producer:
            await producer.send(b"hello", key="k1")
        async with await client.subscribe("my-topic", "my-sub", initial_position="earliest") as c:
            msg = await c.receive(timeout=10)
            await c.acknowledge(msg)

Every option, type, error, lookup, redirect, reconnect and resend is the sync client's: an
`AsyncClient` holds a `Client` (the core) and gives each object it opens an asyncio face
(bridge.py says how a message crosses to the loop: a frame or a receipt burst at a time, no
thread per message). Opening waits for the broker on the client's own threads; cancelling
an `await client.subscribe(...)` closes whatever the open made meanwhile.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Unpack

from shadowtopic.client.aio.admin import AsyncAdmin
from shadowtopic.client.aio.bridge import POOL_THREADS, run_blocking, to_loop
from shadowtopic.client.aio.consumer import AsyncConsumer
from shadowtopic.client.aio.listener import AsyncCallback, AsyncFrameCallback, LoopListener
from shadowtopic.client.aio.producer import AsyncProducer
from shadowtopic.client.aio.reader import AsyncReader
from shadowtopic.client.aio.table_view import AsyncTableView
from shadowtopic.client.client import Client, check_listener
from shadowtopic.client.consumer import Consumer
from shadowtopic.client.dead_letter import DeadLetterPolicy
from shadowtopic.client.options import DEFAULT_TIMEOUT_S
from shadowtopic.client.producer import Producer, ProducerOptions
from shadowtopic.client.reader import Reader
from shadowtopic.client.table_view import TableView
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId

if TYPE_CHECKING:
    import pyarrow as pa
from shadowtopic.security.dial import AuthToken


def _close_all(consumers: list[Consumer]) -> None:
    for consumer in consumers:
        consumer.close()


class AsyncClient:
    def __init__(self, url: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 operation_timeout: float | None = None, *,
                 tls_trust_certs_file: str | None = None, tls_cert_file: str | None = None,
                 tls_key_file: str | None = None, auth_token: AuthToken | None = None):
        """As `Client`: a client of the broker at `url` (default $SHADOWTOPIC_URL or
        localhost:6650); `timeout` the longest one call may take; `operation_timeout`
        (default `timeout`) how long opening and admin calls retry temporary errors; TLS
        and `auth_token` as `Client`'s (a callable token is called on the client's threads,
        not the loop: it must not need the loop). Making one does no I/O: it may be made
        outside a running loop."""
        self._core = Client(url, timeout, operation_timeout,
                            tls_trust_certs_file=tls_trust_certs_file,
                            tls_cert_file=tls_cert_file, tls_key_file=tls_key_file,
                            auth_token=auth_token)
        self.url = self._core.url
        self._timeout = timeout
        self._pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="shadowtopic-aio")
        self.admin = AsyncAdmin(self._core.admin, self._pool)
        self._listeners: list[LoopListener] = []

    async def create_producer(self, topic: str, producer_name: str = "",
                              **options: Unpack[ProducerOptions]) -> AsyncProducer:
        """A producer; options as `Client.create_producer`'s."""
        core = await run_blocking(
            self._pool, lambda: self._core.create_producer(topic, producer_name, **options),
            Producer.close)
        return AsyncProducer(core, self._pool)

    async def create_reader(self, topic: str, start: str | MessageId = "earliest",
                            inclusive: bool = False, receiver_queue_size: int = 1000,
                            read_compacted: bool = False) -> AsyncReader:
        """A non-durable reader; as `Client.create_reader`."""
        core = await run_blocking(
            self._pool, lambda: self._core.create_reader(
                topic, start, inclusive, receiver_queue_size, read_compacted), Reader.close)
        return AsyncReader(core, self._pool, self._timeout)

    async def read_table(self, topic: str, compacted: bool = False,
                         start: MessageId | str | None = None, end: MessageId | str | None = None,
                         columns: Sequence[str] = (), timeout: float | None = None) -> pa.Table:
        """The messages of `topic` as one pyarrow table; as `Client.read_table`."""
        return await run_blocking(self._pool, lambda: self._core.read_table(
            topic, compacted, start, end, columns, timeout))

    async def table_view(self, topic: str, timeout: float | None = None) -> AsyncTableView:
        """The latest message of every key of `topic`, kept current; returns once loaded up
        to the last message that existed when called. As `Client.table_view`."""
        core = await run_blocking(self._pool, lambda: self._core.table_view(topic, timeout),
                                  TableView.close)
        return AsyncTableView(core, self._pool)

    async def subscribe(self, topic: str, subscription_name: str,
                        consumer_type: str = "exclusive",
                        initial_position: str | MessageId | int = "latest",
                        consumer_name: str = "", receiver_queue_size: int = 1000,
                        priority: int = 0, negative_ack_redelivery_delay_ms: int = 1000,
                        on_active_change: Callable[[bool], None] | None = None,
                        read_compacted: bool = False, ack_timeout_ms: int = 0,
                        dead_letter_policy: DeadLetterPolicy | None = None,
                        ack_receipt: bool = False, retry_enable: bool = False
                        ) -> AsyncConsumer:
        """A consumer of a durable subscription; as `Client.subscribe`.
        `on_active_change(is_active)` is called on the loop; with `ack_receipt`,
        `await consumer.acknowledge(msg)` returns once the broker applied it; with
        `retry_enable`, `await consumer.reconsume_later(msg, delay_s)`."""
        if on_active_change is not None and not callable(on_active_change):
            raise errors.InvalidArgument("on_active_change must be callable")
        on_change = (None if on_active_change is None
                     else to_loop(asyncio.get_running_loop(), on_active_change))
        core = await run_blocking(self._pool, lambda: self._core.subscribe(
            topic, subscription_name, consumer_type, initial_position, consumer_name,
            receiver_queue_size, priority, negative_ack_redelivery_delay_ms, on_change,
            read_compacted, ack_timeout_ms, dead_letter_policy, ack_receipt, retry_enable),
            Consumer.close)
        return AsyncConsumer(core, self._pool, self._timeout)

    async def subscribe_many(self, topic: str, subscription_names: list[str],
                             consumer_type: str = "exclusive",
                             initial_position: str | MessageId | int = "latest",
                             consumer_name: str = "", receiver_queue_size: int = 1000,
                             message_listener: AsyncCallback | None = None,
                             read_compacted: bool = False,
                             frame_listener: AsyncFrameCallback | None = None
                             ) -> list[AsyncConsumer]:
        """One consumer per name, on one stream; as `Client.subscribe_many`.
        `message_listener(message, recipients)` is called (a coroutine function: awaited)
        on the loop for each message, once for every consumer that got it (listener.py);
        or `frame_listener(messages, recipients)` once per frame."""
        if message_listener is not None and frame_listener is not None:
            raise errors.InvalidArgument("give message_listener or frame_listener, not both")
        listener = None
        if message_listener is not None:
            check_listener(message_listener)
            listener = LoopListener(asyncio.get_running_loop(), message_listener)
        elif frame_listener is not None:
            check_listener(frame_listener)
            listener = LoopListener(asyncio.get_running_loop(), frame_listener,
                                    per_frame=True)
        try:
            cores = await run_blocking(self._pool, lambda: self._core.subscribe_many(
                topic, subscription_names, consumer_type, initial_position, consumer_name,
                receiver_queue_size, read_compacted=read_compacted,
                frame_listener=None if listener is None else listener.frame), _close_all)
        except BaseException:
            if listener is not None:
                listener.close()
            raise
        faces = [AsyncConsumer(core, self._pool, self._timeout) for core in cores]
        if listener is not None:
            self._listeners.append(listener)
            listener.attach({id(core): face for core, face in zip(cores, faces, strict=True)})
        return faces

    async def close(self) -> None:
        """Close everything this client opened, as `Client.close`; a `receive` or
        `read_next` waiting raises `AlreadyClosed`. Closing twice is a no-op."""
        for listener in self._listeners:
            listener.close()
        try:
            await run_blocking(self._pool, self._core.close)
        except RuntimeError:  # the pool is shut down: closed already
            pass
        self._pool.shutdown(wait=False)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncClient(url={self.url!r})"
