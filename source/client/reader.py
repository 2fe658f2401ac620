"""Sync reader: a non-durable cursor over a topic (all partitions of a partitioned topic).

All readers and consumers of one Client share one Consumer.Connect stream
(`stream.Multiplexer`); each partition gets a handle. The broker sends entries as flow
permits allow (`receiver_queue_size`, topped up when half is consumed); `read_next` decodes
them one at a time. `has_message_available` compares what was read with the broker's last
message id, so a read loop ends at the end of the topic
(`while r.has_message_available(): r.read_next()`).

`seek` moves a reader (by MessageId or publish time) and waits for the broker's `seek_done`.
After any `seek_done` the broker has set the handle's permits to 0: the reader drops what it
had received for that partition before the event and sends a fresh Flow.

A partition whose stream breaks, or that the broker ends with a retriable error
(`TopicNotOwned`, `Fenced`), reconnects by itself (source/client/reconnect.py has the
design): `read_next` notices it in queue order, so every frame of the old handle is in the
buffer by then, and the client's `Reconnector` subscribes the partition again where its
topic is served now, from the id after the last message that reached the queue
(exclusive). The buffer is kept: nothing is lost or read twice. `read_next` keeps waiting
within its timeout meanwhile, and raises the last retriable error once reconnecting failed
for longer than the client's operation timeout.

Closing is deterministic: `Reader.close` wakes a `read_next` blocked in another thread (it
raises `AlreadyClosed`), and `Multiplexer.close` returns only once the stream's receive thread
has ended and gRPC has finished the call (see there why that matters at interpreter exit).
"""
from __future__ import annotations

import enum
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Final, NamedTuple, TypeVar

from shadowtopic.client.admin import Admin, position_pb
from shadowtopic.client.connection import Connection
from shadowtopic.client.message import Message
from shadowtopic.client.reconnect import Owner, Reconnector, reconnectable
from shadowtopic.client.stream import Delivery, Multiplexer, QueueSink
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.pb.v1 import common_pb2, consumer_pb2


class _Closed(enum.Enum):
    CLOSED = 0


#: what Reader.close puts on its own queue, to wake a blocked read_next
_CLOSED: Final = _Closed.CLOSED


_SeekAnswer = tuple[MessageId, bool] | Exception


class SeekResult(NamedTuple):
    """Where a `seek` of a reader or a consumer landed, and whether the position asked for
    was clamped to the topic's first or last message."""

    message_id: MessageId
    clamped: bool


class _GaveUp:
    """What `Reader._give_up` puts on the reader's queue: reconnecting failed for good."""

    def __init__(self, err: errors.ShadowTopicError):
        self.err = err


def start_position(start: str | MessageId) -> common_pb2.StartPosition:
    if isinstance(start, MessageId):
        return common_pb2.StartPosition(message_id=start.to_pb())
    if start == "earliest":
        return common_pb2.StartPosition(earliest=True)
    if start == "latest":
        return common_pb2.StartPosition(latest=True)
    return common_pb2.StartPosition(message_id=MessageId.parse(start).to_pb())


P = TypeVar("P")  # a reader's or a consumer's partition


def seek_targets(position: MessageId | str | int, by_index: dict[int, P]) -> tuple[
        common_pb2.StartPosition, list[P]]:
    """What a seek sends and to which partitions (`by_index`: partition index -> partition
    of a reader or consumer). A publish time (int ms), "earliest" or "latest" seeks every
    partition; a MessageId ("L:E" text too) with a partition seeks that partition, one
    without seeks every partition (as Pulsar does). `InvalidArgument` for junk."""
    pos = position_pb(position, "seek position")
    mid = None
    if isinstance(position, MessageId):
        mid = position
    elif isinstance(position, str) and pos.HasField("message_id"):
        mid = MessageId.parse(position)
    parts = list(by_index.values())
    if mid is not None and mid.partition >= 0:
        target = by_index.get(mid.partition)
        if target is None:
            if len(parts) == 1 and next(iter(by_index)) < 0:
                target = parts[0]  # a non-partitioned topic: the partition says nothing
            else:
                raise errors.InvalidArgument(f"message id {mid}: partition {mid.partition} "
                                             f"is not one of this topic's")
        parts = [target]
    return pos, parts


class _Partition:
    def __init__(self, topic: str, index: int, handle: int, mux: Multiplexer):
        self.topic = topic
        self.index = index
        self.handle = handle
        self.mux = mux                            # the stream the handle is on
        self.state = "open"                       # <-> reconnecting
        self.consumed = 0
        self.last: MessageId | None = None      # id of the last message returned to the user
        self.received: MessageId | None = None  # id of the last message put in the buffer
        self.threshold: MessageId | None = None  # an entry beyond this is unread
        self.inclusive = False

    def resume_at(self, start: str | MessageId) -> tuple[common_pb2.StartPosition, bool]:
        """Where a reconnect subscribes again, and whether inclusively: after the last
        message received, else where the reader was told to start or seek to."""
        if self.received is not None:
            return start_position(MessageId(*self.received[:2])), False
        if self.threshold is not None:
            return start_position(self.threshold), self.inclusive
        # nothing came, no position: "earliest", or "latest" of a topic that was empty
        return common_pb2.StartPosition(earliest=True), False


class Reader:
    def __init__(self, conn: Connection, mux: Multiplexer, topic: str, partitions: int,
                 start: str | MessageId = "earliest", inclusive: bool = False,
                 receiver_queue_size: int = 1000, subscribe_timeout: float = 30.0,
                 read_compacted: bool = False, reconnector: Reconnector | None = None):
        self.topic = topic
        self.read_compacted = read_compacted
        # handle -> seek answer (where it landed, clamped; or why not), while seeking
        self._seeks: dict[int, _SeekAnswer | None] | None = None
        self._conn = conn
        self._start = start
        self._reconnector = reconnector  # None: a broken partition fails the reader
        self._owner = Owner(topic, self._resume, self._give_up)  # what `_reconnector` drives
        self._lock = threading.Lock()    # the partitions' handles, against a reconnect
        self._queue = QueueSink()
        self._buffer: deque[Message] = deque()
        self._permits = receiver_queue_size
        self._closed = False
        self._error: Exception | None = None  # once failed, every read raises it
        names = [topic] if partitions == 0 else [f"{topic}-partition-{i}"
                                                   for i in range(partitions)]
        self._parts: dict[int, _Partition] = {}
        pos = start_position(start)
        for i, name in enumerate(names):
            handle = mux.register(self._queue)
            p = _Partition(name, i if partitions else TopicName.parse(name).partition_index,
                           handle, mux)
            self._parts[handle] = p
            mux.send(consumer_pb2.ClientCommand(handle=handle, subscribe=consumer_pb2.Subscribe(
                topic=name, start=pos, start_inclusive=inclusive,
                read_compacted=read_compacted)))
        self._parts_by_index = {p.index: p for p in self._parts.values()}
        pending = set(self._parts)
        while pending:
            try:
                handle, item = self._queue.get(timeout=subscribe_timeout)
            except queue.Empty:
                self.close()
                raise errors.Timeout(f"subscribing to {topic} timed out") from None
            if isinstance(item, Exception):
                self.close()
                raise item
            ev = item.frame.event
            if ev.HasField("error"):
                self.close()
                raise errors.from_reason(ev.error.reason, ev.error.message, ev.error.code)
            if ev.HasField("subscribed"):
                p = self._parts[handle]
                last = ev.subscribed.last_message_id
                if isinstance(start, MessageId) or start not in ("earliest", "latest"):
                    mid = start if isinstance(start, MessageId) else MessageId.parse(start)
                    p.threshold, p.inclusive = MessageId(mid.ledger_id, mid.entry_id), inclusive
                elif start == "latest":
                    p.threshold = (MessageId(last.ledger_id, last.entry_id) if last.ledger_id
                                   else None)
                    p.inclusive = inclusive
                pending.discard(handle)
                mux.send(consumer_pb2.ClientCommand(handle=handle, flow=consumer_pb2.Flow(
                    permits=self._permits)))

    def read_next(self, timeout: float | None = None) -> Message:
        """The next message; raises `Timeout` when none arrives within `timeout` seconds,
        `AlreadyClosed` once the reader (or its client) is closed, also while waiting."""
        if self._closed:
            raise errors.AlreadyClosed("reader is closed")
        while not self._buffer:
            if self._error is not None:
                raise self._error
            try:
                handle, item = self._queue.get(timeout=timeout)
            except queue.Empty:
                raise errors.Timeout("no message available in time") from None
            self._take(handle, item)
        return self._pop()

    def poll(self, wake: Callable[[], None] | None = None) -> Message | None:
        """The next message if one is here, else None without waiting; then `wake()` is
        called once (on the stream's thread; it must not block) when something came: how the
        asyncio face waits (source/client/aio/). Raises as `read_next` does."""
        if self._closed:
            raise errors.AlreadyClosed("reader is closed")
        while not self._buffer:
            if self._error is not None:
                raise self._error
            try:
                handle, item = self._queue.get_nowait()
            except queue.Empty:
                if wake is not None:
                    self._queue.wake_on_put(wake)
                return None
            self._take(handle, item)
        return self._pop()

    def _pop(self) -> Message:
        msg = self._buffer.popleft()
        part = self._parts_by_index[msg.message_id.partition]
        part.last = msg.message_id  # with the partition: compare ledger and entry only
        part.consumed += 1
        if part.consumed >= self._permits // 2 and part.state == "open":
            self._flow(part, part.consumed)
            part.consumed = 0
        return msg

    def _flow(self, p: _Partition, permits: int) -> None:
        try:
            p.mux.send(consumer_pb2.ClientCommand(handle=p.handle, flow=consumer_pb2.Flow(
                permits=permits)))
        except errors.ShadowTopicError:  # the stream is gone; the queue hears it too
            pass

    def _take(self, handle: int, item: Delivery | Exception | _GaveUp | _Closed) -> None:
        if item is _CLOSED:
            raise errors.AlreadyClosed("reader is closed")
        if isinstance(item, _GaveUp):
            self._error = item.err
            raise item.err
        p = self._parts.get(handle)
        if isinstance(item, Exception):
            if p is None and self._reconnector is not None:
                return  # a stream the partitions left already (they reconnected)
            if p is not None and self._broken(p, item):
                return
            self._error = item
            raise item
        if p is None:
            return
        frame = item.frame
        if frame.HasField("event"):
            ev = frame.event
            if ev.HasField("error"):
                e = ev.error
                err = errors.from_reason(e.reason, e.message, e.code)
                if self._broken(p, err):
                    return
                self._error = err
                raise self._error
            if ev.HasField("seek_done"):
                self._seek_done(p, ev.seek_done)
            elif ev.HasField("warning") and self._seeks is not None and p.handle in self._seeks:
                w = ev.warning
                if w.details.get("command") == "seek" and self._seeks[p.handle] is None:
                    self._seeks[p.handle] = errors.from_reason(w.reason, w.message, w.code)
        if frame.entries:
            msgs = item.messages(p.topic, p.index)
            self._buffer.extend(msgs)
            p.received = msgs[-1].message_id

    def _seek_done(self, p: _Partition, done: consumer_pb2.SeekDone) -> None:
        """The partition moved (this reader's seek, or someone else's with `by_admin`): what
        it received before is dropped; the broker left it no permits, so grant them anew."""
        if self._buffer:
            self._buffer = deque(m for m in self._buffer if m.message_id.partition != p.index)
        position = MessageId.from_pb(done.position)
        p.last = p.received = None
        p.threshold, p.inclusive = MessageId(position.ledger_id, position.entry_id), True
        p.consumed = 0
        self._flow(p, self._permits)
        if (not done.by_admin and self._seeks is not None and p.handle in self._seeks
                and self._seeks[p.handle] is None):
            self._seeks[p.handle] = (position.with_partition(p.index), done.clamped)

    # ---- reconnecting (source/client/reconnect.py) -------------------------------------

    def _broken(self, p: _Partition, err: Exception) -> bool:
        """`p`'s handle broke with `err` (seen in queue order, on the reading thread): True
        when it reconnects (a pending seek of it fails with `err`); False: the reader fails."""
        if p.state == "reconnecting":
            return True  # the stream's end after an in-band error: already on it
        if self._reconnector is None or self._closed or not reconnectable(err):
            return False
        p.state = "reconnecting"
        if self._seeks is not None and self._seeks.get(p.handle, 0) is None:
            self._seeks[p.handle] = err
        self._reconnector.start(self._owner)
        return True

    def _resume(self, mux: Multiplexer, timeout: float) -> None:
        """One attempt (reconnect.Resumable, on the reconnector's thread): each partition
        still reconnecting subscribes again on `mux` where it left off; its answer comes to
        this attempt, then its handle's frames go to the reader's queue and a Flow goes up.
        Raises the first failure, leaving the new handles."""
        with self._lock:
            if self._closed:
                raise errors.AlreadyClosed("reader is closed")
            parts = [p for p in self._parts.values() if p.state == "reconnecting"]
        if not parts:
            return
        answers = QueueSink()
        new: dict[int, _Partition] = {}
        try:
            for p in parts:
                start, inclusive = p.resume_at(self._start)
                handle = mux.register(answers)
                new[handle] = p
                mux.send(consumer_pb2.ClientCommand(handle=handle, subscribe=consumer_pb2.Subscribe(
                    topic=p.topic, start=start, start_inclusive=inclusive,
                    read_compacted=self.read_compacted)))
            deadline = time.monotonic() + timeout
            pending = set(new)
            while pending:
                try:
                    handle, item = answers.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise errors.Timeout(f"resubscribing to {self.topic} timed out") from None
                if isinstance(item, Exception):
                    raise item
                ev = item.frame.event
                if ev.HasField("error"):
                    raise errors.from_reason(ev.error.reason, ev.error.message, ev.error.code)
                if ev.HasField("subscribed"):
                    pending.discard(handle)
            with self._lock:
                if self._closed:
                    raise errors.AlreadyClosed("reader is closed")
                for handle, p in new.items():
                    mux.redirect(handle, self._queue)
                    old_mux, old = p.mux, p.handle
                    self._parts[handle] = p
                    p.handle, p.mux, p.state, p.consumed = handle, mux, "open", 0
                    self._parts.pop(old, None)
                    old_mux.unregister(old)
                    self._flow(p, self._permits)
        except BaseException:
            for handle in new:
                if self._parts.get(handle) is None:
                    mux.unregister(handle)
                    try:
                        mux.send(consumer_pb2.ClientCommand(handle=handle,
                                                            close=consumer_pb2.CloseHandle()))
                    except errors.ShadowTopicError:
                        pass
            raise

    def _give_up(self, err: errors.ShadowTopicError) -> None:
        """Reconnecting failed for good (reconnect.Resumable): `read_next` raises `err`."""
        self._queue.put((0, _GaveUp(err)))

    def seek(self, position: MessageId | str | int) -> SeekResult:
        """Move the reader to a MessageId ("L:E" text too; the next message read is that one,
        or the first after it that exists) or to a publish time (int, ms since the epoch: the
        first message published at or after it), and wait for the broker. An id with a
        partition moves that partition, anything else every partition. Returns where the
        reader landed and whether the position was clamped to the first or last message
        (several partitions: the lowest landing id, clamped if any was), as
        `Consumer.seek`. Messages received before are dropped."""
        if self._closed:
            raise errors.AlreadyClosed("reader is closed")
        if self._error is not None:
            raise self._error
        pos, targets = seek_targets(position, self._parts_by_index)
        self._seeks = {p.handle: None for p in targets}
        try:
            for p in targets:
                if p.state != "open":
                    raise errors.ServiceUnavailable(f"{p.topic} is reconnecting; try again")
                p.mux.send(consumer_pb2.ClientCommand(handle=p.handle,
                                                      seek=consumer_pb2.Seek(position=pos)))
            deadline = time.monotonic() + self._conn.timeout
            while any(v is None for v in self._seeks.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise errors.Timeout(f"seek timed out after {self._conn.timeout:g}s")
                try:
                    handle, item = self._queue.get(timeout=min(left, 0.2))
                except queue.Empty:
                    continue
                self._take(handle, item)
            answers = list(self._seeks.values())
        finally:
            self._seeks = None
        landed: list[tuple[MessageId, bool]] = []
        for a in answers:
            if isinstance(a, BaseException):
                raise a  # the first failure
            if a is not None:
                landed.append(a)
        return SeekResult(min(mid for mid, _ in landed), any(c for _, c in landed))

    def has_message_available(self) -> bool:
        if self._closed:
            raise errors.AlreadyClosed("reader is closed")
        if self._buffer or not self._queue.empty():
            return True
        admin = Admin(self._conn)
        for p in self._parts.values():
            last = admin.last_message_id(p.topic, self.read_compacted)
            if last is None:
                continue
            last = MessageId(last.ledger_id, last.entry_id)
            if p.last is not None:
                if last > MessageId(p.last.ledger_id, p.last.entry_id):
                    return True
            elif p.threshold is None or last > p.threshold or (p.inclusive and last == p.threshold):
                return True
        return False

    def last_message_ids(self) -> list[MessageId]:
        """The newest message's id of each partition that holds one, with its partition
        (with `read_compacted`: the newest one this reader can read), asked of the broker
        now."""
        if self._closed:
            raise errors.AlreadyClosed("reader is closed")
        admin = Admin(self._conn)
        out = []
        for p in self._parts.values():
            last = admin.last_message_id(p.topic, self.read_compacted)
            if last is not None:
                out.append(MessageId(last.ledger_id, last.entry_id, p.index))
        return out

    def close(self) -> None:
        """Close the reader's handles; a `read_next` waiting in another thread raises
        `AlreadyClosed` at once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            parts = list(self._parts.values())
        for p in parts:
            if p.state == "open":
                try:
                    p.mux.send(consumer_pb2.ClientCommand(handle=p.handle,
                                                          close=consumer_pb2.CloseHandle()))
                except errors.ShadowTopicError:  # the stream is gone: nothing to close there
                    pass
            p.mux.unregister(p.handle)
        self._queue.put((0, _CLOSED))

    def __iter__(self) -> Iterator[Message]:
        while self.has_message_available():
            yield self.read_next(timeout=self._conn.timeout)

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
