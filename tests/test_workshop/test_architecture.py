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


# the package's folders as the installed package lays them out (pyproject.toml, [tool.setuptools])
FOLDERS = {"source": "shadowtopic", "shadow": "shadowtopic/shadow",
           "compaction": "shadowtopic/compaction"}


def lint(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run([LINT, "--no-cache"], cwd=tree, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, PYTHONPATH=str(tree)))


def test_the_declared_layers_hold():
    res = lint(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("source/ledger/view.py", "import shadowtopic.broker.server",
     "source/ is layered: each layer imports only the layers below it"),
    ("source/metadata/keys.py", "from shadowtopic.ledger import storage",
     "source/ is layered: each layer imports only the layers below it"),
    ("source/core/names.py", "import shadowtopic.shadow.ledger",
     "source/ imports neither feature (shadow, compaction)"),
    ("shadow/needs.py", "import shadowtopic.compaction.plan",
     "shadow and compaction never import each other"),
    ("source/client/client.py", "import shadowtopic.metadata.keys",
     "the client library speaks gRPC only"),
    ("source/cli/commands.py", "from shadowtopic.broker import server",
     "the CLI reaches brokers through the client library"),
    ("compaction/plan.py", "import shadowtopic.compaction.worker", "compaction/ is layered"),
    ("compaction/worker.py", "from shadowtopic.broker import rpc",
     "the compaction worker meets brokers only through etcd and storage"),
    ("compaction/spark_job.py", "from shadowtopic.compaction import reference",
     "the production compaction never imports the reference implementation"),
])
def test_a_forbidden_import_breaks_the_check(tmp_path, module, line, contract):
    for folder, package in FOLDERS.items():
        shutil.copytree(ROOT / folder, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    folder, rest = module.split("/", 1)
    with open(tmp_path / FOLDERS[folder] / rest, "a") as f:
        f.write(f"\n{line}  # deliberate: the check must refuse this\n")
    res = lint(tmp_path)
    assert res.returncode != 0, res.stdout
    broken = res.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, res.stdout
    importer = (FOLDERS[folder] + "/" + rest[:-3]).replace("/", ".")
    assert importer in broken, res.stdout


def test_the_cli_runs_a_broker_by_its_module_not_by_importing_it():
    """`shadowtopic broker ...` execs `python -m shadowtopic.broker ...` (the CLI imports
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
