"""The asyncio reader: the core's `Reader` (source/client/reader.py: a non-durable reader of
a topic or a shadow, reconnecting by itself), awaited.

    async with await client.create_reader("orders", start="earliest") as reader:
        async for msg in reader:            # until nothing more is there
            print(msg)

`read_next` takes a buffered message on the loop without blocking; when none is there it
waits for the core's wake-up (once per frame, bridge.py). A reader is read by one task at a
time, as the sync reader by one thread.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING

from shadowtopic.client.aio.bridge import Signal, run_blocking
from shadowtopic.client.message import Message
from shadowtopic.client.reader import Reader
from shadowtopic.client.seek import SeekResult
from shadowtopic.core.message_id import MessageId

if TYPE_CHECKING:
    import pyarrow as pa


class AsyncReader:
    """Use `AsyncClient.create_reader`."""

    def __init__(self, core: Reader, pool: Executor, timeout: float):
        self._core = core
        self._pool = pool
        self._timeout = timeout  # the client's: how long `async for` waits for the next
        self._signal = Signal(asyncio.get_running_loop())
        self.topic = core.topic
        self.read_compacted = core.read_compacted

    async def read_next(self, timeout: float | None = None) -> Message:
        """The next message; `Timeout` when none arrives within `timeout` seconds (None:
        no limit), `AlreadyClosed` once the reader (or its client) is closed."""
        return await self._signal.next(self._core.poll, timeout)

    async def read_batch(self, max_messages: int = 1000, timeout: float | None = 0.1,
                         columns: Sequence[str] = ()) -> pa.RecordBatch:
        """Up to `max_messages` messages as one record batch; as `Reader.read_batch`."""
        return await run_blocking(
            self._pool, lambda: self._core.read_batch(max_messages, timeout, columns))

    async def seek(self, position: MessageId | str | int) -> SeekResult:
        """Move the reader; as `Reader.seek`."""
        return await run_blocking(self._pool, lambda: self._core.seek(position))

    async def has_message_available(self) -> bool:
        """Whether a message is buffered or the broker has one past the last read."""
        return await run_blocking(self._pool, self._core.has_message_available)

    async def last_message_ids(self) -> list[MessageId]:
        """The newest id of each partition that holds one; as `Reader.last_message_ids`."""
        return await run_blocking(self._pool, self._core.last_message_ids)

    async def close(self) -> None:
        """Close; a `read_next` waiting raises `AlreadyClosed`. Closing twice is a no-op."""
        await run_blocking(self._pool, self._core.close)

    async def __aiter__(self) -> AsyncIterator[Message]:
        """Every message there is now and while more come, as the sync reader's iteration:
        ends when the broker has nothing past the last one read."""
        while True:
            msg = self._core.poll(None)  # (buffered: no call to the broker)
            if msg is None:
                if not await self.has_message_available():
                    return
                msg = await self.read_next(self._timeout)
            yield msg

    async def __aenter__(self) -> AsyncReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncReader(topic={self.topic!r})"
