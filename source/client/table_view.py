"""A table view of a topic: the latest value of every key, kept current (Pulsar's TableView,
Kafka Streams' KTable, NATS KV).

    with client.table_view("prices") as prices:
        prices.get("AAPL")                 # the key's latest Message, or None
        prices.for_each_and_listen(lambda key, msg: print(key, msg and msg.value()))

`Client.table_view(topic)` returns once the view holds every key up to the last message
that existed when it was called, on every partition: it reads the topic's compacted view
from the start (the latest message of each key up to the compaction horizon, then every
message after it) with a `read_compacted` reader, until it reached the last id a compacted
reader could read at that moment. One thread of the view's own then follows the topic:

- a keyed message replaces its key's value (the `Message`: payload, properties, id);
- a delete (a keyed message with an empty payload, a tombstone) removes the key, and
  listeners get `(key, None)`;
- a keyless message is not part of any table and is skipped.

Keys are text (`str`; bytes that are not UTF-8 round-trip through "surrogateescape");
`get` takes `str` or `bytes`. Listeners are called on the view's thread, in topic order per
partition, never for the same key concurrently; a listener that raises is logged and the view
goes on. The reader reconnects by itself (broker restart, moved topic) and a compaction while
the view follows changes nothing it sees: it is past the horizon. `refresh()` waits until the
view has read what exists now (read-your-writes after a `send`).

The view fails (every later call raises the error) when its reader does: the topic deleted,
or reconnecting failed past the client's operation timeout. It never goes on silently stale.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from shadowtopic.client.message import Message
from shadowtopic.client.reader import Reader
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId

log = logging.getLogger(__name__)

Listener = Callable[[str, "Message | None"], None]
READ_SLICE_S = 0.1  # the follower's read timeout: how soon it notices a close or a waiter
WAIT_SLICE_S = 0.2  # a blocked caller wakes this often, so Ctrl-C interrupts it promptly


def _text(key: bytes) -> str:
    return key.decode("utf-8", "surrogateescape")


def _key(key: str | bytes) -> str:
    if isinstance(key, bytes):
        return _text(key)
    if isinstance(key, str):
        return key
    raise errors.InvalidArgument(f"a table view's key is str or bytes, got {type(key).__name__}")


class TableView:
    """Use `Client.table_view`. Holds the reader it follows and closes it with itself."""

    def __init__(self, reader: Reader, timeout: float | None):
        self.topic = reader.topic
        self._reader = reader
        self._data: dict[str, Message] = {}
        self._lock = threading.RLock()  # held while a message is applied and announced
        self._cond = threading.Condition(self._lock)
        self._listeners: list[Listener] = []
        self._read: dict[int, MessageId] = {}  # partition index -> last id applied
        self._targets: list[dict[int, MessageId]] = []  # what waiting callers wait for
        self._drained = 0   # bumped each time the follower found nothing more to read
        self._error: errors.ShadowTopicError | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._follow, daemon=True,
                                        name=f"table-view-{self.topic}")
        self._thread.start()
        try:
            self.refresh(timeout)
        except BaseException:
            self.close()
            raise

    # ---- the follower thread ------------------------------------------------------------

    def _follow(self) -> None:
        reader = self._reader
        while not self._closed:
            try:
                msg = reader.read_next(timeout=READ_SLICE_S)
            except errors.Timeout:
                self._idle()
                continue
            except errors.AlreadyClosed:
                break
            except errors.ShadowTopicError as exc:
                self._fail(exc)
                break
            self._apply(msg)
        with self._cond:
            self._cond.notify_all()

    def _apply(self, msg: Message) -> None:
        mid = msg.message_id
        with self._cond:
            self._read[mid.partition] = mid
            if msg.key is not None:
                key = _text(msg.key)
                value: Message | None = msg
                if msg.is_tombstone:
                    value = None
                    self._data.pop(key, None)
                else:
                    self._data[key] = msg
                for listener in list(self._listeners):
                    self._announce(listener, key, value)
            if self._targets:
                self._cond.notify_all()

    def _idle(self) -> None:
        """Nothing came within a slice: when a caller waits, ask the broker whether anything
        is left to read (an id a compacted reader never gets, such as a delete past its
        retention, must not keep the caller waiting)."""
        with self._cond:
            waiting = bool(self._targets)
        if not waiting:
            return
        try:
            more = self._reader.has_message_available()
        except errors.AlreadyClosed:
            return
        except errors.ShadowTopicError as exc:
            if not exc.retriable:
                self._fail(exc)
            return
        if not more:
            with self._cond:
                self._drained += 1
                self._cond.notify_all()

    def _fail(self, exc: errors.ShadowTopicError) -> None:
        log.warning("table view of %s stopped: %s: %s", self.topic, exc.reason, exc.message)
        with self._cond:
            self._error = exc
            self._cond.notify_all()

    @staticmethod
    def _announce(listener: Listener, key: str, value: Message | None) -> None:
        try:
            listener(key, value)
        except Exception:  # noqa: BLE001 - a user's listener must not end the view
            log.exception("table view listener failed")

    # ---- waiting ------------------------------------------------------------------------

    def _reached(self, target: dict[int, MessageId]) -> bool:
        for partition, last in target.items():
            got = self._read.get(partition)
            if got is None or (got.ledger_id, got.entry_id) < (last.ledger_id, last.entry_id):
                return False
        return True

    def refresh(self, timeout: float | None = None) -> None:
        """Wait until the view has applied every message that exists now (the last id a
        compacted reader can read, on every partition). `Timeout` when it takes longer
        than `timeout` seconds (None: no limit); the view goes on following either way."""
        self._check()
        target = {m.partition: m for m in self._reader.last_message_ids()}
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._cond:
            self._targets.append(target)
            drained = self._drained
            try:
                while not self._reached(target):
                    self._check()
                    if self._drained > drained + 1:
                        # (twice: the first may have looked before the target was taken)
                        return
                    wait = WAIT_SLICE_S
                    if deadline is not None:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise errors.Timeout(f"the table view of {self.topic} did not "
                                                 f"catch up within {timeout:g}s")
                        wait = min(wait, left)
                    self._cond.wait(wait)
            finally:
                self._targets.remove(target)

    # ---- reading ------------------------------------------------------------------------

    def _check(self) -> None:
        if self._closed:
            raise errors.AlreadyClosed("table view is closed")
        if self._error is not None:
            raise self._error

    def get(self, key: str | bytes) -> Message | None:
        """The latest message of `key`, or None when the key has none (or was deleted)."""
        self._check()
        return self._data.get(_key(key))

    def __getitem__(self, key: str | bytes) -> Message:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, (str, bytes)) and self.get(key) is not None

    def __len__(self) -> int:
        self._check()
        return len(self._data)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def keys(self) -> list[str]:
        """The keys, a snapshot."""
        self._check()
        with self._lock:
            return list(self._data)

    def items(self) -> list[tuple[str, Message]]:
        """(key, latest message) pairs, a snapshot."""
        self._check()
        with self._lock:
            return list(self._data.items())

    def for_each(self, action: Listener) -> None:
        """Call `action(key, message)` for every key now (on this thread)."""
        for key, value in self.items():
            action(key, value)

    def listen(self, action: Listener) -> None:
        """Call `action(key, message)` for every change from now on (`message` None: the key
        was deleted), on the view's thread."""
        self._check_listener(action)
        with self._lock:
            self._check()
            self._listeners.append(action)

    def for_each_and_listen(self, action: Listener) -> None:
        """`for_each(action)` then `listen(action)`, with no change missed or seen twice in
        between: updates wait while `action` goes over the current keys."""
        self._check_listener(action)
        with self._lock:
            self._check()
            for key, value in list(self._data.items()):
                action(key, value)
            self._listeners.append(action)

    @staticmethod
    def _check_listener(action: object) -> None:
        if not callable(action):
            raise errors.InvalidArgument("a table view listener must be callable")

    def close(self) -> None:
        """Stop following and close the reader. Closing twice is a no-op."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._reader.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(5.0)

    def __enter__(self) -> TableView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TableView(topic={self.topic!r}, keys={len(self._data)})"
