"""Command-line value types (argparse `type=`), shared by the CLI and the server processes'
flags: sizes (10M, 1G), durations (30s, 5m, 2h, 7d), k=v pairs, booleans, counts, seconds,
points in time (10m ago, ISO 8601, ms since the epoch) and subscription types. A bad value
raises ArgumentTypeError, which argparse reports."""
from __future__ import annotations

import argparse
import re
import time
from datetime import datetime

_SIZE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_TIME = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def size(text: str) -> int:
    m = re.fullmatch(r"(-?\d+)\s*([kmgtKMGT]?)i?[bB]?", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (e.g. 512K, 10M, 1G, -1)")
    n = int(m.group(1))
    return n if n < 0 else n * _SIZE[m.group(2).lower()]


def duration(text: str) -> int:
    m = re.fullmatch(r"(-?\d+)\s*([smhdwSMHDW]?)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not a duration (e.g. 30s, 5m, 2h, 7d, -1)")
    n = int(m.group(1))
    return n if n < 0 else n * _TIME[m.group(2).lower()]


def boolean(text: str) -> bool:
    t = text.strip().lower()
    if t in ("true", "yes", "1", "on"):
        return True
    if t in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"'{text}' is not a boolean (true/false)")


def key_value(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"'{text}' is not key=value")
    k, _, v = text.partition("=")
    return k, v


def count(text: str) -> int:
    """A whole number >= 0."""
    return _at_least(text, 0)


def positive(text: str) -> int:
    """A whole number >= 1."""
    return _at_least(text, 1)


def _at_least(text: str, low: int) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if n < low:
        raise argparse.ArgumentTypeError(f"{n} is below {low}")
    return n


def seconds(text: str) -> float:
    """A number of seconds >= 0 (fractions allowed)."""
    try:
        t = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds") from None
    if not 0 <= t < float("inf"):
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds >= 0")
    return t


def time_ms(text: str, now_ms: int | None = None) -> int:
    """A point in time as ms since the epoch: a duration ago (`30s`, `10m`, `1h`, `2d`, `1w`:
    a unit is required), an ISO 8601 timestamp (`2024-05-01T12:00:00Z`; without a zone it is
    local time) or a whole number of ms since the epoch."""
    t = text.strip()
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    m = re.fullmatch(r"(\d+)\s*([smhdwSMHDW])", t)
    if m:
        return max(0, now_ms - int(m.group(1)) * _TIME[m.group(2).lower()] * 1000)
    if re.fullmatch(r"\d+", t):
        return int(t)
    try:
        when = datetime.fromisoformat(t[:-1] + "+00:00" if t[-1:] in ("Z", "z") else t)
        ms = int(when.timestamp() * 1000)
    except (ValueError, OverflowError, OSError):
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a time (e.g. 10m or 2h ago, 2024-05-01T12:00:00Z, or ms since "
            f"the epoch)") from None
    if ms < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is before 1970")
    return ms


SUBSCRIPTION_TYPES = ("exclusive", "shared", "failover", "key_shared")


def subscription_type(text: str) -> str:
    """exclusive | shared | failover | key_shared, any case (`Key_Shared`, `key-shared` too)."""
    t = text.strip().lower().replace("-", "_")
    t = "key_shared" if t == "keyshared" else t
    if t not in SUBSCRIPTION_TYPES:
        raise argparse.ArgumentTypeError(f"'{text}' is not a subscription type "
                                         f"({', '.join(SUBSCRIPTION_TYPES)})")
    return t
