"""Individual acknowledgements on their way up the Consumer.Connect stream, and ack receipts.

Grouping (`PendingAcks`, one per `stream.Multiplexer`): `Consumer.acknowledge` only queues
the message's position, packed as `ledger_id << 64 | entry_id`, under its handle. When the
stream's request thread next builds a `ClientMessage`, each handle's queued positions become
ONE `Ack` command whose `ranges` (consumer.proto's `AckRange`: ledger, first entry, last
entry, inclusive) are the positions sorted, duplicates dropped and consecutive entries of a
ledger coalesced (`coalesce`), no range longer than `MAX_ACK_RANGE` entries (2^20: the
broker refuses longer ones). A Shared consumer gets its entries in runs (20 in a row by
default), so its acks of a run go up as one range, not one id each. Handles acking the same
ranges (one broadcast message, many subscriptions of one stream) share a command (`also`).
No `ids` are sent: brokers take both forms, and old clients' `ids` still work.

Receipts (`AckReceipts`, one per consumer; `ack_receipt=True` on `Client.subscribe`): an
acknowledgement that wants one goes up at once as its own `Ack` with a `request_id` (unique
in the process), not grouped. The broker answers with `Event.ack_receipt` once the ack is
applied and its subscription's cursor written to storage, or with a `warning` whose details
carry `command` = "ack" and the `request_id` when it refused the ack. Each waiting ack's
callback is called exactly once: with None (applied), the typed refusal, or the error that
ended the wait (the handle ended or reconnects, the consumer closed: the ack may or may not
have been applied then). Callbacks run on whichever thread answers (usually the stream's
receive thread, with the consumer's lock held): they must be quick and must not block.
"""
from __future__ import annotations

import enum
import itertools
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Final

from shadowtopic.core import errors
from shadowtopic.core.message_id import MAX_ACK_RANGE
from shadowtopic.pb.v1 import consumer_pb2

log = logging.getLogger(__name__)

_MASK = (1 << 64) - 1
#: request ids of acks that want a receipt, unique in the process (0 means "no receipt")
_REQUESTS = itertools.count(1)
#: what a receipt's callback is given: None once the broker applied the ack, else why not
ReceiptCallback = Callable[[errors.ShadowTopicError | None], None]


class Marker(enum.Enum):
    ACKS = 0


ACKS: Final = Marker.ACKS  # in a stream's request queue: "send the grouped acks here"
#: what a stream's request queue holds (then None: the end)
Request = consumer_pb2.ClientCommand | Marker


def coalesce(positions: Iterable[int], limit: int = MAX_ACK_RANGE
             ) -> list[tuple[int, int, int]]:
    """Packed positions (`ledger << 64 | entry`, any order, duplicates allowed) as sorted
    `(ledger, first_entry, last_entry)` ranges, inclusive, of consecutive entries of one
    ledger, each at most `limit` entries long."""
    out: list[tuple[int, int, int]] = []
    ps = sorted(positions)
    if not ps:
        return out
    first = last = ps[0]
    for p in ps:
        if p == last + 1 and p - first < limit:  # (ids never reach 2^64-1: same ledger)
            last = p
        elif p != last:  # (a duplicate of the last one is dropped)
            out.append((first >> 64, first & _MASK, last & _MASK))
            first = last = p
    out.append((first >> 64, first & _MASK, last & _MASK))
    return out


def ranges_pb(ranges: Iterable[tuple[int, int, int]]) -> list[consumer_pb2.AckRange]:
    return [consumer_pb2.AckRange(ledger_id=ledger, first_entry=a, last_entry=b)
            for ledger, a, b in ranges]


def one_range(ledger: int, entry: int) -> list[consumer_pb2.AckRange]:
    """The `ranges` of an Ack of one message."""
    return [consumer_pb2.AckRange(ledger_id=ledger, first_entry=entry, last_entry=entry)]


class PendingAcks:
    """Individual acks waiting for the request thread, by handle (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._acks: dict[int, list[int]] = {}

    def add(self, handle: int, ledger: int, entry: int) -> bool:
        """Queue an ack; True when the caller must put an `ACKS` marker in the queue (the
        first ack since the last expansion)."""
        with self._lock:
            first = not self._acks
            queued = self._acks.get(handle)
            if queued is None:
                self._acks[handle] = [(ledger << 64) + entry]
            else:
                queued.append((ledger << 64) + entry)
            return first

    def commands(self) -> list[consumer_pb2.ClientCommand]:
        """Every queued ack, taken: one Ack command per set of ranges (`also` lists the
        other handles acking the same ones)."""
        with self._lock:
            pending, self._acks = self._acks, {}
        same: dict[tuple[tuple[int, int, int], ...], list[int]] = {}
        for h, ps in pending.items():
            same.setdefault(tuple(coalesce(ps)), []).append(h)
        return [consumer_pb2.ClientCommand(handle=hs[0], also=hs[1:],
                                           ack=consumer_pb2.Ack(ranges=ranges_pb(key)))
                for key, hs in same.items()]

    def expand(self, batch: list[Request]) -> list[consumer_pb2.ClientCommand]:
        """The batch with its `ACKS` marker replaced by the queued acks' commands."""
        out: list[consumer_pb2.ClientCommand] = []
        for item in batch:
            if isinstance(item, Marker):
                out += self.commands()
            else:
                out.append(item)
        return out


class AckReceipts:
    """Acks sent with a `request_id`, waiting for the broker's answer (thread-safe): each
    callback is called once, outside this object's lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[int, ReceiptCallback]] = {}  # id -> (handle, callback)

    def add(self, handle: int, callback: ReceiptCallback) -> int:
        """Wait for a receipt on `handle`; returns the request id to send."""
        request_id = next(_REQUESTS)
        with self._lock:
            self._waiting[request_id] = (handle, callback)
        return request_id

    def answer(self, request_id: int, error: errors.ShadowTopicError | None) -> bool:
        """The broker answered `request_id` (None: applied); False when nobody waits for it
        (answered already, given up, or not this consumer's)."""
        with self._lock:
            waiting = self._waiting.pop(request_id, None)
        if waiting is None:
            return False
        _call(waiting[1], error)
        return True

    def fail(self, error: errors.ShadowTopicError, handle: int | None = None) -> None:
        """No receipt will come for the acks waiting on `handle` (None: on any handle)."""
        with self._lock:
            ids = [r for r, (h, _cb) in self._waiting.items() if handle is None or h == handle]
            failed = [self._waiting.pop(r) for r in ids]
        for _h, callback in failed:
            _call(callback, error)

    def __len__(self) -> int:
        return len(self._waiting)


def _call(callback: ReceiptCallback, error: errors.ShadowTopicError | None) -> None:
    try:
        callback(error)
    except Exception:  # noqa: BLE001 - a user callback must not break the stream
        log.exception("ack receipt callback failed")


def wait_for_receipt(send: Callable[[ReceiptCallback], None], timeout: float,
                     what: str) -> None:
    """Call `send(callback)` (which arranges for `callback` to be called once) and wait up to
    `timeout` seconds for it; raise the error it was given, or `Timeout`."""
    done = threading.Event()
    result: list[errors.ShadowTopicError | None] = []

    def callback(error: errors.ShadowTopicError | None) -> None:
        result.append(error)
        done.set()

    send(callback)
    if not done.wait(timeout):
        raise errors.Timeout(f"{what}: no receipt from the broker within {timeout:g}s "
                             f"(the ack may still be applied)")
    if result[0] is not None:
        raise result[0]
