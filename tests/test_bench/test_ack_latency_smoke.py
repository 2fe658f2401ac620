"""bench/ack_latency.py (in `make bench`) at a tiny size: two producer processes offering 500
msgs/s for a second and a half to a real broker, every message timed, fdatasync probed; the
JSON it prints holds every offered rate's figures. No figure is checked for speed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_ack_latency_bench_runs_at_a_tiny_size(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ack_latency.py"), "--rounds", "1", "--rates",
         "300,500", "--seconds", "1.5", "--producers", "2", "--probes", "20", "--data-dir",
         str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(next(line for line in proc.stdout.splitlines()
                          if line.startswith('{"rounds"')))
    assert set(doc["summary"]) == {"300", "500"}
    for rate, rows in doc["by_rate"].items():
        (row,) = rows
        assert row["n_errors"] == 0, row["errors"]
        assert row["timed"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0, (rate, row)
        assert row["fdatasync"]["p99_ms"] > 0
    assert "## Ack latency under load" in proc.stdout
