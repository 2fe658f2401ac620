"""The asyncio producer: the core's `Producer` (source/client/producer.py: batching, the
stream, receipts, reconnects and idempotent resends), awaited.

    async with await client.create_producer("orders") as producer:
        mid = await producer.send(b"hello", key="k1")          # after the broker's fsync
        futures = [await producer.send_async(b"x%d" % i) for i in range(1000)]
        await producer.flush()                                   # every receipt is in

`send` queues the message into its batch at once (on the loop: no thread hop) and awaits
its receipt. The batch is not sent at once per message: every `send` made in one turn of
the loop shares the batch, which is handed to the sender at the end of that turn (so
`asyncio.gather` of many sends is a few batches, and one lone send is not held back for
`linger_ms`). Receipts come back to the loop a burst at a time (bridge.py). When
`max_inflight` batches already wait, `send` waits for room without blocking the loop.
Cancelling an awaiting `send` does not unsend the message: once queued it is sent.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import Executor

from shadowtopic.client.aio.bridge import Receipts, run_blocking
from shadowtopic.client.producer import Producer
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId


class AsyncProducer:
    """Use `AsyncClient.create_producer`."""

    def __init__(self, core: Producer, pool: Executor):
        self._core = core
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self._receipts = Receipts(self._loop)
        core.settle_batches_with(self._receipts.settle)
        self._flush_due = False
        # sends that found no room wait in line, in the order they came: a send that finds
        # room while others wait joins the line too, so none overtakes an earlier one
        self._room = asyncio.Lock()  # FIFO: its waiters acquire it in order
        self._waiting = 0
        self.topic = core.topic
        self.partitions = core.partitions

    @property
    def producer_name(self) -> str:
        return self._core.producer_name

    async def send_async(self, payload: bytes | str, key: bytes | str | None = None,
                         properties: dict[str, str] | None = None, event_time: int = 0
                         ) -> asyncio.Future[MessageId]:
        """Queue a message and return the Future of its id (set after the broker's fsync,
        or to the typed error), as aiokafka's `send`: `fut = await producer.send_async(..)`
        returns once the message is queued (waiting for room while `max_inflight` batches
        wait: the backpressure), `await fut` once it is stored. Raises `InvalidArgument` /
        `MessageTooBig` for a bad message at once."""
        if self._core.full:
            await self.wait_for_room()
        return self._queue(payload, key, properties, event_time)

    def _queue(self, payload: bytes | str, key: bytes | str | None,
               properties: dict[str, str] | None, event_time: int) -> asyncio.Future[MessageId]:
        future: asyncio.Future[MessageId] = self._loop.create_future()
        self._core.queue_message(payload, key, properties, event_time, future)
        if not self._flush_due:  # hand this turn's batch over at the end of the turn
            self._flush_due = True
            self._loop.call_soon(self._flush_turn)
        return future

    def _flush_turn(self) -> None:
        self._flush_due = False
        self._core.flush_nowait()

    async def wait_for_room(self) -> None:
        """Return once a message can be queued without blocking (`max_inflight`)."""
        while self._core.full:
            await run_blocking(self._pool, lambda: self._core.wait_for_room(1.0))

    async def send(self, payload: bytes | str, key: bytes | str | None = None,
                   properties: dict[str, str] | None = None, event_time: int = 0,
                   timeout: float | None = None) -> MessageId:
        """Send and await the receipt: by default up to the client's `timeout` plus its
        `operation_timeout` (the time a reconnect and resend may take); `Timeout` then."""
        if self._core.full or self._waiting:
            self._waiting += 1  # before the first await: later sends see it and line up
            try:
                async with self._room:
                    await self.wait_for_room()
                    future = self._queue(payload, key, properties, event_time)
            finally:
                self._waiting -= 1
        else:
            future = self._queue(payload, key, properties, event_time)
        try:
            return await asyncio.wait_for(future, timeout or self._core.receipt_wait_s)
        except TimeoutError:
            raise errors.Timeout("no receipt from the broker in time") from None

    async def flush(self, timeout: float | None = None) -> None:
        """Send every open batch and await every receipt (by default as long as `send`)."""
        await run_blocking(self._pool, lambda: self._core.flush(timeout))

    def stats(self) -> dict[str, int]:
        """As `Producer.stats`: sent, acked, failed, pending_batches."""
        return self._core.stats()

    async def close(self) -> None:
        """Flush, then close. Closing twice is a no-op."""
        await run_blocking(self._pool, self._core.close)

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncProducer(topic={self.topic!r})"
