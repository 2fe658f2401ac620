"""Range reads of every MetadataStore (MemoryStore and EtcdStore on a real etcd): a prefix
whole and at one revision, page by page, and key listings in pages. Part of the contract
suite (tests/test_source/metadata/test_metadata_contract.py holds the rest).
"""
from __future__ import annotations

import uuid

import pytest

from shadowtopic.metadata import Put, Snapshot

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def p() -> str:
    """A key prefix private to this test."""
    return f"/t/{uuid.uuid4().hex}/"


def test_get_prefix_and_delete_prefix(store, p, arun):
    async def body():
        for k in ("a/2", "a/1", "a/sub/x", "ab", "b/1"):
            await store.put(p + k, k.encode())
        snap = await store.get_prefix(p + "a/")
        assert isinstance(snap, Snapshot)
        assert [kv.key for kv in snap.items] == [p + "a/1", p + "a/2", p + "a/sub/x"]
        assert snap.revision >= max(kv.mod_revision for kv in snap.items)

        assert await store.delete(p + "a/", prefix=True) == 3
        assert [kv.key for kv in (await store.get_prefix(p)).items] == [p + "ab", p + "b/1"]
        assert await store.delete(p + "a/", prefix=True) == 0
    arun(body())


def test_get_prefix_of_more_than_a_grpc_message(store, p, arun):
    """A prefix whose keys and values add up past gRPC's 4 MiB message limit (100,000
    subscriptions of a topic were 10 MB) reads whole, in key order, at one revision."""
    async def body():
        value = b"v" * 2048
        names = [f"{p}k/{i:05d}" for i in range(2_600)]  # 5.3 MB
        for i in range(0, len(names), 500):
            assert (await store.txn([], [Put(k, value) for k in names[i:i + 500]])).succeeded
        snap = await store.get_prefix(p + "k/")
        assert [kv.key for kv in snap.items] == names
        assert all(kv.value == value for kv in snap.items)
        assert snap.revision == max(kv.mod_revision for kv in snap.items)
    arun(body())


def test_get_prefix_pages_at_one_revision(store, p, arun, monkeypatch):
    """Read page by page, a prefix is still one revision's: a key written between two pages
    is not in it (etcd; the memory twin reads in one step)."""
    from shadowtopic.metadata import etcd as etcd_store

    monkeypatch.setattr(etcd_store, "PAGE_KEYS", 2)

    async def body():
        for i in range(7):
            await store.put(f"{p}{i}", b"x")
        before = await store.get_prefix(p)
        calls = []
        real = getattr(store, "_call", None)
        if real is not None:  # etcd: write a key after the first page
            async def call(fn, *args):
                calls.append(1)
                if len(calls) == 2:
                    await store.put(f"{p}3a", b"late")
                return await real(fn, *args)
            store._call = call
        try:
            snap = await store.get_prefix(p)
        finally:
            if real is not None:
                del store._call
        assert [kv.key for kv in snap.items] == [kv.key for kv in before.items]
        if calls:  # etcd: the late key was written while the pages were read
            late = await store.get(f"{p}3a")
            assert late is not None and snap.revision < late.mod_revision
            assert len(calls) > 4, "the prefix was not read in pages"
    arun(body())


def test_get_keys_pages_in_key_order(store, p, arun):
    async def body():
        names = ["a/1", "a/10", "a/2", "a/sub/x", "a/\u00e9", "ab", "b/1"]
        for k in names:
            await store.put(p + k, b"value")
        under_a = sorted(p + k for k in names if k.startswith("a/"))
        assert await store.get_keys(p + "a/") == under_a
        pages, after = [], ""
        while True:
            page = await store.get_keys(p + "a/", after, limit=2)
            assert len(page) <= 2
            pages += page
            if len(page) < 2:
                break
            after = page[-1]
        assert pages == under_a
        assert await store.get_keys(p + "a/", p + "a/2", 10) == under_a[3:]
        assert await store.get_keys(p + "a/", p + "b", 10) == []
        assert await store.get_keys(p + "none/") == []
    arun(body())
