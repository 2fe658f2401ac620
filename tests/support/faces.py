"""Both faces of the client behind one blocking API, so one test body drives `Client` and
`AsyncClient` alike (the `face` fixtures of the client suites).

`blocking_async_client(url)` starts an asyncio loop on a thread of its own and wraps an
`AsyncClient` made there in `Blocking`: a coroutine method is run on that loop and awaited
by the test's thread; a plain method is called on the loop's thread too (the asyncio face
expects its loop's thread); `with` maps to `async with`, iteration to `async for`; what a
call returns that belongs to the asyncio face (a producer, consumer, reader, table view, a
list of consumers) comes back wrapped in turn. Messages, ids and errors pass as they are:
they are the same types in both faces, which is the point.
"""
from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from shadowtopic.client.aio import (
    AsyncAdmin,
    AsyncClient,
    AsyncConsumer,
    AsyncProducer,
    AsyncReader,
    AsyncTableView,
)

_FACES = (AsyncAdmin, AsyncClient, AsyncConsumer, AsyncProducer, AsyncReader, AsyncTableView)
CALL_TIMEOUT_S = 120.0  # no test waits longer for one call


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="test-face-loop")
        self._thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(CALL_TIMEOUT_S)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        out: Future[Any] = Future()

        def go() -> None:
            try:
                out.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                out.set_exception(exc)
        self.loop.call_soon_threadsafe(go)
        return out.result(CALL_TIMEOUT_S)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def _wrap(value: Any, lt: LoopThread) -> Any:
    if isinstance(value, _FACES):
        return Blocking(value, lt)
    if isinstance(value, list) and value and isinstance(value[0], _FACES):
        return [Blocking(v, lt) for v in value]
    return value


class Blocking:
    def __init__(self, obj: Any, lt: LoopThread):
        self._obj = obj
        self._lt = lt

    @property
    def face(self) -> Any:
        """The asyncio object itself."""
        return self._obj

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._obj, name)
        lt = self._lt
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **k: _wrap(lt.run(attr(*a, **k)), lt)
        if callable(attr) and not isinstance(attr, type):
            return lambda *a, **k: _wrap(lt.call(attr, *a, **k), lt)
        return _wrap(attr, lt)

    def __enter__(self) -> Blocking:
        self._lt.run(self._obj.__aenter__())
        return self

    def __exit__(self, *exc: object) -> None:
        self._lt.run(self._obj.__aexit__(*exc))

    def __iter__(self) -> Iterator[Any]:
        it = self._obj.__aiter__()
        while True:
            try:
                yield self._lt.run(it.__anext__())
            except StopAsyncIteration:
                return

    def __len__(self) -> int:
        return len(self._obj)

    def __contains__(self, key: object) -> bool:
        return key in self._obj

    def __getitem__(self, key: Any) -> Any:
        return self._obj[key]

    def __repr__(self) -> str:
        return f"Blocking({self._obj!r})"


class BlockingAsyncClient(Blocking):
    """An `AsyncClient` on a loop of its own; `close` also stops the loop."""

    def __init__(self, url: str, **options: Any):
        lt = LoopThread()

        async def make() -> AsyncClient:
            return AsyncClient(url, **options)
        super().__init__(lt.run(make()), lt)

    def close(self) -> None:
        try:
            self._lt.run(self._obj.close())
        finally:
            self._lt.stop()

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_client(face: str, url: str, **options: Any) -> Any:
    """A `Client` ("sync") or a blocking-wrapped `AsyncClient` ("async")."""
    if face == "sync":
        from shadowtopic.client import Client
        return Client(url, **options)
    return BlockingAsyncClient(url, **options)
