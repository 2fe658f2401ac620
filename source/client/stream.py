"""The client's Consumer.Connect stream, shared by all readers and consumers of one Client.

A `Multiplexer` is one stream; each partition of a reader or consumer gets a handle on it,
and its frames go to that handle's `Sink`. Commands go up batched (individual acks grouped
into ranges: `acks.PendingAcks`); each frame that comes down is a `Delivery`, decoded once
per topic partition however many handles it names; when several handles read a topic, an
entry that comes again in another frame (another reader's) is shared too (`Recent`).

Closing is deterministic: `Multiplexer.close` returns only once the stream's receive thread
has ended and gRPC has finished the call (see there why that matters at interpreter exit).
"""
from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import grpc

from shadowtopic.client.acks import ACKS, PendingAcks, Request
from shadowtopic.client.connection import Connection
from shadowtopic.client.message import Message
from shadowtopic.core import errors
from shadowtopic.pb.v1 import common_pb2, consumer_pb2

CONNECT = "/shadowtopic.v1.Consumer/Connect"
MAX_COMMANDS = 10_000  # commands per ClientMessage
CLOSE_TIMEOUT_S = 5.0  # the longest Multiplexer.close waits for gRPC, then for its thread
#: handle numbers, unique across every stream of the process: a partition that reconnects
#: (source/client/reconnect.py) keeps meaning one thing whatever stream its handle is on
_HANDLES = itertools.count(1)


class Sink(Protocol):
    """What `Multiplexer.register` hands one handle's frames to, on the stream's receive
    thread: `(handle, Delivery)` for each frame naming the handle, then `(handle, error)`
    once the stream ended. A frame naming several handles of one sink is handed over once,
    to `put_many` (a `subscribe_many` listener passes it on to its consumers at once)."""

    def put(self, item: tuple[int, Delivery | Exception]) -> None:
        ...

    def put_many(self, handles: list[int], delivery: Delivery) -> None:
        ...


class _Call(Protocol):
    """The Connect call, as used here (gRPC's streaming call object)."""

    def __iter__(self) -> Iterator[consumer_pb2.ServerMessage]:
        ...

    def cancel(self) -> bool:
        ...

    def add_callback(self, callback: Callable[[], None]) -> bool:
        ...


class QueueSink(queue.Queue[tuple[int, Any]]):
    """A `Sink` that queues `(handle, Delivery | error)` items for a thread to take (a
    Reader's, which queues its own wake-ups too). `wake_on_put(wake)`: call `wake()` once,
    after the next item is queued (or now, when one is there): how the asyncio face
    (source/client/aio/) learns without a thread of its own that a read can go on."""

    def __init__(self) -> None:
        super().__init__()
        self._wakers: list[Callable[[], None]] = []
        self._wakers_lock = threading.Lock()

    def put_many(self, handles: list[int], delivery: Delivery) -> None:
        for handle in handles:
            self.put((handle, delivery))

    def put(self, item: tuple[int, Any], block: bool = True,
            timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        if self._wakers:  # (read without the lock: a waker added meanwhile checks itself)
            with self._wakers_lock:
                wakers, self._wakers = self._wakers, []
            for wake in wakers:
                wake()

    def wake_on_put(self, wake: Callable[[], None]) -> None:
        with self._wakers_lock:
            self._wakers.append(wake)
        if not self.empty():  # an item came before the waker was in place
            with self._wakers_lock:
                if wake not in self._wakers:
                    return  # (a put called it already)
                self._wakers.remove(wake)
            wake()


class Multiplexer:
    """One Connect stream. Commands queued by `send` go up batched (one ClientMessage holds
    every command queued meanwhile); each frame that comes down is handed to the sink of
    every handle it names (the broker sends an entry once per stream; fan-out is here)."""

    def __init__(self, conn: Connection):
        requests: queue.SimpleQueue[Request | None] = queue.SimpleQueue()
        self._requests = requests
        self._sinks: dict[int, Sink] = {}
        self._topic_of: dict[int, str] = {}  # a handle -> the topic it reads (when told)
        self._readers: dict[str, int] = {}   # a topic -> how many handles read it
        self._recent = Recent()  # messages shared by several readers of a topic
        self._lock = threading.Lock()
        self._dead: Exception | None = None
        self._closed = False
        finished = self._finished = threading.Event()  # gRPC has handled the final status
        call = conn.channel.stream_stream(
            CONNECT, request_serializer=consumer_pb2.ClientMessage.SerializeToString,
            response_deserializer=consumer_pb2.ServerMessage.FromString)

        acks = self._acks = PendingAcks()

        # refers to the queues only: gRPC's request thread never holds the mux
        def gen() -> Iterator[consumer_pb2.ClientMessage]:
            while (item := requests.get()) is not None:
                batch = [item]
                while len(batch) < MAX_COMMANDS:
                    try:
                        item = requests.get_nowait()
                    except queue.Empty:
                        break
                    if item is None:
                        yield consumer_pb2.ClientMessage(commands=acks.expand(batch))
                        return
                    batch.append(item)
                yield consumer_pb2.ClientMessage(commands=acks.expand(batch))

        self._responses: _Call | None = call(gen())  # None once closed: the call is freed
        if not self._responses.add_callback(finished.set):
            finished.set()  # (the call had ended already: the callback is not called)
        self._thread = threading.Thread(target=self._receive, daemon=True, name="consumer-rx")
        self._thread.start()

    @property
    def dead(self) -> bool:
        return self._dead is not None

    def register(self, sink: Sink, topic: str | None = None) -> int:
        """A new handle whose frames go to `sink`; `topic`: the topic (partition) it reads,
        counted so that several readers of it share its messages (`recent_for`)."""
        with self._lock:
            if self._dead is not None:
                raise self._dead
            handle = next(_HANDLES)
            self._sinks[handle] = sink
            if topic is not None:
                self._topic_of[handle] = topic
                self._readers[topic] = self._readers.get(topic, 0) + 1
            return handle

    def recent_for(self, topic: str) -> Recent | None:
        """The stream's recent messages when several handles read `topic`, else None: the
        cache costs a lone reader more than it saves (`Recent`)."""
        return self._recent if self._readers.get(topic, 0) > 1 else None

    def redirect(self, handle: int, sink: Sink) -> None:
        """Hand `handle`'s frames to `sink` from now on (a reader's partition that
        resubscribed: its answer went to the reconnect attempt, its entries go to the
        reader's queue); nothing when the handle is not registered."""
        with self._lock:
            if handle in self._sinks:
                self._sinks[handle] = sink

    def unregister(self, handle: int) -> None:
        with self._lock:
            self._sinks.pop(handle, None)
            topic = self._topic_of.pop(handle, None)
            if topic is not None:
                left = self._readers[topic] - 1
                if left:
                    self._readers[topic] = left
                else:
                    del self._readers[topic]

    def send(self, cmd: consumer_pb2.ClientCommand) -> None:
        if self._dead is not None:
            raise self._dead
        self._requests.put(cmd)

    def ack(self, handle: int, ledger: int, entry: int) -> None:
        """An individual ack, grouped with the handle's other acks queued meanwhile into one
        command (Pulsar's client groups acks too): a consumer acking every message sends one
        Ack of a few ranges per stream message, not a command per message (acks.py)."""
        if self._dead is not None:
            raise self._dead
        if self._acks.add(handle, ledger, entry):
            self._requests.put(ACKS)

    def _receive(self) -> None:
        err: Exception = errors.ConnectError("consumer stream ended")
        recent_for = self.recent_for
        responses = self._responses
        try:
            if responses is None:
                return  # (closed before this thread ran)
            for message in responses:
                for frame in message.frames:
                    delivery = Delivery(frame, recent_for)  # shared by the handles it names
                    handles = frame.handles
                    if len(handles) == 1:
                        sink = self._sinks.get(handles[0])
                        if sink is not None:
                            sink.put((handles[0], delivery))
                        continue
                    by_sink: dict[Sink, list[int]] = {}
                    for handle in handles:
                        sink = self._sinks.get(handle)
                        if sink is not None:
                            by_sink.setdefault(sink, []).append(handle)
                    for sink, hs in by_sink.items():
                        sink.put_many(hs, delivery)
        except grpc.RpcError as exc:
            err = errors.from_rpc_error(exc)
            # gRPC raises the call object itself; its traceback's frames refer back to it, a
            # cycle only the garbage collector would break (perhaps at exit: see close)
            exc.__traceback__ = None
        self._requests.put(None)  # gRPC's request thread, waiting in gen(), ends too
        with self._lock:
            if self._closed:
                err = errors.AlreadyClosed("client is closed")
            self._dead = err
            sinks = list(self._sinks.items())
        for handle, sink in sinks:
            sink.put((handle, err))

    def close(self) -> None:
        """End the stream and wait (at most CLOSE_TIMEOUT_S seconds each) until the receive
        thread has ended and gRPC has handled the call's final status; then drop the call.

        Returning earlier, as this once did, let a process exit while the receive thread or
        gRPC's threads were still inside the call's lock. The call object, a garbage cycle,
        was then collected during interpreter shutdown, after daemon threads were frozen:
        its `__del__` waited for that lock forever (a CLI that printed everything and hung
        in a futex wait with one thread left).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._requests.put(None)
        if self._responses is not None:  # (set until this close)
            self._responses.cancel()
        self._finished.wait(CLOSE_TIMEOUT_S)
        self._thread.join(CLOSE_TIMEOUT_S)
        self._responses = None


class Recent:
    """Recently received messages by (topic, ledger, entry), for topics that several handles
    of one stream read: readers at different positions (each served its own frames) share
    one `Message` per entry, parsed once. Bounded: forgets everything past `limit`. Only
    for such topics: the tens of thousands of objects it keeps alive cost the cyclic garbage
    collector ~5 us a message, which a lone reader pays for nothing."""

    def __init__(self, limit: int = 50_000):
        self._limit = limit
        self._by_id: dict[tuple[str, int, int], Message] = {}

    def messages(self, topic: str, partition: int,
                 entries: Iterable[common_pb2.EncodedEntry]) -> list[Message]:
        cache = self._by_id
        if len(cache) > self._limit:
            cache.clear()
        out = []
        for e in entries:
            key = (topic, e.ledger_id, e.entry_id)
            msg = cache.get(key)
            if msg is None or e.redelivery_count:
                msg = Message.from_entry(topic, partition, e)
                if not e.redelivery_count:
                    cache[key] = msg
            out.append(msg)
        return out


class Delivery:
    """One frame as its handles receive it: the entries become `Message`s once per topic
    partition, and every reader of that partition the frame names shares them (they are
    immutable), so a frame for 100 readers is decoded once, not 100 times."""

    __slots__ = ("frame", "_recent_for", "_messages")

    def __init__(self, frame: consumer_pb2.ServerFrame,
                 recent_for: Callable[[str], Recent | None] | None = None):
        self.frame = frame
        self._recent_for = recent_for  # the stream's (Multiplexer.recent_for)
        self._messages: dict[tuple[str, int], list[Message]] = {}

    def messages(self, topic: str, partition: int) -> list[Message]:
        key = (topic, partition)
        msgs = self._messages.get(key)
        if msgs is None:
            recent = self._recent_for(topic) if self._recent_for is not None else None
            msgs = self._messages[key] = (
                recent.messages(topic, partition, self.frame.entries) if recent is not None
                else [Message.from_entry(topic, partition, e) for e in self.frame.entries])
        return msgs

