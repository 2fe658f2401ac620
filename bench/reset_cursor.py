#!/usr/bin/env python3
"""The time of one `reset-cursor` on a topic with `--subs` (100,000) subscriptions (issue 29:
a reset is durable before it answers, at the cost of one cursor write, not a flush of the
topic's cursors).

    .venv/bin/python bench/reset_cursor.py [--subs 100000] [--resets 64] [--concurrent 100]

In-process, on one event loop, as in the broker: one `TopicSubscriptions` (the broker's
subscription engine) over an in-memory ledger view of 20 entries, its cursors in a
`SnapshotCursorStore` over a real etcd (the pointer) and real files under a temp dir (delta
and full cursor files, fsynced), its flusher at the broker's interval (1 s). The
`--subs` subscriptions are put in place directly (no metadata writes: only their cursors
matter here) and flushed once, so the store holds them all in a full file. Then:
- `--resets` resets of one subscription in a row (alternately to the first and the last
  entry), each timed around `TopicSubscriptions.reset_cursor`: median, p90, max (in ms);
- `--concurrent` resets of as many subscriptions at once: the wall time, and how many
  cursor saves they took (concurrent changes share writes);
and the cursor saves the resets made (the pointer's sequence). A process-level figure (a
client's gRPC round trip to a broker process) adds the same ~5 ms to every variant; it
is left out so the cursor write shows. Bounded: a fixed count of resets.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TOPIC = "persistent://bench/resets/t"


class Count:
    def add_out(self, msgs, size):
        pass


async def run(metadata, root: str, subs: int, resets: int, concurrent: int) -> dict:
    from shadowtopic.core.message_id import MessageId
    from shadowtopic.core.names import TopicName
    from shadowtopic.core.policies import Policies
    from shadowtopic.cursors import CursorState, Fence, SnapshotCursorStore
    from shadowtopic.ledger.memory_view import MemoryView
    from shadowtopic.ledger.storage import Storage
    from shadowtopic.metadata import keys
    from shadowtopic.pb.storage.v1 import cursors_pb2 as cpb
    from shadowtopic.pb.v1 import common_pb2
    from shadowtopic.read.positions import Start
    from shadowtopic.subscriptions import EXCLUSIVE, TopicSubscriptions
    from shadowtopic.subscriptions.subscription import Subscription

    topic = TopicName.parse(TOPIC)
    own = keys.ownership("bench", topic)
    await metadata.put(own, b"owner")
    view = MemoryView()
    view.append([common_pb2.Message(payload=b"m%d" % i).SerializeToString()
                 for i in range(20)])
    first, last = view.first_position(), view.last_confirmed()
    store = SnapshotCursorStore(metadata, Storage(root))
    ts = await TopicSubscriptions(topic, view, metadata, store, Fence(own, b"owner"),
                                  lambda: Policies(), Count(), 1.0).load()
    now_ms = int(time.time() * 1000)
    for i in range(subs):  # at the end, as after a broadcast all acknowledged
        name = f"s-{i}"
        sub = ts.subs[name] = Subscription(ts, name, EXCLUSIVE,
                                           CursorState.starting_at(view.next_position()),
                                           now_ms)
        ts.changed(sub)
    t0 = time.perf_counter()
    await ts.flusher.flush_now()
    res: dict = {"subscriptions": subs, "first_flush_s": round(time.perf_counter() - t0, 2)}

    async def sequence() -> int:
        kv = await metadata.get(keys.cursors(topic))
        return cpb.CursorPointer.FromString(kv.value).sequence

    seq0 = await sequence()
    took = []
    for i in range(resets):
        target = Start.at(first if i % 2 == 0 else last, inclusive=True)
        t = time.perf_counter()
        await ts.reset_cursor("s-0", target, False)
        took.append((time.perf_counter() - t) * 1000)
    seq1 = await sequence()
    took.sort()
    res.update(resets=resets, reset_ms_median=round(statistics.median(took), 3),
               reset_ms_p90=round(took[int(0.9 * (len(took) - 1))], 3),
               reset_ms_max=round(took[-1], 3), cursor_saves_by_resets=seq1 - seq0)
    t = time.perf_counter()
    await asyncio.gather(*[ts.reset_cursor(f"s-{i}", Start.at(first, inclusive=True), False)
                           for i in range(1, concurrent + 1)])
    res.update(concurrent=concurrent,
               concurrent_ms=round((time.perf_counter() - t) * 1000, 2),
               cursor_saves_by_concurrent=await sequence() - seq1)
    await ts.close()
    check = await SnapshotCursorStore(metadata, Storage(root)).load(topic)
    res["reloaded_ok"] = (len(check) == subs and check["s-1"].mark_delete
                          == MessageId(first.ledger_id, first.entry_id - 1))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--subs", type=int, default=100_000)
    ap.add_argument("--resets", type=int, default=64)
    ap.add_argument("--concurrent", type=int, default=100)
    args = ap.parse_args()
    from shadowtopic.metadata import EtcdServer, EtcdStore

    with tempfile.TemporaryDirectory(prefix="bench-reset-") as d:
        server = EtcdServer(data_dir=os.path.join(d, "etcd")).start(timeout=60)
        metadata = EtcdStore(server.endpoint, timeout=5.0)
        try:
            res = asyncio.run(run(metadata, os.path.join(d, "storage"), args.subs,
                                  args.resets, args.concurrent))
        finally:
            asyncio.run(metadata.close())
            server.close()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
