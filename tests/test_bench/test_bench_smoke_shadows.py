"""`make bench`'s shadows part at a tiny size (a module of its own: support/bench_smoke.py)."""
from __future__ import annotations

import pytest
from support.bench_smoke import check_part


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.bench_smoke_long
@pytest.mark.timeout(660)
def test_shadows_runs_at_a_tiny_size(tmp_path):
    check_part("shadows", tmp_path)
