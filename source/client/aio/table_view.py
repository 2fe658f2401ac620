"""The asyncio table view: the core's `TableView` (source/client/table_view.py: the latest
value of every key, kept current by a thread of its own), with its waits awaited and its
listeners called on the loop.

    async with await client.table_view("prices") as prices:
        prices.get("AAPL")                          # local: no wait
        prices.for_each_and_listen(lambda key, msg: print(key, msg and msg.value()))
        await prices.refresh()                      # read your own writes

Reads (`get`, `items`, `keys`, `len`, `in`) look at the view's own dict and never wait.
Listeners are plain callables run on the loop, in the order the view applied the changes.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import Executor

from shadowtopic.client.aio.bridge import run_blocking, to_loop
from shadowtopic.client.message import Message
from shadowtopic.client.table_view import Listener, TableView
from shadowtopic.core import errors


def _checked(action: Listener) -> Listener:
    if not callable(action):
        raise errors.InvalidArgument("a table view listener must be callable")
    return action


class AsyncTableView:
    """Use `AsyncClient.table_view`."""

    def __init__(self, core: TableView, pool: Executor):
        self._core = core
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self.topic = core.topic

    def get(self, key: str | bytes) -> Message | None:
        """The latest message of `key`, or None (never had one, or deleted)."""
        return self._core.get(key)

    def __getitem__(self, key: str | bytes) -> Message:
        return self._core[key]

    def __contains__(self, key: object) -> bool:
        return key in self._core

    def __len__(self) -> int:
        return len(self._core)

    def __iter__(self) -> Iterator[str]:
        return iter(self._core)

    def keys(self) -> list[str]:
        """The keys, a snapshot."""
        return self._core.keys()

    def items(self) -> list[tuple[str, Message]]:
        """(key, latest message) pairs, a snapshot."""
        return self._core.items()

    def for_each(self, action: Listener) -> None:
        """Call `action(key, message)` for every key now."""
        self._core.for_each(action)

    def listen(self, action: Listener) -> None:
        """Call `action(key, message)` on the loop for every change from now on (`message`
        None: the key was deleted)."""
        self._core.listen(to_loop(self._loop, _checked(action)))

    def for_each_and_listen(self, action: Listener) -> None:
        """`for_each` then `listen`, on the loop, with no change missed or seen twice."""
        self._core.for_each_and_listen(to_loop(self._loop, _checked(action)))

    async def refresh(self, timeout: float | None = None) -> None:
        """Wait until the view has applied every message that exists now; as
        `TableView.refresh`."""
        await run_blocking(self._pool, lambda: self._core.refresh(timeout))

    async def close(self) -> None:
        """Stop following. Closing twice is a no-op."""
        await run_blocking(self._pool, self._core.close)

    async def __aenter__(self) -> AsyncTableView:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncTableView(topic={self.topic!r}, keys={len(self._core)})"
