"""Client and consumer options as users spell them, checked before anything is sent.

Client timeouts (`Client(url, timeout=30.0, operation_timeout=None)`):

- `timeout`: the longest one call to a broker may take (a gRPC deadline), and the longest
  a consumer or reader waits for the broker to answer its subscribe, seek or close.
- `operation_timeout` (default: `timeout`, so 30 s as Pulsar's `operationTimeout`): how long
  opening a producer, consumer or reader, and an admin call, keep retrying temporary errors
  (a broker restarting, a topic reloading or changing owner) before raising the last one.
  Retrying is source/client/retry.py's.
"""
from __future__ import annotations

from collections.abc import Callable

from shadowtopic.core import errors
from shadowtopic.pb.v1 import consumer_pb2

MAX_NACK_DELAY_MS = (1 << 32) - 1
DEFAULT_TIMEOUT_S = 30.0

#: accepted spellings (case-insensitive) -> (canonical name, wire enum)
_TYPES = {
    "exclusive": ("exclusive", consumer_pb2.EXCLUSIVE),
    "shared": ("shared", consumer_pb2.SHARED),
    "failover": ("failover", consumer_pb2.FAILOVER),
    "key_shared": ("key_shared", consumer_pb2.KEY_SHARED),
    "key-shared": ("key_shared", consumer_pb2.KEY_SHARED),
    "keyshared": ("key_shared", consumer_pb2.KEY_SHARED),
}
CONSUMER_TYPES = ("exclusive", "shared", "failover", "key_shared")


def parse_consumer_type(consumer_type: str) -> tuple[str, consumer_pb2.SubscriptionType]:
    """("shared", consumer_pb2.SHARED) for "shared", "Shared", "SHARED", ...;
    `InvalidArgument` for anything that is not one of the four types."""
    found = _TYPES.get(consumer_type.strip().lower()) if isinstance(consumer_type, str) else None
    if found is None:
        raise errors.InvalidArgument(f"consumer type must be one of {', '.join(CONSUMER_TYPES)}"
                                     f", got {consumer_type!r}")
    return found


def check_options(consumer_name: str, receiver_queue_size: int, priority: int,
                  negative_ack_redelivery_delay_ms: int,
                  on_active_change: Callable[[bool], None] | None = None) -> None:
    """`InvalidArgument` unless every consumer option is of its type and range."""
    for name, value, low, high in [
            ("receiver_queue_size", receiver_queue_size, 1, (1 << 32) - 1),
            ("priority", priority, -(1 << 31), (1 << 31) - 1),
            ("negative_ack_redelivery_delay_ms", negative_ack_redelivery_delay_ms, 0,
             MAX_NACK_DELAY_MS)]:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise errors.InvalidArgument(f"{name} must be an integer in {low}..{high}, "
                                         f"got {value!r}")
    if not isinstance(consumer_name, str):
        raise errors.InvalidArgument(f"consumer_name must be a string, got {consumer_name!r}")
    if on_active_change is not None and not callable(on_active_change):
        raise errors.InvalidArgument("on_active_change must be callable")


def check_max_messages(max_messages: int) -> None:
    """A batch receive's `max_messages`: an integer of at least 1, else `InvalidArgument`."""
    if not isinstance(max_messages, int) or isinstance(max_messages, bool) or max_messages < 1:
        raise errors.InvalidArgument(f"max_messages must be an integer >= 1, "
                                     f"got {max_messages!r}")


def operation_timeout(value: float | None, timeout: float) -> float:
    """The client's operation timeout: `value` in seconds (a positive number), or `timeout`
    when None; `InvalidArgument` for anything else."""
    if value is None:
        return timeout
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < 1e9:
        raise errors.InvalidArgument(f"operation_timeout must be a number of seconds > 0, "
                                     f"got {value!r}")
    return float(value)
