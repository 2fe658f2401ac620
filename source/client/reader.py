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

Closing is deterministic: `Reader.close` wakes a `read_next` blocked in another thread (it
raises `AlreadyClosed`), and `Multiplexer.close` returns only once the stream's receive thread
has ended and gRPC has finished the call (see there why that matters at interpreter exit).
"""
from __future__ import annotations

import queue
import time
from collections import deque

from source.client.admin import Admin, position_pb
from source.client.connection import Connection
from source.client.message import Message
from source.client.stream import Multiplexer
from source.core import errors
from source.core.message_id import MessageId
from source.core.names import TopicName
from source.pb.v1 import common_pb2, consumer_pb2

_CLOSED = object()  # what Reader.close puts on its own queue, to wake a blocked read_next


def start_position(start: str | MessageId) -> common_pb2.StartPosition:
    if isinstance(start, MessageId):
        return common_pb2.StartPosition(message_id=start.to_pb())
    if start == "earliest":
        return common_pb2.StartPosition(earliest=True)
    if start == "latest":
        return common_pb2.StartPosition(latest=True)
    return common_pb2.StartPosition(message_id=MessageId.parse(start).to_pb())


def seek_targets(position: MessageId | str | int, by_index: dict) -> tuple[
        common_pb2.StartPosition, list]:
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
    def __init__(self, topic: str, index: int, handle: int):
        self.topic = topic
        self.index = index
        self.handle = handle
        self.consumed = 0
        self.last: MessageId | None = None      # id of the last message returned to the user
        self.threshold: MessageId | None = None  # an entry beyond this is unread
        self.inclusive = False


class Reader:
    def __init__(self, conn: Connection, mux: Multiplexer, topic: str, partitions: int,
                 start: str | MessageId = "earliest", inclusive: bool = False,
                 receiver_queue_size: int = 1000, subscribe_timeout: float = 30.0,
                 read_compacted: bool = False):
        self.topic = topic
        self.read_compacted = read_compacted
        self._seeks: dict[int, object] | None = None  # handle -> seek answer, while seeking
        self._conn = conn
        self._mux = mux
        self._queue: queue.Queue = queue.Queue()
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
                           handle)
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
                    p.threshold = MessageId(last.ledger_id, last.entry_id) if last.ledger_id else None
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
        msg = self._buffer.popleft()
        part = self._parts_by_index[msg.message_id.partition]
        part.last = msg.message_id  # with the partition: compare ledger and entry only
        part.consumed += 1
        if part.consumed >= self._permits // 2:
            self._mux.send(consumer_pb2.ClientCommand(handle=part.handle, flow=consumer_pb2.Flow(
                permits=part.consumed)))
            part.consumed = 0
        return msg

    def _take(self, handle: int, item) -> None:
        if item is _CLOSED:
            raise errors.AlreadyClosed("reader is closed")
        if isinstance(item, Exception):
            self._error = item
            raise item
        p = self._parts.get(handle)
        if p is None:
            return
        frame = item.frame
        if frame.HasField("event"):
            ev = frame.event
            if ev.HasField("error"):
                e = ev.error
                self._error = errors.from_reason(e.reason, e.message, e.code)
                raise self._error
            if ev.HasField("seek_done"):
                self._seek_done(p, ev.seek_done)
            elif ev.HasField("warning") and self._seeks is not None and p.handle in self._seeks:
                w = ev.warning
                if w.details.get("command") == "seek" and self._seeks[p.handle] is None:
                    self._seeks[p.handle] = errors.from_reason(w.reason, w.message, w.code)
        if frame.entries:
            self._buffer.extend(item.messages(p.topic, p.index))

    def _seek_done(self, p: _Partition, done: consumer_pb2.SeekDone) -> None:
        """The partition moved (this reader's seek, or someone else's with `by_admin`): what
        it received before is dropped; the broker left it no permits, so grant them anew."""
        if self._buffer:
            self._buffer = deque(m for m in self._buffer if m.message_id.partition != p.index)
        position = MessageId.from_pb(done.position)
        p.last = None
        p.threshold, p.inclusive = MessageId(position.ledger_id, position.entry_id), True
        p.consumed = 0
        try:
            self._mux.send(consumer_pb2.ClientCommand(handle=p.handle, flow=consumer_pb2.Flow(
                permits=self._permits)))
        except errors.ShadowTopicError:  # the stream is gone; the queue hears it too
            pass
        if (not done.by_admin and self._seeks is not None and p.handle in self._seeks
                and self._seeks[p.handle] is None):
            self._seeks[p.handle] = (position.with_partition(p.index), done.clamped)

    def seek(self, position: MessageId | str | int) -> MessageId:
        """Move the reader to a MessageId ("L:E" text too; the next message read is that one,
        or the first after it that exists) or to a publish time (int, ms since the epoch: the
        first message published at or after it), and wait for the broker. An id with a
        partition moves that partition, anything else every partition. Returns where the
        reader landed (several partitions: the lowest id). Messages received before are
        dropped."""
        if self._closed:
            raise errors.AlreadyClosed("reader is closed")
        if self._error is not None:
            raise self._error
        pos, targets = seek_targets(position, self._parts_by_index)
        self._seeks = {p.handle: None for p in targets}
        try:
            for p in targets:
                self._mux.send(consumer_pb2.ClientCommand(handle=p.handle,
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
        failure = next((a for a in answers if isinstance(a, BaseException)), None)
        if failure is not None:
            raise failure
        return min(mid for mid, _ in answers)

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

    def close(self) -> None:
        """Close the reader's handles; a `read_next` waiting in another thread raises
        `AlreadyClosed` at once."""
        if self._closed:
            return
        self._closed = True
        for handle in self._parts:
            try:
                self._mux.send(consumer_pb2.ClientCommand(handle=handle,
                                                          close=consumer_pb2.CloseHandle()))
            except errors.ShadowTopicError:  # the stream is gone: nothing to close there
                pass
            self._mux.unregister(handle)
        self._queue.put((0, _CLOSED))

    def __iter__(self):
        while self.has_message_available():
            yield self.read_next(timeout=self._conn.timeout)

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
