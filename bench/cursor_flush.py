"""Sustained cursor flush rate with `--subs` (10,000) subscriptions acknowledging: one
`CursorFlusher` (source/cursors/flusher.py) at the broker's interval (1 s) saves every cursor
changed since its last save through a `SnapshotCursorStore` over a real etcd (the pointer)
and real files under a temp storage root (the delta / full cursor files, fsynced).

    .venv/bin/python bench/cursor_flush.py [--subs 10000] [--seconds 20] [--rate 5]

In-process, on one event loop, as in the broker: `--rate` rounds a second, in each of which
every subscription acknowledges individually (one `CursorState.ack` with three ids, as one
Ack command of a Shared consumer would) two new entries and the third entry of the round
`--lag` (5) rounds earlier, so every cursor carries ~`--lag` acknowledged ranges above its
mark-delete (holes), and is marked dirty. Then the same for `--ceiling-seconds` with the
flusher saving back to back (interval 0): how many cursors a second the store can persist.

Reported from the flusher's own counters (`flushes`, `cursors_flushed`, `last_flush_s`) and a
timing wrapper around `save`: cursors persisted per second, save duration (mean, p50, max),
the size of delta and full files (a delta holds the changed cursors, a full file all of
them), the event loop's worst lateness (a 10 ms ticker; the acks share the loop), and a
check that a fresh store loads exactly the acknowledged cursors. Prints one JSON object.
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

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
if BENCH not in sys.path:  # the sibling bench modules imported below
    sys.path.insert(0, BENCH)


def _store_class():
    from shadowtopic.cursors import SnapshotCursorStore

    class Timed(SnapshotCursorStore):
        """Records each save's duration and the kind and size of the file it wrote."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.saves: list[tuple[float, str, int, int]] = []  # (s, kind, bytes, cursors)
            self.busy = False

        async def save(self, topic, changes, fence):
            start = time.perf_counter()
            self.busy = True
            try:
                await super().save(topic, changes, fence)
            finally:
                self.busy = False
            ptr = self._topics[topic].pointer
            ref = ptr.deltas[-1] if len(ptr.deltas) else ptr.full
            self.saves.append((time.perf_counter() - start, "delta" if len(ptr.deltas)
                               else "full", ref.size_bytes, len(changes)))

    return Timed


async def phase(metadata, root: str, topic, fence, cursors: dict, entry: int, subs: int,
                seconds: float, interval: float, rate: float, lag: int) -> tuple[dict, int]:
    """Acks at `rate` rounds/s for `seconds` with a flusher at `interval`; returns figures
    and the next entry to acknowledge."""
    from shadowtopic.core.message_id import MessageId
    from shadowtopic.cursors import CursorFlusher
    from shadowtopic.ledger.storage import Storage

    store = _store_class()(metadata, Storage(root))
    await store.load(topic)  # the store continues the topic's files, as a restarted owner
    flusher = CursorFlusher(store, topic, fence, interval=interval).start()
    lateness: list[tuple[float, bool]] = []
    stop = asyncio.Event()

    async def ticker():
        while not stop.is_set():
            t = time.perf_counter()
            busy = store.busy
            await asyncio.sleep(0.01)
            lateness.append((time.perf_counter() - t - 0.01, busy or store.busy))

    tick = asyncio.create_task(ticker())
    acks = rounds = 0
    start = time.perf_counter()
    items = list(cursors.items())
    while time.perf_counter() - start < seconds:
        ahead = start + rounds / rate - time.perf_counter()
        if ahead > 0:
            await asyncio.sleep(ahead)
        e = 3 * entry
        late = 3 * (entry - lag) + 2
        ids = [MessageId(1, e), MessageId(1, e + 1)]
        if late >= 0:
            ids.append(MessageId(1, late))
        for i, (name, cursor) in enumerate(items):
            acks += cursor.ack(ids)
            flusher.mark(name, cursor)
            if i % 1000 == 999:
                await asyncio.sleep(0)  # let the flusher and the ticker run
        entry += 1
        rounds += 1
    elapsed = time.perf_counter() - start
    # what the flusher wrote during the phase (its close flushes the rest, not counted)
    flushes, flushed = flusher.flushes, flusher.cursors_flushed
    saves = list(store.saves)
    last_flush_s = flusher.last_flush_s
    stop.set()
    await tick
    await flusher.close()
    durs = sorted(s for s, _, _, _ in saves)
    full = [b for _, k, b, _ in saves if k == "full"]
    delta = [b for _, k, b, _ in saves if k == "delta"]
    late_all = sorted(x for x, _ in lateness)
    late_save = [x for x, b in lateness if b]
    res = {
        "interval_s": interval, "seconds": round(elapsed, 2), "subscriptions": subs,
        "ack_rounds_per_s": round(rounds / elapsed, 2), "target_rounds_per_s": rate,
        "acked_ids_per_s": round(acks / elapsed),
        "flushes": flushes, "cursors_flushed": flushed,
        "cursors_per_s": round(flushed / elapsed),
        "cursors_per_save": round(flushed / flushes) if flushes else 0,
        "save_ms_mean": round(statistics.mean(durs) * 1000, 1) if durs else None,
        "save_ms_p50": round(durs[len(durs) // 2] * 1000, 1) if durs else None,
        "save_ms_max": round(durs[-1] * 1000, 1) if durs else None,
        "last_flush_ms": round(last_flush_s * 1000, 1),
        "full_files": len(full), "delta_files": len(delta),
        "full_bytes_mean": round(statistics.mean(full)) if full else None,
        "delta_bytes_mean": round(statistics.mean(delta)) if delta else None,
        "bytes_per_cursor": round(statistics.mean([b / max(1, n) for _, _, b, n in saves]), 1)
        if saves else None,
        "loop_late_ms_p99": round(late_all[int(len(late_all) * 0.99)] * 1000, 1)
        if late_all else None,
        "loop_late_ms_max": round(late_all[-1] * 1000, 1) if late_all else None,
        "loop_late_ms_max_during_save": round(max(late_save) * 1000, 1) if late_save else None,
    }
    return res, entry


async def run(metadata, root: str, subs: int, seconds: float, ceiling_seconds: float,
              interval: float, rate: float, lag: int) -> dict:
    import topics  # bench/topics.py

    from shadowtopic.core.message_id import MessageId
    from shadowtopic.core.names import TopicName
    from shadowtopic.cursors import CursorState, Fence, SnapshotCursorStore
    from shadowtopic.ledger.storage import Storage
    from shadowtopic.metadata import keys

    topic = TopicName.parse(topics.name("flush"))
    fence = Fence(keys.ownership("bench", topic), b"bench-owner")
    await metadata.put(fence.key, fence.value)
    cursors = {f"sub-{i}": CursorState.starting_at(MessageId(1, 0)) for i in range(subs)}
    out = {}
    sustained, entry = await phase(metadata, root, topic, fence, cursors, 0, subs, seconds,
                                   interval, rate, lag)
    out["sustained"] = sustained
    if ceiling_seconds > 0:
        out["back_to_back"], entry = await phase(metadata, root, topic, fence, cursors, entry,
                                                 subs, ceiling_seconds, 0.0, rate, lag)
    loaded = await SnapshotCursorStore(metadata, Storage(root)).load(topic)
    if loaded != cursors:
        raise SystemExit("bench: restored cursors differ from the acknowledged ones")
    holes = [c.holes for c in cursors.values()]
    out.update(restored_ok=True, holes_per_cursor=round(statistics.mean(holes), 1),
               lag_rounds=lag)
    return out


def run_flush(data_dir: str, subs: int = 10_000, seconds: float = 20.0,
              ceiling_seconds: float = 5.0, interval: float = 1.0, rate: float = 5.0,
              lag: int = 5) -> dict:
    """Start an etcd under `data_dir`, run both phases, stop it."""
    from shadowtopic.metadata import EtcdServer, EtcdStore

    server = EtcdServer(data_dir=os.path.join(data_dir, "etcd-flush")).start(timeout=60)
    metadata = EtcdStore(server.endpoint, timeout=5.0)
    try:
        return asyncio.run(run(metadata, os.path.join(data_dir, "flush-storage"), subs,
                               seconds, ceiling_seconds, interval, rate, lag))
    finally:
        asyncio.run(metadata.close())
        server.close()


def flush_lines(res: dict) -> list[str]:
    """The RESULTS.md section."""
    s, b = res["sustained"], res.get("back_to_back")
    lines = ["## Cursor flush with 10,000 subscriptions acking (bench/cursor_flush.py)"
             if s["subscriptions"] == 10_000 else
             f"## Cursor flush with {s['subscriptions']:,} subscriptions acking "
             "(bench/cursor_flush.py)", "",
             f"In-process, one event loop (as in the broker): {s['subscriptions']:,} "
             f"`CursorState`s, {s['target_rounds_per_s']:g} ack rounds a second (each "
             "subscription acknowledges three ids individually per round, one of them "
             f"{res['lag_rounds']} rounds late: ~{res['holes_per_cursor']} acknowledged ranges "
             "above the mark-delete per cursor), one `CursorFlusher` saving through "
             "`SnapshotCursorStore` (pointer in a real etcd, fsynced delta/full files on the "
             "data disk); figures from the flusher's counters and a timer around each save. "
             "A fresh store then loads exactly the acknowledged cursors "
             f"({'checked' if res.get('restored_ok') else 'NOT checked'}).", "",
             "| flusher | seconds | saves | cursors/s persisted | cursors/save | save ms mean "
             "| save ms max | full files (mean bytes) | delta files (mean bytes) | ack ids/s "
             "| loop late ms max |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, r in (("interval 1 s (broker default)" if s["interval_s"] == 1.0 else
                      f"interval {s['interval_s']:g} s", s), ("back to back (ceiling)", b)):
        if not r:
            continue
        lines.append(
            f"| {label} | {r['seconds']} | {r['flushes']} | {r['cursors_per_s']:,} | "
            f"{r['cursors_per_save']:,} | {r['save_ms_mean']} | {r['save_ms_max']} | "
            f"{r['full_files']} ({_b(r['full_bytes_mean'])}) | {r['delta_files']} "
            f"({_b(r['delta_bytes_mean'])}) | {r['acked_ids_per_s']:,} | "
            f"{r['loop_late_ms_max']} |")
    lines.append("")
    if s["flushes"]:
        lines.append(f"- sustained: **{s['cursors_per_s']:,} cursors/s** persisted (every "
                     f"cursor changed in every interval), each save {s['save_ms_mean']} ms on "
                     f"average ({s['save_ms_mean'] / (s['interval_s'] * 1000):.0%} of the "
                     f"interval), at most {s['save_ms_max']} ms")
    if b and b["flushes"]:
        lines.append(f"- back to back the store persists **{b['cursors_per_s']:,} cursors/s** "
                     f"({b['cursors_per_s'] / max(1, s['cursors_per_s']):.1f}x the sustained "
                     "need)")
    lines.append("")
    return lines


def _b(v) -> str:
    return f"{v:,}" if v else "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--subs", type=int, default=10_000)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--ceiling-seconds", type=float, default=5.0,
                   help="then flush back to back for this long (0: skip)")
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--rate", type=float, default=5.0, help="ack rounds per second")
    p.add_argument("--lag", type=int, default=5, help="rounds a late ack trails (holes)")
    a = p.parse_args()
    base = os.path.join(ROOT, "data", "bench")
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as d:
        res = run_flush(d, a.subs, a.seconds, a.ceiling_seconds, a.interval, a.rate, a.lag)
    print(json.dumps(res))
    print("\n".join(flush_lines(res)))


if __name__ == "__main__":
    main()
