"""Producing numbered messages (`m0`, `m1`, ...; keyed round-robin over `keys` keys when
asked) to a topic through a real broker."""
from __future__ import annotations

from shadowtopic.client import Client


def produce(client: Client, topic: str, n: int, prefix: str = "m", keys: int = 0) -> list:
    ids = []
    with client.create_producer(topic) as p:
        for i in range(n):
            ids.append(p.send(f"{prefix}{i}".encode(),
                              key=f"k{i % keys}" if keys else None))
    return ids
