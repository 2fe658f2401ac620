"""A `subscribe_many` listener on the loop (`AsyncClient.subscribe_many`).

The core's listener thread (source/client/listener.py) decodes each frame once and hands
the frame to `LoopListener.frame`, which crosses to the loop once per frame; there the
user's `listener(message, recipients)` is called for each message, `recipients` listing the
`AsyncConsumer`s that got it (`recipients.acknowledge(message)` acks it for all of them in
one command), or, with `per_frame` (a `frame_listener`), `listener(messages, recipients)`
once for the whole frame. A plain function is called in place; a coroutine function is
awaited, one call after another, by a task of the listener's own. At most `MAX_FRAMES`
frames wait on the loop: past that the core's listener thread waits, so a slow listener
holds back this call's consumers (through their permits) and never pins memory.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable

from shadowtopic.client.listener import Recipients
from shadowtopic.client.message import Message

log = logging.getLogger(__name__)

MAX_FRAMES = 16
#: what the user gives: called (or awaited) per message
AsyncCallback = Callable[[Message, Recipients], "Awaitable[None] | None"]
#: a frame listener's: called (or awaited) once per frame with all its messages
AsyncFrameCallback = Callable[[list[Message], Recipients], "Awaitable[None] | None"]


def _first_id(args: Message | list[Message]) -> object:
    """The message a failed call was about (a frame's first: frames are never empty)."""
    return (args[0] if isinstance(args, list) else args).message_id


class LoopListener:
    def __init__(self, loop: asyncio.AbstractEventLoop,
                 callback: AsyncCallback | AsyncFrameCallback, per_frame: bool = False):
        self._loop = loop
        self._callback = callback
        self._per_frame = per_frame
        self._awaited = inspect.iscoroutinefunction(callback)
        self._room = threading.Semaphore(MAX_FRAMES)
        self._closed = False
        self._faces: dict[int, object] | None = None  # id(core consumer) -> its face
        self._early: list[tuple[list[Message], Recipients]] = []  # before `attach`
        self._frames: deque[tuple[list[Message], Recipients]] = deque()
        self._more = asyncio.Event()
        self._task: asyncio.Task[None] | None = (
            loop.create_task(self._run()) if self._awaited else None)

    # ---- the core's listener thread ---------------------------------------------------------

    def frame(self, msgs: list[Message], recipients: Recipients) -> None:
        while not self._room.acquire(timeout=0.5):
            if self._closed:
                return
        try:
            self._loop.call_soon_threadsafe(self._arrive, msgs, recipients)
        except RuntimeError:  # the loop is closed
            self._closed = True

    # ---- the loop ---------------------------------------------------------------------------

    def attach(self, faces: dict[int, object]) -> None:
        """The call's consumers are made: `faces` maps each core consumer (by id) to the
        object listeners see; frames that came before go now."""
        self._faces = faces
        early, self._early = self._early, []
        for msgs, recipients in early:
            self._arrive(msgs, recipients)

    def _arrive(self, msgs: list[Message], recipients: Recipients) -> None:
        if self._closed:
            self._room.release()
            return
        if self._faces is None:
            self._early.append((msgs, recipients))
            return
        faces = self._faces
        mine = recipients.relabel([faces.get(id(c), c) for c in recipients])
        if self._awaited:
            self._frames.append((msgs, mine))
            self._more.set()
            return
        try:
            for args in self._calls(msgs):
                try:
                    self._callback(args, mine)  # type: ignore[arg-type]
                except Exception:  # noqa: BLE001 - a user callback must not stop the others
                    log.exception("listener failed on %s", _first_id(args))
        finally:
            self._room.release()

    def _calls(self, msgs: list[Message]) -> list[Message] | list[list[Message]]:
        """What the user's callback is called with, one call each: the frame's messages,
        or the frame once (`per_frame`)."""
        return [msgs] if self._per_frame else msgs

    async def _run(self) -> None:
        while not self._closed:
            await self._more.wait()
            self._more.clear()
            while self._frames:
                msgs, mine = self._frames.popleft()
                try:
                    for args in self._calls(msgs):
                        try:
                            await self._callback(args, mine)  # type: ignore[arg-type,misc]
                        except Exception:  # noqa: BLE001 - must not stop the others
                            log.exception("listener failed on %s", _first_id(args))
                finally:
                    self._room.release()

    def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
