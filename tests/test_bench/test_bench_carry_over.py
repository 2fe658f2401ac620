"""bench/run.py carries a part it did not run over from its own newest results file
(bench/out/<stamp>.json), never from the other benches' files written beside them (make
bench writes bench/out/security-cost.json and tables-read.json there: their "rounds" once
passed for the produce part's and broke the report)."""
from __future__ import annotations

import importlib.util
import json
import pathlib

RUN = pathlib.Path(__file__).resolve().parents[2] / "bench" / "run.py"


def load_run():
    spec = importlib.util.spec_from_file_location("bench_run", RUN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_the_scripts_own_files_are_carried_over(tmp_path):
    run = load_run()
    (tmp_path / "security-cost.json").write_text(json.dumps({"rounds": [{"plain": {}}]}))
    (tmp_path / "tables-read.json").write_text(json.dumps({"rounds": [1]}))
    assert run.carried_over(set(), str(tmp_path)) == {}
    own = {"rounds": [{"msgs_per_s": 1}], "fanout100": {"x": 1}}
    (tmp_path / "20261129-045508.json").write_text(json.dumps(own))
    found = run.carried_over({"fanout100"}, str(tmp_path))
    assert found == {"produce": ("20261129-045508.json", own)}
