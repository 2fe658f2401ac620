#!/usr/bin/env python3
"""Sustained cursor flush rate: `--subs` subscriptions keep acknowledging while one
CursorFlusher saves their cursors through a SnapshotCursorStore (files under a temp storage
root, the pointer in a real etcd, or the in-memory metadata twin with `--metadata memory`).
Prints one JSON object: saves per second, cursors per second, acks per second, save latency.

    .venv/bin/python bench/cursors.py [--subs 10000] [--seconds 10] [--interval 0] [--rate 10]

`--interval 0` flushes back to back (the ceiling); `--interval 1` is the broker's default
(then the figure that matters is `save_ms`, the cost of each one-second batch). `--rate`
rounds per second run on the same event loop; in every round each subscription
acknowledges one more entry: nine in ten cumulatively, one in ten
individually (every third entry nine rounds late, so each has a few holes).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time

from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.cursors import CursorFlusher, CursorState, Fence, SnapshotCursorStore
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import EtcdServer, EtcdStore, MemoryStore, MetadataStore, keys


class Timed(SnapshotCursorStore):
    """Records how long each save takes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.save_s: list[float] = []

    async def save(self, topic, changes, fence):
        start = time.perf_counter()
        await super().save(topic, changes, fence)
        self.save_s.append(time.perf_counter() - start)


async def run(metadata: MetadataStore, root: str, subs: int, seconds: float,
              interval: float, rate: float) -> dict:
    topic = TopicName.parse("persistent://bench/cursors/t")
    fence = Fence(keys.ownership("bench", topic), b"bench-owner")
    await metadata.put(fence.key, fence.value)
    store = Timed(metadata, Storage(root))
    flusher = CursorFlusher(store, topic, fence, interval=interval).start()
    cursors = {f"sub-{i}": CursorState.starting_at(MessageId(1, 0)) for i in range(subs)}
    acks = 0
    start = time.perf_counter()
    entry = 0
    while time.perf_counter() - start < seconds:
        ahead = start + entry / rate - time.perf_counter() if rate > 0 else 0.0
        if ahead > 0:  # one round (every subscription acks once) per 1/rate seconds
            await asyncio.sleep(ahead)
        for i, (name, cursor) in enumerate(cursors.items()):
            if i % 10:
                cursor.ack_cumulative(MessageId(1, entry))
            elif entry % 3:
                cursor.ack([MessageId(1, entry)])
            elif entry >= 9:  # every third entry is acked nine rounds late: a few holes
                cursor.ack([MessageId(1, entry - 9)])
            flusher.mark(name, cursor)
            if i % 1000 == 999:
                await asyncio.sleep(0)  # let the flusher run
        acks += subs
        entry += 1
    elapsed = time.perf_counter() - start
    await flusher.close()
    loaded = await SnapshotCursorStore(metadata, Storage(root)).load(topic)
    assert loaded == cursors, "restored cursors differ from the acknowledged ones"
    lat = sorted(store.save_s)
    return {
        "subscriptions": subs, "seconds": round(elapsed, 2), "interval_s": interval,
        "acks_per_sub_per_s": rate,
        "saves": flusher.flushes, "saves_per_s": round(flusher.flushes / elapsed, 1),
        "cursors_per_s": round(flusher.cursors_flushed / elapsed),
        "acks_per_s": round(acks / elapsed),
        "save_ms_p50": round(statistics.median(lat) * 1000, 1) if lat else None,
        "save_ms_max": round(lat[-1] * 1000, 1) if lat else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--subs", type=int, default=10_000)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--interval", type=float, default=0.0)
    p.add_argument("--rate", type=float, default=10.0,
                   help="acks per subscription per second (0: as fast as the loop goes)")
    p.add_argument("--metadata", choices=["etcd", "memory"], default="etcd")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cursors-") as tmp:
        server = None
        if args.metadata == "etcd":
            server = EtcdServer(data_dir=os.path.join(tmp, "etcd")).start(timeout=30)
            metadata: MetadataStore = EtcdStore(server.endpoint, timeout=5.0)
        else:
            metadata = MemoryStore()
        try:
            result = asyncio.run(run(metadata, os.path.join(tmp, "data"), args.subs,
                                     args.seconds, args.interval, args.rate))
        finally:
            asyncio.run(metadata.close())
            if server is not None:
                server.close()
    result["metadata"] = args.metadata
    print(json.dumps(result))


if __name__ == "__main__":
    main()
