"""The declared layers (docs/ARCHITECTURE.md, "Layers"; contracts in pyproject.toml under
[tool.importlinter]) hold, and the check that enforces them fails on a deliberate upward
import: each case copies the packages to a temporary tree, adds one forbidden import and
expects `lint-imports` to name the broken contract and the import."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = os.path.join(os.path.dirname(sys.executable), "lint-imports")


def lint(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run([LINT, "--no-cache"], cwd=tree, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, PYTHONPATH=str(tree)))


def test_the_declared_layers_hold():
    res = lint(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("source/ledger/view.py", "import source.broker.server",
     "source/ is layered: each layer imports only the layers below it"),
    ("source/metadata/keys.py", "from source.ledger import storage",
     "source/ is layered: each layer imports only the layers below it"),
    ("source/core/names.py", "import shadow.ledger",
     "source/ imports neither feature (shadow, compaction)"),
    ("shadow/needs.py", "import compaction.plan",
     "shadow and compaction never import each other"),
    ("source/client/client.py", "import source.metadata.keys",
     "the client library speaks gRPC only"),
    ("source/cli/commands.py", "from source.broker import server",
     "the CLI reaches brokers through the client library"),
    ("compaction/plan.py", "import compaction.worker", "compaction/ is layered"),
    ("compaction/worker.py", "from source.broker import rpc",
     "the compaction worker meets brokers only through etcd and storage"),
    ("compaction/spark_job.py", "from compaction import reference",
     "the production compaction never imports the reference implementation"),
])
def test_a_forbidden_import_breaks_the_check(tmp_path, module, line, contract):
    for part in ("source", "shadow", "compaction"):
        shutil.copytree(ROOT / part, tmp_path / part,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / module, "a") as f:
        f.write(f"\n{line}  # deliberate: the check must refuse this\n")
    res = lint(tmp_path)
    assert res.returncode != 0, res.stdout
    broken = res.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, res.stdout
    importer = module[:-3].replace("/", ".")
    assert importer in broken, res.stdout


def test_the_cli_runs_a_broker_by_its_module_not_by_importing_it():
    """`shadowtopic broker ...` execs `python -m source.broker.server ...` (the CLI imports
    no server code): the broker's own parser answers, with the CLI's program name."""
    exe = os.path.join(os.path.dirname(sys.executable), "shadowtopic")
    res = subprocess.run([exe, "broker", "--help"], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: shadowtopic broker")
    assert "--entry-cache-bytes SIZE" in res.stdout
    bad = subprocess.run([exe, "broker", "--entry-cache-bytes", "lots"], capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert bad.returncode == 2 and "'lots' is not a size" in bad.stderr
