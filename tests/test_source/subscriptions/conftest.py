"""The subscription suites run each case over the in-memory view and the source's
ManagedLedger (support/subscriptions_harness.py's `Harness(kind, tmp_path)`)."""
from __future__ import annotations

import pytest


@pytest.fixture(params=["memory", "managed"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)
