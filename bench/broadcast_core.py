#!/usr/bin/env python3
"""The broker's own cost of one broadcast message, per subscription, in process: the
subscription engine (`TopicSubscriptions` over the in-memory view and cursor store), without
gRPC, protobuf or other processes, so a change to dispatch, acks or cursors shows in
microseconds per subscription rather than in a whole-system bench's noise.

    .venv/bin/python bench/broadcast_core.py [--subs 20000] [--messages 30] [--streams 4]

`--subs` Exclusive subscriptions ("latest", permits enough for the run) spread over
`--streams` client streams (a fake outbox each, as `subscribe_many` from that many client
processes). Per message: one entry appended and dispatched to every subscription
(`dispatch`); one Ack per stream for all its subscriptions (`TopicSubscriptions.ack_many`,
what a grouped listener's `recipients.acknowledge` sends: `ack`); the records of the changed
cursors, what a cursor flush takes before it writes (`records`). Process CPU time per
subscription per message, median over the messages; the garbage collector is frozen after
the setup and off while timing (its pauses are this process's noise, not the code's cost).
Prints one JSON object. It uses no API newer than the engine itself, so the same file runs
in an older checkout for a before/after.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time

from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import Policies
from shadowtopic.cursors.state import pack
from shadowtopic.cursors.store import Fence, MemoryCursorStore, records
from shadowtopic.ledger.memory_view import MemoryView
from shadowtopic.metadata import keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.read.positions import LATEST, Start
from shadowtopic.subscriptions import EXCLUSIVE, TopicSubscriptions

TOPIC = TopicName.parse("persistent://bench/core/broadcast")


class Stream:
    """A client stream's outbox: counts the deliveries queued on it."""

    def __init__(self) -> None:
        self.delivered = 0
        self.errors = 0

    def has_room(self) -> bool:
        return True

    def call_when_room(self, callback) -> None:
        pass

    def send_entries(self, handles, encoded, size) -> None:
        self.delivered += len(handles)

    def send_error(self, handle, error) -> None:
        self.errors += 1  # (the close at the end tells every consumer)

    def send_notice(self, handle, notice) -> None:
        pass


class Sent:
    def add_out(self, msgs: int, size: int) -> None:
        pass


async def run(subs: int, messages: int, streams: int) -> dict:
    meta = MemoryStore()
    own = keys.ownership("bench", TOPIC)
    value = mpb.Ownership(broker_id="bench", epoch=1).SerializeToString()
    await meta.put(own, value)
    view = MemoryView()
    ts = await TopicSubscriptions(TOPIC, view, meta, MemoryCursorStore(meta), Fence(own, value),
                                  Policies, Sent(), 3600.0).load()
    outs = [Stream() for _ in range(streams)]
    by_stream: list[list] = [[] for _ in range(streams)]
    started = time.perf_counter()
    for i in range(subs):
        c, _created, _pos = await ts.subscribe(outs[i % streams], i, f"sub-{i:06d}", EXCLUSIVE,
                                               Start(LATEST))
        ts.flow(c, messages + 10)
        by_stream[i % streams].append(c)
    attach_s = time.perf_counter() - started
    await asyncio.sleep(0.05)
    gc.collect()
    gc.freeze()
    gc.disable()
    parts: dict[str, list[float]] = {"dispatch": [], "ack": [], "records": []}
    for _ in range(messages):
        before = sum(o.delivered for o in outs)
        view.append([b'{"price": 101.25, "symbol": "ACME"}'])
        t0 = time.process_time()
        deadline = time.monotonic() + 60
        while sum(o.delivered for o in outs) < before + subs:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{before + subs - sum(o.delivered for o in outs)} "
                                   "deliveries missing after 60 s")
            await asyncio.sleep(0)
        t1 = time.process_time()
        last = pack(view.next_position()) - 1
        for consumers in by_stream:
            if ts.ack_many(consumers, [last], False):
                raise RuntimeError("an ack failed")
        t2 = time.process_time()
        records(ts.flusher._dirty)  # what the next flush reads of the changed cursors
        t3 = time.process_time()
        ts.flusher.discard()
        for part, took in (("dispatch", t1 - t0), ("ack", t2 - t1), ("records", t3 - t2)):
            parts[part].append(took)
    gc.enable()
    await ts.close(flush=False)
    out = {"subscriptions": subs, "streams": streams, "messages": messages,
           "attach_us_per_sub": round(attach_s / subs * 1e6, 1)}
    for part, took in parts.items():
        out[f"{part}_us_per_sub"] = round(statistics.median(took) / subs * 1e6, 3)
    out["total_us_per_sub"] = round(sum(out[f"{p}_us_per_sub"] for p in parts), 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--subs", type=int, default=20_000)
    p.add_argument("--messages", type=int, default=30)
    p.add_argument("--streams", type=int, default=4)
    a = p.parse_args()
    print(json.dumps(asyncio.run(run(a.subs, a.messages, a.streams))))


if __name__ == "__main__":
    main()
