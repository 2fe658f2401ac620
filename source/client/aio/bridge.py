"""Where the client's core meets an asyncio loop. The asyncio face (`AsyncClient` and its
producers, consumers, readers, table views and admin) is this module plus thin classes over
the core's objects: the same protocol code, options, errors, lookups, redirects, reconnects
and resends as the sync `Client`, written once.

The core (source/client/*.py) runs gRPC on threads of its own: a stream's receive thread
hands each frame to its consumers and readers; a producer's receipt thread resolves a
batch. The asyncio face adds no thread per message; what crosses to the loop crosses a frame
or a receipt at a time:

- **Waiting for a message** (`Signal`): the face polls the core without blocking
  (`Consumer.poll`, `Reader.poll`). When nothing is there it leaves a waker, which the core
  calls once, on its own thread, when a frame (or the end) came: one `call_soon_threadsafe`
  per frame at most, none while messages are buffered. Cancelling a waiting task loses
  nothing: a message is taken from the core only by a poll on the loop.
- **Receipts** (`Receipts`): a batch's receipt crosses to the loop whole (the producer hands
  it over instead of calling a callback per message), in one `call_soon_threadsafe` per
  burst of receipts, and each message's Future is resolved there.
- **Calls that wait for the broker but are not per message** (opening, seek, unsubscribe,
  close, flush, admin, a table view's first load): `run_blocking` runs the core's sync call
  on the client's pool of threads. Cancelling the awaiting task returns at once; the call
  itself ends within its own timeout, and what it opened meanwhile is closed (`cleanup`).
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from functools import partial
from typing import TypeVar, cast

from shadowtopic.client.message import Message
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId

T = TypeVar("T")
#: a core object's non-blocking take: the next message, or None after leaving `wake`
Poll = Callable[[Callable[[], None] | None], Message | None]
POOL_THREADS = 16  # an AsyncClient's threads for blocking calls (not per message)


def _set(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Signal:
    """One consumer's or reader's "something came" for the loop: at most one waker is left
    with the core at a time, and every task waiting shares its Future."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._armed: asyncio.Future[None] | None = None  # its waker is with the core

    def _fire(self, future: asyncio.Future[None]) -> None:
        """The waker (on the core's thread)."""
        try:
            self._loop.call_soon_threadsafe(_set, future)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    async def next(self, poll: Poll, timeout: float | None) -> Message:
        """The next message `poll` gives, waiting at most `timeout` seconds (None: no
        limit): `errors.Timeout` then; raises what `poll` raises."""
        deadline = None if timeout is None else self._loop.time() + max(0.0, timeout)
        while True:
            msg = poll(None)
            if msg is not None:
                return msg
            armed = self._armed
            if armed is None or armed.done():
                armed = self._loop.create_future()
                msg = poll(partial(self._fire, armed))
                if msg is not None:  # (the core left no waker: it had a message)
                    return msg
                self._armed = armed
            left = None if deadline is None else deadline - self._loop.time()
            if left is not None and left <= 0:
                raise errors.Timeout("no message received in time")
            try:
                await asyncio.wait_for(asyncio.shield(armed), left)
            except TimeoutError:
                raise errors.Timeout("no message received in time") from None


class Receipts:
    """A producer's receipts, crossing from its receipt thread to the loop a burst at a
    time: `settle` is the core's batch sink (`Producer.settle_batches_with`), its tokens
    the messages' Futures, resolved on the loop with their ids or the error."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._done: deque[tuple[list[object], int, int, int, Exception | None]] = deque()
        self._scheduled = False

    def settle(self, tokens: list[object], ledger_id: int, first_entry: int, partition: int,
               error: Exception | None) -> None:
        """On the receipt thread: queue a batch's outcome; the first of a burst schedules
        a drain (appended before the flag is read, and the drain clears the flag before it
        takes: nothing is left behind)."""
        self._done.append((tokens, ledger_id, first_entry, partition, error))
        if not self._scheduled:
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def _drain(self) -> None:
        self._scheduled = False
        done = self._done
        new = tuple.__new__
        while done:
            tokens, lid, entry, part, err = done.popleft()
            futures = cast(list[asyncio.Future[MessageId]], tokens)
            if err is not None:
                for future in futures:
                    if not future.done():  # (else cancelled by its task)
                        future.set_exception(err)
                continue
            step = 1 if lid else 0  # (0:0 for all: a duplicate the broker no longer places)
            for future in futures:
                if not future.done():
                    future.set_result(new(MessageId, (lid, entry, part)))
                entry += step


async def run_blocking(pool: Executor, call: Callable[[], T],
                       cleanup: Callable[[T], object] | None = None) -> T:
    """`call()` on `pool`, awaited. Cancelled, this returns at once; `call` goes on to its
    end (within its own timeout) and `cleanup(result)` then runs on the pool (closing what
    it opened)."""
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(pool, call)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if cleanup is not None:
            def done(f: asyncio.Future[T]) -> None:
                if not f.cancelled() and f.exception() is None:
                    try:
                        loop.run_in_executor(pool, cleanup, f.result())
                    except RuntimeError:  # the pool (client) is shut down: run it here
                        threading.Thread(target=cleanup, args=(f.result(),),
                                         daemon=True).start()
            future.add_done_callback(done)
        raise


def to_loop(loop: asyncio.AbstractEventLoop, call: Callable[..., object]
            ) -> Callable[..., None]:
    """A callback for the core's threads that runs `call(*args)` on `loop` instead."""
    def schedule(*args: object) -> None:
        try:
            loop.call_soon_threadsafe(call, *args)
        except RuntimeError:  # the loop is closed: nobody listens any more
            pass
    return schedule
