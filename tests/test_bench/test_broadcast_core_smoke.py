"""bench/broadcast_core.py (in `make bench`) at a tiny size: every part of a broadcast
message's in-process cost is reported, and every subscription got every message (the bench
raises otherwise). No figure is checked for speed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_broadcast_core_bench_runs_at_a_tiny_size():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "broadcast_core.py"), "--subs", "300",
         "--messages", "3", "--streams", "3"], cwd=ROOT, capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert (doc["subscriptions"], doc["streams"], doc["messages"]) == (300, 3, 3)
    for part in ("dispatch", "ack", "records"):
        assert doc[f"{part}_us_per_sub"] > 0, part
    assert doc["total_us_per_sub"] >= doc["dispatch_us_per_sub"]
