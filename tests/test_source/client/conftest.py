"""The client's unit tests talk to `FakeBroker` (support/fake_broker.py), a gRPC server in the
test process that records what the client sends and answers as a test scripts it."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.fake_broker import FakeBroker

from shadowtopic.client import Client


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    broker = FakeBroker()
    yield broker
    broker.stop()


@pytest.fixture
def client(fake: FakeBroker) -> Iterator[Client]:
    c = Client(fake.url, timeout=5)
    yield c
    c.close()
