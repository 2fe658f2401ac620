#!/usr/bin/env python3
"""Alternating rounds of `bench/run.py` on two checkouts of shadowtopic: is a change within noise?

    .venv/bin/python bench/ab.py --before /tmp/before --pairs 3 -- \\
        --no-peers --only produce,fanout100,shadows,compaction --rounds 1

Runs `bench/run.py <args>` in the `--before` checkout, then in this one, `--pairs` times
(A B A B ...: the machine is shared and noisy, so each pair meets the same noise). Each run
imports its own tree's code: it runs under that tree's own `.venv/bin/python` (`make install`
there first: the package is installed editable, so a PYTHONPATH would not switch it; the
brokers and workers it starts use the same interpreter) and writes its figures to
`<tree>/bench/out/<stamp>.json`; RESULTS.md is not touched (`--out` goes to a scratch file).
Every number the two runs share is a figure; the report gives, for each, the before and after
medians and the median of the paired ratios after / before.
Lower is better for seconds, latencies and CPU; higher for rates.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(tree: str, args: list[str], scratch: str) -> dict:
    out_dir = os.path.join(tree, "bench", "out")
    before = set(glob.glob(os.path.join(out_dir, "*.json")))
    python = os.path.join(tree, ".venv", "bin", "python")
    if not os.path.exists(python):
        sys.exit(f"ab: {tree} has no .venv/bin/python: run `make install` there first")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [python, os.path.join(tree, "bench", "run.py"), *args,
           "--out", os.path.join(scratch, "RESULTS.md")]
    t0 = time.monotonic()
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    new = sorted(set(glob.glob(os.path.join(out_dir, "*.json"))) - before)
    if not new:
        sys.exit(f"ab: {tree}: bench/run.py wrote no bench/out/*.json")
    print(f"  {tree}: {time.monotonic() - t0:.0f} s, {os.path.basename(new[-1])}", flush=True)
    with open(new[-1]) as f:
        return json.load(f)


def leaves(d, prefix: str = "") -> dict[str, float]:
    """Every number in a result, by its path (lists of rounds by index)."""
    out: dict[str, float] = {}
    if isinstance(d, dict):
        items = d.items()
    elif isinstance(d, list):
        items = ((str(i), v) for i, v in enumerate(d))
    else:
        return out
    for k, v in items:
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out[path] = float(v)
        else:
            out.update(leaves(v, path))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="a checkout of the code before the change")
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--json", default=None, help="write every run's figures here")
    p.add_argument("args", nargs=argparse.REMAINDER, help="-- then bench/run.py's arguments")
    a = p.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(a.pairs):
            print(f"pair {i + 1}/{a.pairs}", flush=True)
            runs["before"].append(leaves({k: v for k, v in
                                          run(os.path.abspath(a.before), args, scratch).items()
                                          if k not in ("args", "load")}))
            runs["after"].append(leaves({k: v for k, v in run(ROOT, args, scratch).items()
                                         if k not in ("args", "load")}))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(runs, f, indent=1)
    common = sorted(set.intersection(*(set(r) for r in runs["before"] + runs["after"])))
    print(f"\n{'figure':70} {'before':>12} {'after':>12} {'after/before':>13}")
    for key in common:
        b = [r[key] for r in runs["before"]]
        af = [r[key] for r in runs["after"]]
        ratios = [x / y for x, y in zip(af, b) if y]
        if not ratios:
            continue
        print(f"{key[:70]:70} {statistics.median(b):12.4g} {statistics.median(af):12.4g} "
              f"{statistics.median(ratios):13.3f}")


if __name__ == "__main__":
    main()
