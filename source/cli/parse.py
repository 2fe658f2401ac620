"""Parsing of CLI values: sizes (10M, 1G), durations (30s, 5m, 2h, 7d), k=v pairs, booleans,
counts and seconds. A bad value raises ArgumentTypeError, which argparse reports."""
from __future__ import annotations

import argparse
import re

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
