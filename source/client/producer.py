"""Sync producer: batches messages per partition and streams them on one Produce stream.

`send_async` adds a message to its partition's open batch; a batch closes when it holds
`batch_max_messages` messages or `batch_max_bytes` bytes, or `linger_ms` after its first
message. Closed batches enter one ordered outbox (under the same lock that fills them, so
send order is batch order) and one sender thread streams them. At most `max_inflight`
batches wait for receipts and as many more wait in the outbox; then `send_async` blocks
(the backpressure), except on the receipt thread: a callback may produce without
deadlock. A receipt arrives after the broker's fsync and resolves every message of its
batch with its MessageId, in send order; `send` is `send_async` + flush + wait.
Partitioned topics route by crc32c(key) % partitions, keyless messages round-robin.

Idempotent producing (`idempotent=True`, the default; source/ledger/dedup.py has the
broker's rules): each stream starts by attaching the producer to each of its topics, which
gives it a unique name from the broker when it has none (a `producer_name` the user gives is
stable: the broker answers the highest sequence id it stored for it, and this producer goes
on after it). Messages get sequence ids per partition, 1, 2, ...; a batch carries its
first. When the stream breaks (broker restart, lost lease, moved topic: any retriable
error, or a receipt with one) the producer reconnects by itself (looked up again through the
client's open path, with backoff, within the client's `operation_timeout`), attaches with
the same name and resends every batch without a receipt, in order: the broker acknowledges
the ones it had stored as duplicates (with their original ids), so nothing is stored twice
and order holds. A batch fails only once it has been resent for `operation_timeout`, or on
a non-retriable error. Without idempotence a resend may store a batch twice.
With `compression_type` "lz4" or "zstd" each payload is compressed before it is batched (the
broker stores it as sent; every client decompresses it: source/client/compression.py).
Options and message fields are checked before anything is queued: a bad one raises
`InvalidArgument` (`MessageTooBig` above MAX_MESSAGE_SIZE) in the caller.
"""
from __future__ import annotations

import enum
import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Final, TypedDict, TypeVar, cast

import google_crc32c
import grpc

from shadowtopic import failpoints
from shadowtopic.client.compression import codec, compressor
from shadowtopic.client.connection import Connection
from shadowtopic.client.retry import Backoff, Deadline
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.policies import MAX_BATCH_MESSAGES, MAX_MESSAGE_SIZE
from shadowtopic.pb.v1 import producer_pb2

Callback = Callable[[MessageId | None, Exception | None], None]
#: a batch's outcome: (its messages' tokens, ledger id, first entry id, partition, error)
Settle = Callable[[list[object], int, int, int, Exception | None], None]
#: a batch stays below gRPC's 64 MiB frame even with one more maximal message in it
MAX_BATCH_BYTES = 32 << 20
_INT64 = 1 << 63
N = TypeVar("N", int, float)


def _option(name: str, value: N, low: float, high: float,
            kinds: tuple[type, ...] = (int,)) -> N:
    if not isinstance(value, kinds) or isinstance(value, bool) or not low <= value <= high:
        raise errors.InvalidArgument(f"{name} must be a number in {low}..{high}, got {value!r}")
    return value


def _as_bytes(name: str, value: bytes | str | bytearray | memoryview) -> bytes:
    if type(value) is bytes:
        return value
    if isinstance(value, str):
        try:
            return value.encode()
        except UnicodeEncodeError:
            raise errors.InvalidArgument(f"{name} is not valid unicode") from None
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise errors.InvalidArgument(f"{name} must be bytes or str, got {type(value).__name__}")


def _check_extras(properties: dict[str, str] | None, event_time: int) -> None:
    if properties is not None and not (isinstance(properties, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in properties.items())):
        raise errors.InvalidArgument("properties must map strings to strings")
    if event_time.__class__ is not int or not -_INT64 <= event_time < _INT64:
        raise errors.InvalidArgument(f"event_time must be ms since the epoch (an int64), "
                                     f"got {event_time!r}")


class _Wake(enum.Enum):
    WAKE = 0


_WAKE: Final = _Wake.WAKE  # put in the outbox: "batches wait to be resent"


class ProducerOptions(TypedDict, total=False):
    """The options `Client.create_producer` passes on to `Producer`."""
    batch_max_messages: int
    batch_max_bytes: int
    linger_ms: float
    max_inflight: int
    idempotent: bool
    compression_type: str


class _Batch:
    """Messages are built in place inside the request that will carry them (no copies)."""

    __slots__ = ("request", "add", "partition", "callbacks", "size", "created", "retry_until")

    def __init__(self, topic: str, partition: int, producer_name: str):
        self.request = producer_pb2.ProduceRequest(topic=topic, producer_name=producer_name)
        self.add = self.request.messages.add
        self.partition = partition
        self.callbacks: list[object] = []  # the messages' tokens (callbacks: send_async's)
        self.size = 0
        self.created = time.monotonic()
        self.retry_until: float | None = None  # set when a stream broke under it


class _Stream:
    """One Produce stream: its requests, its call, and the answers to its attach requests."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.requests: queue.SimpleQueue[producer_pb2.ProduceRequest | None] = queue.SimpleQueue()
        self.attach_answers: queue.SimpleQueue[producer_pb2.ProduceReceipt | Exception] = (
            queue.SimpleQueue())
        self.attaching = 0
        self.cancelled = False
        requests = self.requests

        def gen() -> Iterator[producer_pb2.ProduceRequest]:
            while True:
                item = requests.get()
                if item is None:
                    return
                yield item

        self.call = conn.producer.Produce(gen())

    def close(self, cancel: bool = True) -> None:
        self.requests.put(None)
        if cancel:
            self.cancelled = True
            self.call.cancel()


class Producer:
    def __init__(self, conn: Connection, topic: str, partitions: int = 0,
                 producer_name: str = "", batch_max_messages: int = 1000,
                 batch_max_bytes: int = 1 << 20, linger_ms: float = 5.0,
                 max_inflight: int = 8, idempotent: bool = True,
                 compression_type: str = "none",
                 reopen: Callable[[Callable[[Connection, Deadline], _Stream]], _Stream]
                 | None = None,
                 deadline: Deadline | None = None):
        """`reopen(connect)`: the client's open path (lookup, retries within the operation
        timeout) calling `connect(conn, deadline)`; used to reconnect after a broken stream.
        With `idempotent` (the default) the producer attaches now (within `deadline`)."""
        self.topic = topic
        self.partitions = partitions
        self.producer_name = producer_name
        self.idempotent = bool(idempotent)
        self._conn = conn
        self._reopen = reopen
        self._max_msgs = _option("batch_max_messages", batch_max_messages, 1,
                                 MAX_BATCH_MESSAGES)
        self._max_bytes = _option("batch_max_bytes", batch_max_bytes, 1, MAX_BATCH_BYTES)
        self._linger = _option("linger_ms", linger_ms, 0, 60_000, (int, float)) / 1000.0
        _option("max_inflight", max_inflight, 1, 10_000)
        self._codec = codec(compression_type)
        self._compress = compressor(self._codec)
        self._topics = ([topic] if partitions == 0 else
                        [f"{topic}-partition-{i}" for i in range(partitions)])
        self._lock = threading.Lock()           # open batches, sequence ids
        self._opened = threading.Condition(self._lock)  # a batch opened (the linger thread)
        self._send_lock = threading.Lock()      # in-flight order == stream order
        self._idle = threading.Condition(self._send_lock)
        self._batches: dict[int, _Batch] = {}
        self._outbox: queue.SimpleQueue[_Batch | _Wake | None] = queue.SimpleQueue()
        self._max_queued = max_inflight
        self._queued = 0                         # closed batches not yet on the stream
        self._room = threading.Condition()       # signalled when _queued drops
        self._unacked = 0                        # closed batches without a receipt yet
        self._inflight: deque[tuple[int, _Batch]] = deque()
        self._tosend: deque[_Batch] = deque()    # taken from the outbox or to resend, in order
        self._window = threading.Semaphore(max_inflight)
        self._request_ids = itertools.count(1)
        self._rr = itertools.count()
        self._seqs: dict[int, int] = {}         # partition (-1: none) -> its next sequence id
        self._sent = 0
        self._acked = 0
        self._failed = 0
        self._settle: Settle = self._call_back   # what a batch's outcome goes to
        self._breaks = 0                         # streams broken since the last receipt
        self._backoff = Backoff()                # between reconnects that break at once
        self._last_error: Exception | None = None
        self._stream: _Stream | None = None
        self._receiver: threading.Thread | None = None
        self._closed = False
        if self.idempotent:
            self._stream = self._connect(conn, deadline or Deadline(conn.operation_timeout))
        else:
            self._seqs = {p: 1 for p in (range(partitions) if partitions else (-1,))}
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
        self.queue_message(payload, key, properties, event_time, callback)

    def settle_batches_with(self, settle: Settle) -> None:
        """Hand each batch's outcome to `settle(tokens, ledger_id, first_entry_id,
        partition, error)` at once, on the receipt thread, instead of calling each message's
        callback: `tokens` are what `queue_message` was given, in order; the message at
        index i has id (ledger_id, first_entry_id + i, partition), or all have the ids 0:0
        when ledger_id is 0 (a duplicate the broker no longer places), or `error` is set.
        The asyncio face resolves its Futures this way, a batch per crossing to its loop."""
        self._settle = settle

    def queue_message(self, payload: bytes | str, key: bytes | str | None,
                      properties: dict[str, str] | None, event_time: int,
                      token: object) -> None:
        """`send_async`, with `token` (its callback, or what `settle_batches_with`'s sink
        knows) handed back with the message's outcome."""
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
            seq = self._seqs[part]
            self._seqs[part] = seq + 1
            self._sent += 1
            m = b.add()  # attribute sets are cheaper than constructor kwargs in upb
            if self._compress is not None and payload:
                packed = self._compress(payload)
                if len(packed) < len(payload):  # else sent as it is (compression.py)
                    m.compression = self._codec
                    m.uncompressed_size = len(payload)
                    payload = packed
            m.payload = payload
            m.producer_name = self.producer_name
            m.sequence_id = seq
            if key is not None:
                m.key = key
            if properties:
                m.properties.update(properties)
            if event_time:
                m.event_time = event_time
            cbs = b.callbacks
            cbs.append(token)
            b.size += len(payload) + 24
            if len(cbs) >= self._max_msgs or b.size >= self._max_bytes:
                self._close_batch(part)

    @property
    def full(self) -> bool:
        """`send_async` would block now: `max_inflight` closed batches wait to be sent."""
        return self._queued >= self._max_queued

    def wait_for_room(self, timeout: float | None = None) -> bool:
        """Wait until `send_async` would not block (at most `timeout` seconds; None: no
        limit), or the producer closed; False when the time ran out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._room:
            while self._queued >= self._max_queued and not self._closed:
                left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                if left <= 0:
                    return False
                self._room.wait(left)
        return True

    def _wait_for_room(self) -> None:
        if threading.current_thread() is self._receiver:
            return  # a callback producing: never block the thread that frees room
        self.wait_for_room()

    def _new_batch(self, part: int) -> _Batch:
        topic = self.topic if self.partitions == 0 else f"{self.topic}-partition-{part}"
        b = self._batches[part] = _Batch(topic, part, self.producer_name)
        if self.idempotent:
            b.request.sequence_id = self._seqs[part]
        if len(self._batches) == 1:  # the linger thread may be waiting for one
            self._opened.notify()
        return b

    def send(self, payload: bytes | str, key: bytes | str | None = None,
             properties: dict[str, str] | None = None, event_time: int = 0,
             timeout: float | None = None) -> MessageId:
        """Send and wait for the receipt: by default up to the client's `timeout` plus its
        `operation_timeout` (the time a reconnect and resend may take)."""
        done = threading.Event()
        out: list[tuple[MessageId | None, Exception | None]] = []

        def cb(mid: MessageId | None, exc: Exception | None) -> None:
            out.append((mid, exc))
            done.set()

        self.send_async(payload, key, properties, event_time, callback=cb)
        self.flush_nowait()
        if not done.wait(timeout or self.receipt_wait_s):
            raise errors.Timeout("no receipt from the broker in time")
        mid, exc = out[0]
        if exc is not None:
            raise exc
        assert mid is not None  # (a callback gets an id or an error)
        return mid

    @property
    def receipt_wait_s(self) -> float:
        """How long `send` and `flush` wait by default: the client's `timeout` plus its
        `operation_timeout` (the time a reconnect and resend may take)."""
        return self._conn.timeout + self._conn.operation_timeout

    def stats(self) -> dict[str, int]:
        """Counters since creation: messages sent, acknowledged (after the broker's fsync),
        failed (their callbacks got an error), and batches still waiting for a receipt."""
        with self._idle:
            return {"sent": self._sent, "acked": self._acked, "failed": self._failed,
                    "pending_batches": self._unacked}

    def flush(self, timeout: float | None = None) -> None:
        """Send every open batch and wait for all receipts (by default as long as `send`)."""
        self.flush_nowait()
        deadline = time.monotonic() + (timeout or self.receipt_wait_s)
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
            with self._opened:
                self._opened.notify()
            self._outbox.put(None)
            self._sender.join(10)
            with self._send_lock:
                stream, self._stream = self._stream, None
            if stream is not None:
                stream.close(cancel=False)  # half-close: the broker ends the stream
            if self._receiver is not None:
                self._receiver.join(10)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals -------------------------------------------------------------------------

    def _route(self, key: bytes | None) -> int:
        if key is None:
            return next(self._rr) % self.partitions
        crc: int = google_crc32c.value(key)  # (google_crc32c has no stubs)
        return crc % self.partitions

    def _close_batch(self, part: int) -> None:
        """Move a partition's open batch to the outbox (caller holds self._lock)."""
        b = self._batches.pop(part)
        with self._idle:
            self._unacked += 1
            self._queued += 1
        self._outbox.put(b)

    def flush_nowait(self) -> None:
        """Close every open batch now (not `linger_ms` later) and hand it to the sender;
        nothing waits for receipts."""
        with self._lock:
            for part in list(self._batches):
                self._close_batch(part)

    def _linger_loop(self) -> None:
        """Close each open batch `linger_ms` after its first message. Sleeps while no batch
        is open (it used to wake every `linger_ms` regardless: a thousand idle producers with
        linger_ms=1 were a million wakeups a second, and linger_ms=0 spun)."""
        with self._lock:
            while not self._closed:
                if not self._batches:
                    self._opened.wait()  # `_new_batch` or `close` wakes it
                    continue
                now = time.monotonic()
                due = min(b.created for b in self._batches.values()) + self._linger
                if due > now:
                    self._opened.wait(due - now)
                    continue
                for part in [p for p, b in self._batches.items()
                             if now - b.created >= self._linger]:
                    self._close_batch(part)

    def _send_loop(self) -> None:
        while True:
            item = self._outbox.get()
            if item is None:
                return
            if item is not _WAKE:
                # the window's permits may be held by batches waiting to be resent, which
                # only this thread resends: resend them while waiting for one
                while not self._window.acquire(timeout=0.05):
                    if self._tosend:
                        self._pump()
                with self._room:
                    self._queued -= 1
                    self._room.notify_all()
                with self._send_lock:
                    self._tosend.append(item)
            self._pump()

    def _pump(self) -> None:
        """Put every batch waiting in `_tosend` on the stream, in order, (re)connecting first
        when there is none. Sender thread only."""
        for _attempt in range(1000):  # each pass sends or connects; a connect is bounded
            with self._send_lock:
                if not self._tosend:
                    return
                stream = self._stream
                if stream is not None:
                    now = time.monotonic()
                    expired = []
                    while self._tosend:
                        b = self._tosend.popleft()
                        if b.retry_until is not None and now > b.retry_until:
                            expired.append(b)  # resent for longer than operation_timeout
                            continue
                        rid = next(self._request_ids)
                        b.request.request_id = rid
                        self._inflight.append((rid, b))
                        stream.requests.put(b.request)
                    break
            if not self._reconnect():
                return
        else:
            return
        if expired:
            self._fail_batches(expired, self._last_error
                               or errors.Timeout("produce: operation timeout passed"))

    def _reconnect(self) -> bool:
        """Open a new stream (looked up again through the client, attached with the same
        producer name); on failure fail every batch waiting to be sent."""
        if self._closed and not self._unacked:
            return False
        if self._breaks > 1:  # broke again right after a reconnect: back off
            time.sleep(self._backoff.pause())
        try:
            if self._reopen is not None and self._breaks:
                stream = self._reopen(self._connect)
            else:
                stream = self._conn.retry.run(lambda d: self._connect(self._conn, d))
        except errors.ShadowTopicError as exc:
            self._fail_waiting(exc)
            return False
        with self._send_lock:
            self._stream = stream
        return True

    def _connect(self, conn: Connection, deadline: Deadline) -> _Stream:
        """A new stream on `conn`, attached (idempotent producing: the producer's name and,
        on the first connect, where each partition's sequence ids go on); its receiver
        thread running."""
        stream = _Stream(conn)
        # (a local count: the receiver thread counts `stream.attaching` down as answers come)
        attaching = self._topics if self.idempotent else []
        stream.attaching = len(attaching)
        self._receiver = threading.Thread(target=self._receive, args=(stream,), daemon=True,
                                          name="producer-receipts")
        self._receiver.start()
        try:
            answers = []
            for t in attaching:
                stream.requests.put(producer_pb2.ProduceRequest(
                    topic=t, producer_name=self.producer_name, attach=True))
            failpoints.hit("producer.attach_sent")
            for _t in attaching:
                try:
                    got = stream.attach_answers.get(timeout=deadline.budget(conn.timeout))
                except queue.Empty:
                    raise errors.Timeout("no answer to the producer's attach in time") from None
                if isinstance(got, Exception):
                    raise got
                if got.HasField("error"):
                    e = got.error
                    err = errors.from_reason(e.reason, e.message, e.code)
                    if err.retriable:
                        raise err
                    if isinstance(err, errors.ProducerBusy):
                        if not self._seqs:  # creating: another live producer has the name
                            raise err
                        # reconnecting: the broker has not yet seen our old stream end
                        raise errors.ServiceUnavailable(f"{err}; trying again") from None
                    # refused for good (a read-only shadow, ...): the sends say so, as the
                    # broker refuses each of them
                    got = producer_pb2.ProduceReceipt(producer_name=self.producer_name)
                answers.append(got)
        except BaseException:
            stream.close()
            raise
        if answers:
            self.producer_name = next((a.producer_name for a in answers if a.producer_name),
                                      self.producer_name)
            if not self._seqs:  # the first connect: go on after what the broker stored
                parts = range(self.partitions) if self.partitions else (-1,)
                self._seqs = {p: a.last_sequence_id + 1
                              for p, a in zip(parts, answers, strict=True)}
        self._conn = conn
        return stream

    def _receive(self, stream: _Stream) -> None:
        try:
            for receipt in stream.call:
                if stream.attaching:
                    stream.attaching -= 1
                    stream.attach_answers.put(receipt)
                    continue
                with self._send_lock:
                    if self._stream is not stream or not self._inflight:
                        return
                    rid, batch = self._inflight.popleft()
                if receipt.HasField("error") and _retriable(receipt):
                    e = receipt.error  # the topic moved or is reloading: resend from here
                    self._break(stream, errors.from_reason(e.reason, e.message, e.code), batch)
                    return
                if self._breaks:
                    self._breaks = 0
                    self._backoff.reset()
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
            # Multiplexer.close in stream.py for the hang that caused)
            exc.__traceback__ = None
            if stream.attaching:
                stream.attach_answers.put(err)
            if not stream.cancelled:
                self._break(stream, err)
            return
        if stream.attaching:
            stream.attach_answers.put(errors.ConnectError("produce stream ended"))
        self._break(stream, errors.ConnectError("produce stream ended"))

    def _break(self, stream: _Stream, err: errors.ShadowTopicError,
               head: _Batch | None = None) -> None:
        """`stream` broke (or answered a temporary error for `head`): its batches without a
        receipt go back, in order, before those not sent yet, to be resent on a new stream
        within the operation timeout; a non-temporary error fails them."""
        with self._send_lock:
            if self._stream is not stream:
                return
            self._stream = None
            moved = ([head] if head is not None else []) + [b for _, b in self._inflight]
            self._inflight.clear()
            self._tosend.extendleft(reversed(moved))
            self._last_error = err
            until = time.monotonic() + self._conn.operation_timeout
            for b in moved:
                if b.retry_until is None:
                    b.retry_until = until
        stream.close()
        self._breaks += 1
        if self._closed and not moved:
            return
        if not err.retriable:
            self._fail_waiting(err)
            return
        self._outbox.put(_WAKE)

    def _fail_waiting(self, err: Exception) -> None:
        """Fail every batch waiting to be (re)sent, and those in the outbox (they would meet
        the same broker: a new send tries again)."""
        with self._send_lock:
            failed = list(self._tosend)
            self._tosend.clear()
        self._fail_batches(failed, err)
        queued = []
        while True:
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._outbox.put(None)  # closing: the sender still ends
                break
            if item is not _WAKE:
                queued.append(item)
        if queued:
            with self._room:
                self._queued -= len(queued)
                self._room.notify_all()
            self._fail_batches(queued, err, holds_window=False)

    def _fail_batches(self, batches: list[_Batch], err: Exception,
                      holds_window: bool = True) -> None:
        with self._idle:
            self._unacked -= len(batches)
            self._failed += sum(len(b.callbacks) for b in batches)
            self._idle.notify_all()
        for batch in batches:
            self._settle(batch.callbacks, 0, 0, batch.partition, err)
            if holds_window:
                self._window.release()

    def _resolve(self, batch: _Batch, receipt: producer_pb2.ProduceReceipt) -> bool:
        if receipt.HasField("error"):
            e = receipt.error
            err = errors.from_reason(e.reason, e.message, e.code)
            self._settle(batch.callbacks, 0, 0, batch.partition, err)
            return False
        # a duplicate (a resend of a stored batch) carries its original's ids (0:0 when the
        # broker no longer knows them: stored once, where is unknown)
        self._settle(batch.callbacks, receipt.ledger_id, receipt.first_entry_id,
                     batch.partition, None)
        return True

    @staticmethod
    def _call_back(tokens: list[object], lid: int, entry: int, part: int,
                   err: Exception | None) -> None:
        """The default `settle`: each message's callback (send_async's tokens)."""
        if err is not None:
            for cb in tokens:
                if cb is not None:
                    cast(Callback, cb)(None, err)
            return
        new = tuple.__new__
        for cb in tokens:
            if cb is not None:
                cast(Callback, cb)(new(MessageId, (lid, entry, part)), None)
            entry += 1 if lid else 0


def _retriable(receipt: producer_pb2.ProduceReceipt) -> bool:
    e = receipt.error
    return errors.from_reason(e.reason, e.message, e.code).retriable
