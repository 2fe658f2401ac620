"""Sync producer: batches messages per partition and streams them on one Produce stream.

`send_async` adds a message to its partition's open batch; a batch closes when it holds
`batch_max_messages` messages or `batch_max_bytes` bytes, or `linger_ms` after its first
message. Closed batches enter one ordered outbox (under the same lock that fills them, so
send order is batch order) and one sender thread streams them. At most `max_inflight`
batches wait for receipts and as many more wait in the outbox; then `send_async` blocks
(the backpressure), except on the receipt thread: a callback may produce without deadlock. A receipt arrives after the broker's fsync and resolves every message of its
batch with its MessageId, in send order; `send` is `send_async` + flush + wait.
Partitioned topics route by crc32c(key) % partitions, keyless messages round-robin.
Options and message fields are checked before anything is queued: a bad one raises
`InvalidArgument` (`MessageTooBig` above MAX_MESSAGE_SIZE) in the caller.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from typing import Callable

import google_crc32c
import grpc

from source.client.connection import Connection
from source.core import errors
from source.core.message_id import MessageId
from source.core.policies import MAX_BATCH_MESSAGES, MAX_MESSAGE_SIZE
from source.pb.v1 import producer_pb2

Callback = Callable[[MessageId | None, Exception | None], None]
#: a batch stays below gRPC's 64 MiB frame even with one more maximal message in it
MAX_BATCH_BYTES = 32 << 20
_INT64 = 1 << 63


def _option(name: str, value, low: float, high: float, kinds: tuple = (int,)):
    if not isinstance(value, kinds) or isinstance(value, bool) or not low <= value <= high:
        raise errors.InvalidArgument(f"{name} must be a number in {low}..{high}, got {value!r}")
    return value


def _as_bytes(name: str, value) -> bytes:
    if value.__class__ is bytes:
        return value
    if isinstance(value, str):
        try:
            return value.encode()
        except UnicodeEncodeError:
            raise errors.InvalidArgument(f"{name} is not valid unicode") from None
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise errors.InvalidArgument(f"{name} must be bytes or str, got {type(value).__name__}")


def _check_extras(properties, event_time) -> None:
    if properties is not None and not (isinstance(properties, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in properties.items())):
        raise errors.InvalidArgument("properties must map strings to strings")
    if event_time.__class__ is not int or not -_INT64 <= event_time < _INT64:
        raise errors.InvalidArgument(f"event_time must be ms since the epoch (an int64), "
                                     f"got {event_time!r}")


class _Batch:
    """Messages are built in place inside the request that will carry them (no copies)."""

    __slots__ = ("request", "add", "partition", "callbacks", "size", "created")

    def __init__(self, topic: str, partition: int, producer_name: str):
        self.request = producer_pb2.ProduceRequest(topic=topic, producer_name=producer_name)
        self.add = self.request.messages.add
        self.partition = partition
        self.callbacks: list[Callback | None] = []
        self.size = 0
        self.created = time.monotonic()


class Producer:
    def __init__(self, conn: Connection, topic: str, partitions: int = 0,
                 producer_name: str = "", batch_max_messages: int = 1000,
                 batch_max_bytes: int = 1 << 20, linger_ms: float = 5.0,
                 max_inflight: int = 8):
        self.topic = topic
        self.partitions = partitions
        self.producer_name = producer_name
        self._conn = conn
        self._max_msgs = _option("batch_max_messages", batch_max_messages, 1,
                                 MAX_BATCH_MESSAGES)
        self._max_bytes = _option("batch_max_bytes", batch_max_bytes, 1, MAX_BATCH_BYTES)
        self._linger = _option("linger_ms", linger_ms, 0, 60_000, (int, float)) / 1000.0
        _option("max_inflight", max_inflight, 1, 10_000)
        self._lock = threading.Lock()           # open batches, sequence ids
        self._send_lock = threading.Lock()      # in-flight order == stream order
        self._idle = threading.Condition(self._send_lock)
        self._batches: dict[int, _Batch] = {}
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._max_queued = max_inflight
        self._queued = 0                         # closed batches not yet on the stream
        self._room = threading.Condition()       # signalled when _queued drops
        self._unacked = 0                        # closed batches without a receipt yet
        self._inflight: deque[tuple[int, _Batch]] = deque()
        self._window = threading.Semaphore(max_inflight)
        self._request_ids = itertools.count(1)
        self._rr = itertools.count()
        self._seq = 0
        self._acked = 0
        self._failed = 0
        self._requests: queue.SimpleQueue | None = None
        self._receiver: threading.Thread | None = None
        self._closed = False
        self._flusher = threading.Thread(target=self._linger_loop, daemon=True,
                                         name="producer-linger")
        self._flusher.start()
        self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                        name="producer-send")
        self._sender.start()

    # ---- public API ------------------------------------------------------------------------

    def send_async(self, payload: bytes | str, key: bytes | str | None = None,
                   properties: dict[str, str] | None = None, event_time: int = 0,
                   callback: Callback | None = None) -> None:
        """Queue a message; `callback(message_id, None)` after the broker's fsync, or
        `callback(None, error)`. Blocks only when `max_inflight` batches are waiting."""
        if self._closed:
            raise errors.AlreadyClosed("producer is closed")
        if payload.__class__ is not bytes:  # the hot path makes no call for bytes
            payload = _as_bytes("payload", payload)
        if key is not None and key.__class__ is not bytes:
            key = _as_bytes("key", key)
        if len(payload) > MAX_MESSAGE_SIZE:
            raise errors.MessageTooBig(f"payload of {len(payload)} bytes exceeds the "
                                       f"{MAX_MESSAGE_SIZE} bytes a message may have")
        if properties or event_time:
            _check_extras(properties, event_time)
        part = self._route(key) if self.partitions else -1
        if self._queued >= self._max_queued:
            self._wait_for_room()
        with self._lock:
            b = self._batches.get(part)
            if b is None:
                b = self._new_batch(part)
            self._seq += 1
            m = b.add()  # attribute sets are cheaper than constructor kwargs in upb
            m.payload = payload
            m.producer_name = self.producer_name
            m.sequence_id = self._seq
            if key is not None:
                m.key = key
            if properties:
                m.properties.update(properties)
            if event_time:
                m.event_time = event_time
            cbs = b.callbacks
            cbs.append(callback)
            b.size += len(payload) + 24
            if len(cbs) >= self._max_msgs or b.size >= self._max_bytes:
                self._close_batch(part)

    def _wait_for_room(self) -> None:
        if threading.current_thread() is self._receiver:
            return  # a callback producing: never block the thread that frees room
        with self._room:
            while self._queued >= self._max_queued and not self._closed:
                self._room.wait(0.5)

    def _new_batch(self, part: int) -> _Batch:
        topic = self.topic if self.partitions == 0 else f"{self.topic}-partition-{part}"
        b = self._batches[part] = _Batch(topic, part, self.producer_name)
        return b

    def send(self, payload: bytes | str, key: bytes | str | None = None,
             properties: dict[str, str] | None = None, event_time: int = 0,
             timeout: float | None = None) -> MessageId:
        done = threading.Event()
        out: list = []

        def cb(mid, exc):
            out.append((mid, exc))
            done.set()

        self.send_async(payload, key, properties, event_time, callback=cb)
        self._flush_open()
        if not done.wait(timeout or self._conn.timeout):
            raise errors.Timeout("no receipt from the broker in time")
        mid, exc = out[0]
        if exc is not None:
            raise exc
        return mid

    def stats(self) -> dict[str, int]:
        """Counters since creation: messages sent, acknowledged (after the broker's fsync),
        failed (their callbacks got an error), and batches still waiting for a receipt."""
        with self._idle:
            return {"sent": self._seq, "acked": self._acked, "failed": self._failed,
                    "pending_batches": self._unacked}

    def flush(self, timeout: float | None = None) -> None:
        """Send every open batch and wait for all receipts."""
        self._flush_open()
        deadline = time.monotonic() + (timeout or self._conn.timeout)
        with self._idle:
            while self._unacked:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise errors.Timeout("flush timed out waiting for receipts")
                self._idle.wait(left)

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            with self._room:
                self._room.notify_all()
            self._outbox.put(None)
            self._sender.join(10)
            with self._send_lock:
                if self._requests is not None:
                    self._requests.put(None)
            if self._receiver is not None:
                self._receiver.join(10)

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- internals -------------------------------------------------------------------------

    def _route(self, key: bytes | None) -> int:
        if key is None:
            return next(self._rr) % self.partitions
        return google_crc32c.value(key) % self.partitions

    def _close_batch(self, part: int) -> None:
        """Move a partition's open batch to the outbox (caller holds self._lock)."""
        b = self._batches.pop(part)
        with self._idle:
            self._unacked += 1
            self._queued += 1
        self._outbox.put(b)

    def _flush_open(self) -> None:
        with self._lock:
            for part in list(self._batches):
                self._close_batch(part)

    def _linger_loop(self) -> None:
        while not self._closed:
            time.sleep(self._linger)
            now = time.monotonic()
            with self._lock:
                for part in [p for p, b in self._batches.items()
                             if now - b.created >= self._linger]:
                    self._close_batch(part)

    def _send_loop(self) -> None:
        while True:
            batch = self._outbox.get()
            if batch is None:
                return
            self._window.acquire()
            with self._room:
                self._queued -= 1
                self._room.notify_all()
            with self._send_lock:
                if self._requests is None:
                    self._open_stream()
                rid = next(self._request_ids)
                batch.request.request_id = rid
                self._inflight.append((rid, batch))
                self._requests.put(batch.request)

    def _open_stream(self) -> None:
        requests: queue.SimpleQueue = queue.SimpleQueue()

        def gen():
            while True:
                item = requests.get()
                if item is None:
                    return
                yield item

        responses = self._conn.producer.Produce(gen())
        self._requests = requests
        self._receiver = threading.Thread(target=self._receive, args=(responses, requests),
                                          daemon=True, name="producer-receipts")
        self._receiver.start()

    def _receive(self, responses, requests) -> None:
        try:
            for receipt in responses:
                with self._send_lock:
                    rid, batch = self._inflight.popleft()
                self._window.release()  # before callbacks, which may produce
                ok = self._resolve(batch, receipt)
                with self._idle:
                    self._unacked -= 1
                    if ok:
                        self._acked += len(batch.callbacks)
                    else:
                        self._failed += len(batch.callbacks)
                    if not self._unacked:
                        self._idle.notify_all()
        except grpc.RpcError as exc:
            err = errors.from_rpc_error(exc)
            # grpc raises the call object itself; drop the traceback's cycle back to it so
            # the call is freed now, not by a garbage collection at interpreter exit (see
            # Multiplexer.close in reader.py for the hang that caused)
            exc.__traceback__ = None
            self._fail_inflight(err, requests)
            return
        self._fail_inflight(errors.ConnectError("produce stream ended"), requests)

    def _fail_inflight(self, err: Exception, requests) -> None:
        with self._send_lock:
            if self._requests is requests:
                self._requests = None
            failed = list(self._inflight)
            self._inflight.clear()
            self._unacked -= len(failed)
            self._failed += sum(len(b.callbacks) for _, b in failed)
            self._idle.notify_all()
        requests.put(None)
        for _, batch in failed:
            for cb in batch.callbacks:
                if cb is not None:
                    cb(None, err)
            self._window.release()

    def _resolve(self, batch: _Batch, receipt: producer_pb2.ProduceReceipt) -> bool:
        if receipt.HasField("error"):
            e = receipt.error
            err = errors.from_reason(e.reason, e.message, e.code)
            for cb in batch.callbacks:
                if cb is not None:
                    cb(None, err)
            return False
        lid, part = receipt.ledger_id, batch.partition
        new = tuple.__new__
        entry = receipt.first_entry_id
        for cb in batch.callbacks:
            if cb is not None:
                cb(new(MessageId, (lid, entry, part)), None)
            entry += 1
        return True
