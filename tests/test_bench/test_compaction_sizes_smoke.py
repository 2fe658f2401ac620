"""bench/compaction_sizes.py (in `make bench`) at a tiny size: 2,000 and 4,000 messages, one
round, a real worker; the JSON it prints holds each size's rounds (the job wrote what DuckDB
kept: the bench checks it), the fixed part and the recompaction. No figure is checked for
speed. A Spark worker starts: `make bench-smoke`, not `make test`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.bench_smoke_long
@pytest.mark.timeout(600)
def test_the_compaction_sizes_bench_runs_at_a_tiny_size(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compaction_sizes.py"), "--sizes", "2000,4000",
         "--rounds", "1", "--data-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    assert [s["size"] for s in doc["sizes"]] == [2000, 4000]
    for s in doc["sizes"]:
        (rnd,) = s["rounds"]
        assert rnd["ours_s"] >= rnd["compute_s"] > 0 and s["survivors"] > 0
        assert s["recompaction"]["compute_s"] > 0
    assert len(doc["fixed"]) == 1 and doc["fixed"][0]["compute_s"] > 0
    assert "## Compaction at every size" in proc.stdout
