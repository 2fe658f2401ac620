"""The checked-in generated code equals a fresh generation from proto/ (run `make proto`)."""
from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_generated_code_is_fresh(tmp_path):
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    files = gen.generate(tmp_path)
    assert files, "no .proto files found"
    fresh = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert fresh
    stale = [str(rel) for rel, data in fresh.items()
             if not (ROOT / "source" / rel).exists()
             or (ROOT / "source" / rel).read_bytes() != data]
    assert not stale, f"generated code is stale, run `make proto`: {stale}"


def test_proto_is_not_an_importable_package():
    assert not (ROOT / "proto" / "__init__.py").exists()
