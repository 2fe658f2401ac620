"""`make bench`, part by part at a tiny size (bench/run.py `--smoke --no-peers --only PART`),
so a part that breaks shows in `make test` instead of an hour into a full bench run. The parts
that start several clusters or a Spark worker have modules of their own beside this one
(support/bench_smoke.py says why).

`make test` runs one part (QUICK) and the failing-part test, which between them exercise the
runner, its JSON and RESULTS.md writing; every part runs in `make bench-smoke` (the parts took
95 s of the suite's 2,300 test-seconds and kept it past 15 minutes on CI's machine)."""
from __future__ import annotations

import pytest
from support.bench_smoke import PARTS, SLOW, check_part, run_bench

QUICK = ("flush",)


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize("part", [
    p if p in QUICK else pytest.param(p, marks=pytest.mark.bench_smoke_long)
    for p in PARTS if p not in SLOW])
def test_part_runs_at_a_tiny_size(part, tmp_path):
    check_part(part, tmp_path)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_failing_part_is_reported_and_the_next_part_still_runs(tmp_path):
    # dedup with no producer process cannot run (it divides the messages among them)
    proc, doc, results = run_bench(tmp_path, "--only", "dedup,flush", "--dedup-producers", "0")
    assert proc.returncode != 0
    assert "ZeroDivisionError" in doc["errors"]["dedup"]
    assert "bench: part dedup FAILED" in proc.stdout
    assert "dedup:" in proc.stderr.splitlines()[-1]  # the exit message names the part
    assert doc["flush"]["sustained"]["subscriptions"] == 50  # the next part ran, was saved
    dedup = results.split("## Idempotent producing", 1)[1].split("\n## ", 1)[0]
    assert "**Failed in the run of" in dedup and "ZeroDivisionError" in dedup
    assert "## Cursor flush with 50 subscriptions acking" in results


def test_every_slow_part_has_its_module():
    """A slow part is tested in test_bench_smoke_<part>.py, and every part is tested."""
    import pathlib

    here = pathlib.Path(__file__).parent
    for part in SLOW:
        assert (here / f"test_bench_smoke_{part.replace('-', '_')}.py").exists(), part
    assert set(SLOW) <= set(PARTS)
    assert set(QUICK) <= set(PARTS) - set(SLOW)
