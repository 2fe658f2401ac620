"""Running `make bench` part by part at a tiny size (bench/run.py `--smoke --no-peers --only
PART`) for tests/test_bench/: a part that breaks shows in `make test` instead of an hour into a
full bench run.

Each part runs as `make bench` runs it: bench/run.py in a process of its own, starting real
etcd, broker, shadow broker and worker processes. Its RESULTS.md, bench/out json and data go
to the test's temp dir (`--out`, `--out-dir`, `--data-dir`): the checkout's bench/RESULTS.md
and bench/out/ are never written. No figure is checked for speed: only that the part ran,
its figures were saved, and its RESULTS.md section shows them.
"""
from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "bench" / "run.py"


def _constant(name: str):
    """A literal constant of bench/run.py, read without importing it."""
    tree = ast.parse(RUN.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"bench/run.py has no {name}")


PARTS = _constant("PARTS")
KEYS = _constant("KEYS")  # the part's key in bench/out/*.json


def _checkout_state() -> tuple:
    out = ROOT / "bench" / "out"
    results = ROOT / "bench" / "RESULTS.md"
    return (results.stat().st_mtime_ns if results.exists() else None,
            sorted(os.listdir(out)) if out.is_dir() else None)


def run_bench(tmp_path: Path, *args: str, timeout: float = 270
              ) -> tuple[subprocess.CompletedProcess, dict, str]:
    """bench/run.py --smoke --no-peers ARGS with every output in `tmp_path`: (the process,
    its bench/out json, its RESULTS.md)."""
    before = _checkout_state()
    out_dir = tmp_path / "out"
    cmd = [sys.executable, str(RUN), "--smoke", "--no-peers", "--out",
           str(tmp_path / "RESULTS.md"), "--out-dir", str(out_dir), "--data-dir",
           str(tmp_path / "data"), *args]
    # a session of its own: on a timeout its brokers and etcd go with it
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as p:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            stdout, stderr = p.communicate()
            pytest.fail(f"bench/run.py {' '.join(args)} took over {timeout:.0f} s:\n"
                        f"{stdout[-3000:]}\n{stderr[-3000:]}")
    proc = subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr)
    assert _checkout_state() == before, "the smoke run wrote the checkout's bench/ outputs"
    docs = sorted(out_dir.glob("*.json"))
    assert len(docs) == 1, (docs, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc, json.loads(docs[0].read_text()), (tmp_path / "RESULTS.md").read_text()


#: parts with several clusters or a Spark worker: minutes even at a tiny size on 2 busy cores.
#: Each has a test module of its own (test_bench_smoke_<part>.py), marked `bench_smoke_long`:
#: `make bench-smoke` runs them, `make test` leaves them out (they would add ~8 minutes).
SLOW = ("shadows", "shadows-scale", "compaction")


def check_part(part: str, tmp_path: Path) -> None:
    """Run `part` at its tiny size: it ends well, saves figures, and reports no failure."""
    proc, doc, results = run_bench(tmp_path, "--only", part,
                                   timeout=600 if part in SLOW else 270)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert doc["errors"] == {}
    figures = doc[KEYS.get(part, part)]
    assert figures, f"no figures saved for {part}"
    assert "Failed in the run of" not in results
    assert f"bench: part {part} done" in proc.stdout
