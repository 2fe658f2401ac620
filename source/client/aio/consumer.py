"""The asyncio consumer: the core's `Consumer` (source/client/consumer.py: the subscription's
handles, permits, events, reconnects, ack timeout, dead letters), awaited.

    async with await client.subscribe("orders", "billing", consumer_type="shared") as c:
        async for msg in c:                  # ends once the consumer is closed
            handle(msg)
            await c.acknowledge(msg)

`receive` takes a buffered message on the loop without blocking; when none is there it
waits for the core's wake-up (once per frame, bridge.py; or when a retry letter held for
later is due: retry_letter.py). `await acknowledge(msg)` queues the
acknowledgement at once (grouped, as the sync consumer's). `seek`, `unsubscribe` and `close`
wait for the broker on the client's threads.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor

from shadowtopic.client.aio.bridge import Signal, run_blocking, to_loop
from shadowtopic.client.consumer import Consumer
from shadowtopic.client.message import Message
from shadowtopic.client.options import check_max_messages
from shadowtopic.client.seek import SeekResult
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId


class AsyncConsumer:
    """Use `AsyncClient.subscribe` or `AsyncClient.subscribe_many`."""

    def __init__(self, core: Consumer, pool: Executor, timeout: float):
        self._core = core
        self._pool = pool
        self._timeout = timeout  # the client's: the longest an ack receipt is awaited
        self._signal = Signal(asyncio.get_running_loop())
        self.topic = core.topic
        self.subscription_name = core.subscription_name
        self.consumer_name = core.consumer_name

    @property
    def consumer_type(self) -> str:
        """"exclusive", "shared", "failover" or "key_shared"."""
        return self._core.consumer_type

    @property
    def is_active(self) -> bool | None:
        """As `Consumer.is_active`."""
        return self._core.is_active

    @property
    def last_warning(self) -> errors.ShadowTopicError | None:
        """The last command of this consumer the broker refused without ending it."""
        return self._core.last_warning

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message. `Timeout` when none arrives within `timeout` seconds (None:
        wait for ever), `AlreadyClosed` once the consumer (or its client) is closed, also
        while waiting, and the broker's typed error once it ended the consumer."""
        return await self._signal.next(self._core.poll, timeout)

    async def batch_receive(self, max_messages: int = 100, timeout: float | None = 0.1
                            ) -> list[Message]:
        """Up to `max_messages`: waits at most `timeout` seconds for the first (an empty
        list when none came), then takes what is already there without waiting."""
        check_max_messages(max_messages)
        try:
            out = [await self.receive(timeout)]
        except errors.Timeout:
            return []
        if max_messages > 1:
            try:
                out += self._core.poll_batch(max_messages - 1)
            except errors.ShadowTopicError:
                pass  # (the next receive raises it)
        return out

    @property
    def ack_receipt(self) -> bool:
        """Whether acknowledgements wait for the broker's receipt (`subscribe`'s option)."""
        return self._core.ack_receipt

    async def acknowledge(self, message: Message | MessageId) -> None:
        """Acknowledge one message: queued at once and grouped with others (fire-and-forget);
        with `ack_receipt`, returns once the broker applied it and wrote the subscription's
        cursor, raising its typed refusal (or `Timeout` after the client's timeout)."""
        if not self._core.ack_receipt:
            self._core.acknowledge(message)
            return
        await self._receipt(lambda done: self._core.acknowledge_async(message, done))

    async def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledge every message of the partition up to this one (not on Shared or
        Key_Shared: `NotAllowed`); with `ack_receipt`, as `acknowledge` waits."""
        if not self._core.ack_receipt:
            self._core.acknowledge_cumulative(message)
            return
        await self._receipt(lambda done: self._core.acknowledge_cumulative_async(message, done))

    async def _receipt(self, send: Callable[[Callable[[Exception | None], None]], None]
                       ) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def settle(err: Exception | None) -> None:
            if not future.done():
                if err is None:
                    future.set_result(None)
                else:
                    future.set_exception(err)
        send(to_loop(loop, settle))
        try:
            await asyncio.wait_for(future, self._timeout)
        except TimeoutError:
            raise errors.Timeout("no ack receipt from the broker in time") from None

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Ask for this message again after the nack delay (or, under a dead-letter
        policy past its count, send it to the dead-letter topic)."""
        self._core.negative_acknowledge(message)

    async def reconsume_later(self, message: Message, delay_s: float,
                              properties: dict[str, str] | None = None) -> None:
        """Have `message` come again in `delay_s` seconds through the retry-letter topic;
        returns once its letter is stored and `message` acknowledged. As
        `Consumer.reconsume_later` (source/client/retry_letter.py)."""
        await run_blocking(self._pool, lambda: self._core.reconsume_later(
            message, delay_s, properties))

    def redeliver_unacknowledged_messages(self) -> None:
        """As `Consumer.redeliver_unacknowledged_messages`."""
        self._core.redeliver_unacknowledged_messages()

    async def seek(self, position: MessageId | str | int) -> SeekResult:
        """Reset the subscription's cursor; as `Consumer.seek`."""
        return await run_blocking(self._pool, lambda: self._core.seek(position))

    async def unsubscribe(self) -> None:
        """Delete the subscription and close this consumer; as `Consumer.unsubscribe`."""
        await run_blocking(self._pool, self._core.unsubscribe)

    async def close(self) -> None:
        """Leave the subscription; a `receive` waiting raises `AlreadyClosed`. Closing twice
        is a no-op."""
        await run_blocking(self._pool, self._core.close)

    async def __aiter__(self) -> AsyncIterator[Message]:
        """Every message, waiting for the next; ends once the consumer is closed."""
        while True:
            try:
                yield await self.receive()
            except errors.AlreadyClosed:
                return

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return (f"AsyncConsumer(topic={self.topic!r}, "
                f"subscription={self.subscription_name!r}, type={self.consumer_type!r})")
