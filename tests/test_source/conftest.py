"""The metadata store both of its contract suites run on (test_metadata_contract.py,
test_metadata_follow.py): the in-memory twin, and a real etcd (an integration test)."""
from __future__ import annotations

import asyncio

import pytest

from shadowtopic.metadata import EtcdStore, MemoryStore


@pytest.fixture(params=["memory", pytest.param("etcd", marks=pytest.mark.integration)])
def store(request):
    if request.param == "memory":
        s = MemoryStore()
    else:
        s = EtcdStore(request.getfixturevalue("etcd_server").endpoint, timeout=5.0)
    yield s
    asyncio.run(s.close())
