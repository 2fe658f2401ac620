"""bench/compacted_fanout.py (in `make bench`) at a tiny size: 2,000 messages over 200 keys,
one compaction, 10 read_compacted subscriptions over the source and 4 shadows in each mode,
one round without the peers' ceiling. A Spark worker starts: `make bench-smoke`, not `make
test`. No figure is checked for speed; every subscription must load every key."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.bench_smoke_long
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["--mode frames", "--mode frames --ack cumulative",
                                  "--mode receive"])
def test_the_compacted_fanout_bench_runs_at_a_tiny_size(tmp_path, mode):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compacted_fanout.py"), "--rounds", "1",
         "--no-peers", "--messages", "2000", "--keys", "200", "--subs", "10", *mode.split(),
         "--data-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(next(line for line in proc.stdout.splitlines()
                          if line.startswith('{"args"')))
    (rnd,) = doc["rounds"]
    assert 0 < doc["load_entries"] <= 200
    assert rnd["deliveries"] == doc["load_entries"] * 10 and rnd["deliveries_per_s"] > 0
    assert "## Compacted fan-out over shadows" in proc.stdout
