"""Producing to a topic through a real broker: numbered messages (`m0`, `m1`, ...; keyed
round-robin over `keys` keys when asked) one receipt at a time (`produce`), or any messages
without waiting for each receipt before the next send (`send_pipelined`)."""
from __future__ import annotations

from shadowtopic.client import Client


def produce(client: Client, topic: str, n: int, prefix: str = "m", keys: int = 0) -> list:
    ids = []
    with client.create_producer(topic) as p:
        for i in range(n):
            ids.append(p.send(f"{prefix}{i}".encode(),
                              key=f"k{i % keys}" if keys else None))
    return ids


def send_pipelined(producer, items: list) -> list:
    """Send `items` (values, or (key, value) pairs) with `send_async`, then flush: the
    producer batches them, and each is still an entry, with an id, of its own. Their ids, in
    order, once every one is acknowledged (an AssertionError names the first failure)."""
    ids: list = [None] * len(items)
    failed: list[BaseException] = []

    def receipt(i: int):
        def done(mid, exc) -> None:
            if exc is not None:
                failed.append(exc)
            ids[i] = mid
        return done

    for i, item in enumerate(items):
        key, value = item if isinstance(item, tuple) else (None, item)
        producer.send_async(value, key=key, callback=receipt(i))
    producer.flush()
    assert not failed and None not in ids, failed[:1]
    return ids
