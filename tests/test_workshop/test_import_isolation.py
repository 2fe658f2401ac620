"""The tests import the package the way a user does: through the installed distribution (the
strict editable link tree under build/), never from the repo root. With the root on sys.path,
`import source` would work and a broken package mapping in pyproject.toml could pass every
test. tests/conftest.py takes the root off sys.path and PYTHONPATH; these tests prove it, in
the test process and in a subprocess a test starts."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import shadowtopic

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import importlib.util, json, shadowtopic
print(json.dumps({"source": importlib.util.find_spec("source") is not None,
                  "file": shadowtopic.__file__}))
"""


def test_the_repo_root_is_not_importable_in_the_test_process():
    assert importlib.util.find_spec("source") is None
    assert not [e for e in sys.path if e in ("", ".") or Path(e).resolve() == REPO]


def test_shadowtopic_comes_from_the_installed_distribution_not_the_source_tree():
    file = Path(shadowtopic.__file__)
    assert not file.is_relative_to(REPO / "source"), file
    # the strict editable install puts a .pth in site-packages naming its link tree under
    # build/; the package must be found there, i.e. through what the distribution installed
    dist = importlib.metadata.distribution("shadowtopic")
    pths = [Path(dist.locate_file(f)) for f in dist.files or () if f.suffix == ".pth"]
    roots = {Path(line.strip()) for pth in pths for line in pth.read_text().splitlines()
             if line.strip() and not line.startswith(("#", "import"))}
    assert file.parent.parent in roots, (file, roots)


def test_a_subprocess_of_a_test_cannot_import_the_repo_root_either():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=60, cwd=str(REPO), env=dict(os.environ),
                         check=True).stdout
    seen = json.loads(out)
    assert seen["source"] is False
    assert not Path(seen["file"]).is_relative_to(REPO / "source"), seen["file"]
