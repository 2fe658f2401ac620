"""The arguments of a broker that applies disk policies quickly (ARGS: maintenance twice a
second, short leases; the `quick_broker` fixture in tests/test_integration/conftest.py), and
the subscription stats the disk policy tests read."""
from __future__ import annotations

from shadowtopic.client import Client

ARGS = ["--lease-ttl", "3", "--retention-interval", "0.5"]


def sub_stats(c: Client, topic: str, name: str) -> dict:
    return c.admin.stats(topic)["subscriptions"].get(name, {})


def backlog(c: Client, topic: str, name: str) -> int:
    return int(sub_stats(c, topic, name).get("msgBacklog", -1))


def payload(i: int) -> bytes:
    return f"m{i:03d}".encode() * 25  # 100 bytes
