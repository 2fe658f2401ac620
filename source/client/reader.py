"""Sync reader: a non-durable consumer of a topic (all partitions of a partitioned topic),
as in Pulsar: the same handle machinery as a durable subscription's consumer
(source/client/consumer.py, with `durable=False`), and no cursor on the broker.

    with client.create_reader("orders", start="earliest") as reader:
        for msg in reader:                   # to the end of the topic
            print(msg)

All readers and consumers of one Client share one Consumer.Connect stream
(`stream.Multiplexer`); each partition gets a handle. The broker sends entries as flow
permits allow (`receiver_queue_size`, topped up when half is consumed); `read_next` decodes
them. `has_message_available` compares what was read with the broker's last message id, so
a read loop ends at the end of the topic (`while r.has_message_available(): r.read_next()`).

`seek` moves a reader (by MessageId or publish time) and waits for the broker's `seek_done`,
after which what it had received for that partition is dropped.

A partition whose stream breaks, or that the broker ends with a retriable error
(`TopicNotOwned`, `Fenced`), reconnects by itself (source/client/reconnect.py has the
design) and subscribes again right after the last message `read_next` returned
(read_position.py): what was buffered and not returned comes again, so nothing is lost or
read twice. `read_next` keeps waiting within its timeout meanwhile, and raises the last
retriable error once reconnecting failed for longer than the client's operation timeout.

`close` wakes a `read_next` blocked in another thread (it raises `AlreadyClosed`).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from shadowtopic.client.admin import Admin
from shadowtopic.client.catch_up import CatchUp
from shadowtopic.client.connection import Connection
from shadowtopic.client.consumer import Consumer, ConsumerControl
from shadowtopic.client.message import Message
from shadowtopic.client.options import check_max_messages
from shadowtopic.client.reconnect import Reconnector
from shadowtopic.client.seek import SeekResult
from shadowtopic.client.stream import Multiplexer
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Reader", "SeekResult"]

_NOT_YET = object()  # a reader's catch-up: not started


def _start(start: str | MessageId) -> str | MessageId:
    """A reader starts at "earliest", "latest" or a message id (text "L:E" too)."""
    if isinstance(start, MessageId):
        return start
    if start in ("earliest", "latest"):
        return start
    if isinstance(start, str):
        return MessageId.parse(start)
    raise errors.InvalidArgument(f"a reader starts at earliest, latest or a message id, "
                                 f"got {start!r}")


class Reader:
    def __init__(self, conn: Connection, mux: Multiplexer, topic: str, partitions: int,
                 start: str | MessageId = "earliest", inclusive: bool = False,
                 receiver_queue_size: int = 1000, subscribe_timeout: float = 30.0,
                 read_compacted: bool = False, reconnector: Reconnector | None = None):
        """Use `Client.create_reader`: subscribes every partition and waits (at most
        `subscribe_timeout` seconds) for the broker's answers."""
        self.topic = topic
        self.read_compacted = read_compacted
        self._conn = conn
        controls: list[ConsumerControl] = []
        self._core = Consumer(conn, mux, topic, partitions, "", initial_position=_start(start),
                              receiver_queue_size=receiver_queue_size, wait=False,
                              read_compacted=read_compacted, reconnector=reconnector,
                              controls=controls, durable=False, inclusive=inclusive)
        controls[0].await_subscribed(time.monotonic() + subscribe_timeout)
        # read_batch's column reads behind the tail (catch_up.py): _NOT_YET until the first
        # read_batch, None once the stream is read (after a read_next, or caught up)
        self._catch_up: CatchUp | object | None = _NOT_YET

    def read_next(self, timeout: float | None = None) -> Message:
        """The next message; raises `Timeout` when none arrives within `timeout` seconds,
        `AlreadyClosed` once the reader (or its client) is closed, also while waiting."""
        if self._catch_up is not None:
            self._end_catch_up()
        return self._core.receive(timeout)

    def read_batch(self, max_messages: int = 1000, timeout: float | None = 0.1,
                   columns: Sequence[str] = ()) -> pa.RecordBatch:
        """Up to `max_messages` messages as one pyarrow record batch (source/client/
        arrow_reads.py: the ledger files' columns and `partition`; payloads as produced,
        decompressed): waits at most `timeout` seconds for the first (an empty batch when
        none came), then takes what is already there. Every message comes once, as with
        `read_next`. Behind the tail (from the start of a reader, or after a seek) the
        batches are read as columns, with no object per message (source/client/
        catch_up.py); once caught up, the messages the stream delivers live."""
        check_max_messages(max_messages)
        from shadowtopic.client.arrow_reads import column_names, record_batch
        names = column_names(columns)
        if self._catch_up is _NOT_YET:
            self._catch_up = self._start_catch_up()
        if isinstance(self._catch_up, CatchUp):
            batch = self._catch_up.next(max_messages, timeout, names)
            if batch is not None:
                return batch
            self._end_catch_up()
        return record_batch(self._core.batch_receive(max_messages, timeout), names)

    def _start_catch_up(self) -> CatchUp:
        """A catch-up from where this reader is in each partition (read_position.py)."""
        index = dict(self._core.partitions())
        parts = []
        for topic, pos in self._core.read_positions():
            parts.append((topic, index[topic], pos.next_id()))
        return CatchUp(self._conn.channel, self.read_compacted,
                       sorted(parts, key=lambda p: p[1]))

    def _end_catch_up(self) -> None:
        """Move each stream to where the catch-up left its partition (the messages it
        buffered meanwhile are dropped and come again from there), and read the stream from
        now on."""
        catch_up, self._catch_up = self._catch_up, None
        if isinstance(catch_up, CatchUp):
            catch_up.close()
            for index, position in catch_up.seeks():
                self._core.seek(MessageId(position.ledger_id, position.entry_id, index))

    def poll(self, wake: Callable[[], None] | None = None) -> Message | None:
        """The next message if one is here, else None without waiting; then `wake()` is
        called once (it must not block) when something came: how the asyncio face waits
        (source/client/aio/). Raises as `read_next` does."""
        if self._catch_up is not None:
            self._end_catch_up()
        return self._core.poll(wake)

    def seek(self, position: MessageId | str | int) -> SeekResult:
        """Move the reader to a MessageId ("L:E" text too; the next message read is that one,
        or the first after it that exists) or to a publish time (int, ms since the epoch: the
        first message published at or after it), and wait for the broker. An id with a
        partition moves that partition, anything else every partition. Returns where the
        reader landed and whether the position was clamped to the first or last message
        (several partitions: the lowest landing id, clamped if any was), as
        `Consumer.seek`. Messages received before are dropped; `read_batch` reads as
        columns again from there until caught up."""
        if isinstance(self._catch_up, CatchUp):
            self._catch_up.close()
        self._catch_up = _NOT_YET
        return self._core.seek(position)

    def has_message_available(self) -> bool:
        """Whether a message is buffered or the broker has one past what was read."""
        admin = Admin(self._conn)
        if isinstance(self._catch_up, CatchUp):  # (read_batch reads columns: no buffer)
            return self._catch_up.has_more(
                lambda topic: admin.last_message_id(topic, self.read_compacted))
        if self._core.has_buffered():
            return True
        for topic, position in self._core.read_positions():
            last = admin.last_message_id(topic, self.read_compacted)
            if last is not None and position.unread(last):
                return True
        return False

    def last_message_ids(self) -> list[MessageId]:
        """The newest message's id of each partition that holds one, with its partition
        (with `read_compacted`: the newest one this reader can read), asked of the broker
        now."""
        partitions = self._core.partitions()  # (raises once closed)
        admin = Admin(self._conn)
        out = []
        for topic, index in partitions:
            last = admin.last_message_id(topic, self.read_compacted)
            if last is not None:
                out.append(MessageId(last.ledger_id, last.entry_id, index))
        return out

    def close(self) -> None:
        """Close the reader's handles; a `read_next` waiting in another thread raises
        `AlreadyClosed` at once. Closing twice is a no-op."""
        if isinstance(self._catch_up, CatchUp):
            self._catch_up.close()
        self._catch_up = None
        self._core.close()

    def __iter__(self) -> Iterator[Message]:
        while self.has_message_available():
            yield self.read_next(timeout=self._conn.timeout)

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Reader(topic={self.topic!r})"
