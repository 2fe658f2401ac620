"""The read engine: the non-durable readers of every topic a broker serves, beside the
transport (the Consumer service only adapts the wire to it).

A reader is a plain state object (handle, outbox, position, permits): no task, thread,
timer or poll loop of its own. The readers of one topic live in one `TopicReaders`, grouped
by position. Any change of the topic (entries became readable, ledgers were trimmed, a
flow, an outbox drained, a seek) wakes the topic's one dispatch task, which reads the
entries at each group's position once and hands them to every ready reader of the group:
one frame per outbox, carrying the entries once with all its handles. The group then moves
on together. A reader whose outbox is full is skipped (its memory is bounded by the outbox)
and the outbox wakes the topic when it drains, so a slow client never holds up the others.

When the view closes (the broker closed, lost or reloaded the topic), the readers follow:
the engine resolves the topic again and moves them, at their positions, to the new view,
or reports the error on each of their handles.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, Self, TypeVar

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.view import LedgerView, ReadEntry, Trimmed
from shadowtopic.read.encodings import Encodings, EncodingsPool
from shadowtopic.read.positions import Start, resolve

log = logging.getLogger(__name__)
MAX_FRAME_ENTRIES = 500
MAX_FRAME_BYTES = 2 << 20
#: a read's frames are sent once they add up to this much, and the members after that are
#: asked again whether they take more (each outbox copies the read into a frame of its own:
#: one 2 MiB read for 300 readers that do not read was 600 MiB past the client-memory cap)
FLUSH_BYTES = 16 << 20


class Outbox(Protocol):
    """One client stream as the engine sees it."""

    def has_room(self) -> bool:
        """False while the stream's buffer is full (its readers are skipped)."""

    def call_when_room(self, callback: Callable[[], None]) -> None:
        """Call `callback` once, when the buffer has room again."""

    def send_entries(self, handles: list[int], encoded: list[bytes], size: int) -> None:
        """Queue one frame: `encoded` entries (EncodedEntry bytes) for every handle."""

    def send_error(self, handle: int, error: errors.ShadowTopicError) -> None:
        """Queue an error event for `handle`; the engine has dropped that reader."""


class Counters(Protocol):
    def add_out(self, msgs: int, size: int) -> None: ...


class Frames:
    """What one read sends: per outbox, the handles that take every entry read (one frame
    for all of them), and frames of their own for handles that take only some entries
    (a durable subscription skipping acknowledged ones, splitting among consumers)."""

    __slots__ = ("whole", "parts", "part_bytes")

    def __init__(self) -> None:
        self.whole: dict[Outbox, list[int]] = {}
        self.parts: list[tuple[Outbox, int, list[bytes], int]] = []
        self.part_bytes = 0

    def all(self, outbox: Outbox, handle: int) -> None:
        self.whole.setdefault(outbox, []).append(handle)

    def some(self, outbox: Outbox, handle: int, encoded: list[bytes], size: int) -> None:
        self.parts.append((outbox, handle, encoded, size))
        self.part_bytes += size

    def queued_bytes(self, size: int) -> int:
        """About what `send` will queue, for a read of `size` bytes."""
        return len(self.whole) * size + self.part_bytes

    def send(self, encoded: list[bytes], size: int) -> None:
        for outbox, handles in self.whole.items():
            outbox.send_entries(handles, encoded, size)
        for outbox, handle, some, some_size in self.parts:
            outbox.send_entries([handle], some, some_size)


class Member(Protocol):
    """What a dispatch group holds: a reader, or a durable subscription with consumers.
    `position` is the next entry it has not been sent; the group moves it past each read.
    `topic` is the group it is in (set by `TopicReaders.add`, None once it left)."""

    position: MessageId
    topic: TopicReaders[Self] | None

    def wanted(self, wake: Callable[[], None]) -> int:
        """How many entries it can take now (0: skip it; it calls `wake` once it can)."""

    def deliver(self, entries: list[ReadEntry], encoded: list[bytes], size: int,
                frames: Frames) -> int:
        """Take every entry of a read at `position` (queue frames into `frames`); returns
        how many messages went out (for the topic's counters)."""


#: the member type of a `TopicReaders`: `Reader` (the read engine's), or `Subscription`
#: (the subscription engine's, source/subscriptions/subscription.py)
M = TypeVar("M", bound=Member)


class Reader:
    """A non-durable reader: one handle of a client stream, with its permits."""

    __slots__ = ("handle", "outbox", "position", "permits", "topic", "closed")

    def __init__(self, handle: int, outbox: Outbox, position: MessageId):
        self.handle = handle
        self.outbox = outbox
        self.position = position
        self.permits = 0
        self.topic: TopicReaders[Reader] | None = None  # None while closed or following a reload
        self.closed = False

    def wanted(self, wake: Callable[[], None]) -> int:
        if self.permits <= 0:
            return 0
        if not self.outbox.has_room():
            self.outbox.call_when_room(wake)
            return 0
        return self.permits

    def deliver(self, entries: list[ReadEntry], encoded: list[bytes], size: int,
                frames: Frames) -> int:
        frames.all(self.outbox, self.handle)
        self.permits -= len(entries)
        return len(entries)


class Replayer(Protocol):
    async def replay(self) -> bool:
        """Send what waits for redelivery (it is not at the member's position); True when
        something went out or is left to do."""


class Owner(Protocol[M]):
    """Who holds a `TopicReaders` of members `M`: the read engine (of `Reader`s), or the
    subscription engine (of `Subscription`s)."""

    def rehome(self, tr: TopicReaders[M]) -> None:
        """`tr`'s view closed."""

    def fail(self, member: M, error: errors.ShadowTopicError) -> None:
        """Reading at `member`'s position failed: it stops."""

    def counters(self, topic: TopicName) -> Counters: ...


class TopicReaders(Generic[M]):
    """Every member of one topic (readers, or durable subscriptions), grouped by position,
    and the topic's dispatch task (a `ViewListener`)."""

    def __init__(self, owner: Owner[M], topic: TopicName, view: LedgerView,
                 encodings: EncodingsPool | None = None):
        self.owner = owner
        self.topic = topic
        self.view = view
        self.compacted = False  # reads the topic's compacted view (read_compacted readers)
        self.groups: dict[MessageId, set[M]] = {}
        self.replays: set[Replayer] = set()   # members with entries waiting for redelivery
        self.count = 0
        #: bumped by members when something other than this dispatch may have lowered
        #: what one of them wants (a consumer left, a rewind): a read that crossed no
        #: change delivers without asking every member again
        self.changes = 0
        #: the broker's encoded entries (source/read/encodings.py): the ones of this view's
        #: ledgers, held from the first read until no member is left or the view closed
        self._pool = encodings if encodings is not None else EncodingsPool()
        self._encodings: Encodings | None = None
        self._dirty = False
        self._task: asyncio.Task[None] | None = None
        view.add_listener(self)

    # ---- ViewListener ----------------------------------------------------------------------

    def on_entries(self) -> None:
        self.wake()

    def on_trimmed(self, trimmed: Trimmed) -> None:
        self.wake()  # groups inside deleted ledgers move on at their next dispatch

    def on_closed(self, reason: errors.ShadowTopicError) -> None:
        self.drop_encodings()
        self.owner.rehome(self)

    # ---- readers ---------------------------------------------------------------------------

    def add(self, reader: M) -> None:
        reader.topic = self
        self.groups.setdefault(reader.position, set()).add(reader)
        self.count += 1
        self.wake()

    def remove(self, reader: M) -> None:
        group = self.groups.get(reader.position)
        if group is not None and reader in group:
            group.discard(reader)
            if not group:
                del self.groups[reader.position]
            self.count -= 1
        reader.topic = None

    def move(self, reader: M, position: MessageId) -> None:
        group = self.groups.get(reader.position)
        if group is not None:
            group.discard(reader)
            if not group:
                del self.groups[reader.position]
        reader.position = position
        self.groups.setdefault(position, set()).add(reader)

    def _move_all(self, pos: MessageId, moved: list[M], after: MessageId) -> None:
        """`move` of many members of the group at `pos`; the whole group at once when all of
        them go (a broadcast: 100,000 subscriptions move by one dict operation)."""
        group = self.groups.get(pos)
        if group is None or len(moved) != len(group):
            for m in moved:
                self.move(m, after)
            return
        del self.groups[pos]
        dest = self.groups.get(after)
        if dest is None:
            self.groups[after] = group
        elif len(dest) < len(group):
            group |= dest
            self.groups[after] = group
        else:
            dest |= group
        for m in moved:
            m.position = after

    def readers(self) -> list[M]:
        return [r for group in self.groups.values() for r in group]

    # ---- dispatch --------------------------------------------------------------------------

    def encoded(self, entries: list[ReadEntry]) -> list[bytes]:
        """The entries as EncodedEntry bytes, shared with every group of the broker that
        reads the same ledgers (members at nearby positions read the same entries; so do
        the shadows of one source)."""
        if self._encodings is None:
            self._encodings = self._pool.acquire(self.view)
        return self._encodings.encode(entries)

    def drop_encodings(self) -> None:
        """Stop using the shared encodings (the view closed, or no member is left)."""
        if self._encodings is not None:
            self._pool.release(self._encodings)
            self._encodings = None

    def wake(self) -> None:
        self._dirty = True
        if self._task is None and self.view.closed is None:
            self._task = asyncio.get_running_loop().create_task(self._dispatch())

    async def _dispatch(self) -> None:
        try:
            while self._dirty and self.view.closed is None:
                self._dirty = False
                for replayer in list(self.replays):
                    if replayer in self.replays and self.view.closed is None:
                        if await replayer.replay():
                            self._dirty = True
                        await asyncio.sleep(0)
                for pos in list(self.groups):
                    if pos in self.groups and self.view.closed is None:
                        await self._serve(pos)
        except Exception:  # noqa: BLE001 - a bug here must not stop the loop for good
            log.exception("%s: dispatch failed", self.topic)
        finally:
            self._task = None

    async def _serve(self, pos: MessageId) -> None:
        valid = self.view.valid_position(pos)
        if valid != pos:  # end of a ledger, or a deleted ledger: the group moves on
            for r in list(self.groups[pos]):
                self.move(r, valid)
            pos = valid
        if pos >= self.view.next_position():
            return  # at the tail: nothing to read (no walk over a group of idle members)
        ready: list[M] = []
        want = MAX_FRAME_ENTRIES
        wake = self.wake
        for m in self.groups[pos]:
            n = m.wanted(wake)
            if n > 0:
                ready.append(m)
                if n < want:
                    want = n
        if not ready:
            return
        changes = self.changes
        try:
            entries = await self.view.read(pos, want, MAX_FRAME_BYTES)
        except Exception as exc:  # noqa: BLE001 - this group's members hear why; others go on
            if self.view.closed is None:  # a broken ledger (checksum, data loss, I/O error)
                error = errors.typed(exc, f"{self.topic}: read at {pos}")
                for m in list(self.groups.get(pos, ())):
                    self.owner.fail(m, error)
            return
        if not entries:
            return
        encoded = self.encoded(entries)
        size = sum(len(e.raw) for e in entries)
        last = entries[-1]
        after = MessageId(last.ledger_id, last.entry_id + 1)
        frames = Frames()
        delivered = 0
        recheck = changes != self.changes
        flushed = False
        moved: list[M] = []
        for m in ready:
            if m.topic is not self or m.position != pos:
                continue  # closed or seeked while the read ran
            if (flushed or recheck and type(m) is not Reader) and \
                    m.wanted(self.wake) < len(entries):
                continue  # its consumers changed while the read ran, or the frames sent
                # so far filled its outbox or the broker's memory: it reads again later
                # (a reader's permits only grow meanwhile: no second look at it otherwise)
            delivered += m.deliver(entries, encoded, size, frames)
            moved.append(m)
            if frames.queued_bytes(size) >= FLUSH_BYTES:
                frames.send(encoded, size)
                frames, flushed = Frames(), True
        self._move_all(pos, moved, after)
        frames.send(encoded, size)
        if delivered:
            self.owner.counters(self.topic).add_out(delivered, size * delivered // len(entries))
        self._dirty = True
        await asyncio.sleep(0)  # let commands and other topics in between frames


class ReadEngine:
    """All readers of a broker, by topic. `resolve` gives a topic's current view (loading
    it when needed); `counters` the topic's delivery counters."""

    def __init__(self, resolve: Callable[[TopicName], Awaitable[LedgerView]],
                 counters: Callable[[TopicName], Counters],
                 resolve_compacted: Callable[[TopicName], Awaitable[LedgerView]] | None = None,
                 encodings: EncodingsPool | None = None):
        self._resolve = resolve
        self.encodings = encodings if encodings is not None else EncodingsPool()
        self._resolve_compacted = resolve_compacted
        self._counters = counters
        #: (topic, read_compacted) -> its readers: compacted readers read another view
        self._topics: dict[tuple[TopicName, bool], TopicReaders[Reader]] = {}
        self._rehoming: set[asyncio.Task[None]] = set()

    def counters(self, topic: TopicName) -> Counters:
        return self._counters(topic)

    def _resolver(self, compacted: bool) -> Callable[[TopicName], Awaitable[LedgerView]]:
        if not compacted:
            return self._resolve
        if self._resolve_compacted is None:
            raise errors.Unimplemented("this broker does not serve compacted reads")
        return self._resolve_compacted

    def _readers_of(self, topic: TopicName, view: LedgerView, compacted: bool
                    ) -> TopicReaders[Reader]:
        tr = self._topics.get((topic, compacted))
        if tr is None or tr.view is not view:
            if tr is not None:
                self.rehome(tr)
            tr = self._topics[(topic, compacted)] = TopicReaders(self, topic, view,
                                                                 self.encodings)
            tr.compacted = compacted
        return tr

    async def open(self, outbox: Outbox, handle: int, topic: TopicName, start: Start,
                   compacted: bool = False) -> tuple[Reader, MessageId | None]:
        """A new reader at `start` (of the compacted view with `compacted`); returns it and
        the last message id it can read."""
        for _attempt in range(3):
            view = await self._resolver(compacted)(topic)
            position = await resolve(view, start)
            if view.closed is None:  # it may have closed while the position resolved
                break
        else:
            raise errors.TopicNotOwned(f"{topic} keeps reloading; try again")
        reader = Reader(handle, outbox, position)
        self._readers_of(topic, view, compacted).add(reader)
        return reader, view.last_confirmed()

    def flow(self, reader: Reader, permits: int) -> None:
        reader.permits += permits
        if reader.topic is not None:
            reader.topic.wake()

    async def seek(self, reader: Reader, start: Start) -> MessageId:
        """Move `reader` to `start`; entries read for the old position are not sent."""
        tr = reader.topic
        if tr is None:
            if reader.closed:
                raise errors.AlreadyClosed("reader is closed")
            raise errors.TopicNotOwned("the topic is being reloaded; seek again")
        position = await resolve(tr.view, start)
        if reader.closed:
            raise errors.AlreadyClosed("reader is closed")
        now = reader.topic
        if now is None:  # it is following a reload meanwhile: it resumes at this position
            reader.position = position
        else:
            now.move(reader, position if now is tr else now.view.valid_position(position))
            now.wake()
        return position

    def close(self, reader: Reader) -> None:
        reader.closed = True
        tr = reader.topic
        if tr is not None:
            tr.remove(reader)
            if not tr.count:
                tr.view.remove_listener(tr)
                tr.drop_encodings()
                if self._topics.get((tr.topic, tr.compacted)) is tr:
                    del self._topics[(tr.topic, tr.compacted)]

    def fail(self, reader: Reader, error: errors.ShadowTopicError) -> None:
        self.close(reader)
        reader.outbox.send_error(reader.handle, error)

    def rehome(self, tr: TopicReaders[Reader]) -> None:
        """`tr`'s view closed: move its readers to the topic's next view."""
        tr.view.remove_listener(tr)
        tr.drop_encodings()
        if self._topics.get((tr.topic, tr.compacted)) is tr:
            del self._topics[(tr.topic, tr.compacted)]
        readers = tr.readers()
        for r in readers:
            tr.remove(r)
        if not readers:
            return

        async def follow() -> None:
            try:
                view = await self._resolver(tr.compacted)(tr.topic)
            except BaseException as exc:  # noqa: BLE001 - every reader hears why it stops
                error = errors.typed(exc, f"{tr.topic}: reload")
                for r in readers:
                    if not r.closed:
                        r.closed = True
                        r.outbox.send_error(r.handle, error)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return
            new = self._readers_of(tr.topic, view, tr.compacted)
            for r in readers:
                if not r.closed:
                    new.add(r)  # at its position (a seek meanwhile has set it)

        task = asyncio.get_running_loop().create_task(follow())
        self._rehoming.add(task)
        task.add_done_callback(self._rehoming.discard)
