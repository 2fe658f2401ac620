"""One contract suite for `KeyFollower` (source/metadata/follow.py), the one way to follow a
metadata key, run against MemoryStore and a real etcd.

Tests on the session etcd write under a key prefix of their own; tests that take the store
down (stop, kill -9, pause) run a private etcd, never the session one.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import asynccontextmanager

import pytest
from support.outage import Outage
from support.waiting import wait_for_async

from shadowtopic.metadata import MemoryStore, MetadataError, MetadataUnavailable, RevisionCompacted
from shadowtopic.metadata.follow import KeyFollower

pytestmark = pytest.mark.timeout(90)

RETRY = 0.1  # the followers' retry delay in these tests


@pytest.fixture
def key() -> str:
    """A key private to this test."""
    return f"/t/{uuid.uuid4().hex}/k"


class Applied:
    """Records what a follower applied: (value, revision) in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[bytes | None, int]] = []

    def __call__(self, value: bytes | None, revision: int) -> None:
        self.calls.append((value, revision))

    @property
    def values(self) -> list[bytes | None]:
        return [v for v, _ in self.calls]

    @property
    def last(self) -> bytes | None:
        return self.calls[-1][0] if self.calls else None


@asynccontextmanager
async def following(store, key: str):
    """A started `KeyFollower` of `key` recording what it applies: (follower, Applied)."""
    seen = Applied()
    f = KeyFollower(store, key, seen, retry_delay=RETRY)
    await f.start()
    try:
        yield f, seen
    finally:
        await f.close()


async def _until_available(store, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await store.get("/probe")
            return
        except MetadataUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


# ---- values ---------------------------------------------------------------------------------

def test_initial_value_updates_delete_recreate(store, key, arun):
    async def body():
        r1 = await store.put(key, b"v1")
        async with following(store, key) as (f, seen):
            assert seen.calls == [(b"v1", r1)] and f.revision == r1 and f.running
            r2 = await store.put(key, b"v2")
            await wait_for_async(lambda: f.revision == r2)
            await store.delete(key)
            await wait_for_async(lambda: seen.last is None and len(seen.calls) == 3)
            r4 = await store.put(key, b"v3")
            await wait_for_async(lambda: f.revision == r4)
            assert seen.calls[1] == (b"v2", r2)
            assert seen.values == [b"v1", b"v2", None, b"v3"]
            assert f.relists == 0
        assert not f.running
        await store.put(key, b"after close")
        await asyncio.sleep(0.2)
        assert seen.last == b"v3"
    arun(body())


def test_absent_key_then_created(store, key, arun):
    async def body():
        async with following(store, key) as (f, seen):
            assert seen.calls == []  # a key never held: its absence applies nothing
            r = await store.put(key, b"x")
            await wait_for_async(lambda: seen.calls == [(b"x", r)])
    arun(body())


def test_events_on_longer_keys_ignored(store, key, arun):
    async def body():
        await store.put(key, b"v1")
        async with following(store, key) as (f, seen):
            for longer in (key + "/jobs/1", key + "-jobs/1", key + "x"):
                await store.put(longer, b"other")
                await store.delete(longer)
            r = await store.put(key, b"v2")
            await wait_for_async(lambda: f.revision == r)
            assert seen.values == [b"v1", b"v2"]
    arun(body())


def test_refresh(store, key, arun):
    async def body():
        await store.put(key, b"v1")
        async with following(store, key) as (f, seen):
            assert not await f.refresh()  # nothing new
            r = await store.put(key, b"v2")
            await f.refresh()  # the refresh or the watch applies it: once
            await wait_for_async(lambda: f.revision == r)
            await asyncio.sleep(0.1)
            assert seen.values == [b"v1", b"v2"]
    arun(body())


def test_start_raises_when_the_first_list_fails(arun):
    async def body():
        s = MemoryStore()
        s.set_available(False)
        f = KeyFollower(s, "/k", Applied())
        with pytest.raises(MetadataUnavailable):
            await f.start()
        assert not f.running
        s.set_available(True)
        await f.start()
        assert f.running
        await f.close()
        await s.close()
    arun(body())


def test_start_retrying_goes_on_until_the_first_list_is_taken(arun):
    """Neither an unavailable store nor a first value `apply` cannot take yet stops a
    follower started with `start_retrying` (a source's shadow list: its replicators must
    start once they can, never stay silently stopped)."""
    async def body():
        s = MemoryStore()
        await s.put("/k", b"v1")
        s.set_available(False)
        seen = Applied()
        fail = [True]

        def apply(value, revision):
            if fail[0]:
                fail[0] = False
                raise ValueError("cannot take v1 yet")
            seen(value, revision)

        f = KeyFollower(s, "/k", apply, retry_delay=RETRY)
        starting = asyncio.create_task(f.start_retrying())
        await asyncio.sleep(5 * RETRY)
        assert not f.running and not starting.done()
        s.set_available(True)
        await asyncio.wait_for(starting, 5)
        assert f.running and seen.values == [b"v1"]
        await s.put("/k", b"v2")
        await wait_for_async(lambda: seen.values == [b"v1", b"v2"])
        await f.close()
        await s.close()
    arun(body())


def test_a_follower_closed_while_it_starts_follows_nothing(arun):
    async def body():
        s = MemoryStore()
        f = KeyFollower(s, "/k", Applied(), retry_delay=RETRY)
        s.set_available(False)
        starting = asyncio.create_task(f.start_retrying())
        await asyncio.sleep(2 * RETRY)
        await f.close()
        s.set_available(True)
        await asyncio.wait_for(starting, 5)
        assert not f.running
        await s.close()
    arun(body())


# ---- re-lists -------------------------------------------------------------------------------

def test_relists_after_compacted_revision(store, key, arun):
    async def body():
        await store.put(key, b"v1")
        seen = Applied()

        async def apply(value, revision):
            seen(value, revision)
            if len(seen.calls) == 1:
                # before `start` watches from the listed revision + 1, move on and compact
                # past it: the watch must fail and the follower must list again
                await store.put(key, b"v2")
                await store.put(key + "/other", b"")
                await store.compact(await store.put(key + "/other", b"x"))

        f = KeyFollower(store, key, apply, retry_delay=RETRY)
        await f.start()
        try:
            await wait_for_async(lambda: seen.last == b"v2")
            assert f.relists >= 1
            r = await store.put(key, b"v3")
            await wait_for_async(lambda: f.revision == r)
            assert seen.values == [b"v1", b"v2", b"v3"]
        finally:
            await f.close()
    arun(body())


class Faulty:
    """A store whose next watch fails in a chosen way (the rest goes to the real store)."""

    def __init__(self, store) -> None:
        self.store = store
        self.faults: list[str] = []
        self.list_faults: list[BaseException] = []
        self.watches = 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    async def get_prefix(self, prefix):
        if self.list_faults:
            raise self.list_faults.pop(0)
        return await self.store.get_prefix(prefix)

    async def watch_prefix(self, prefix, start_revision):
        self.watches += 1
        fault = self.faults.pop(0) if self.faults else None
        inner = self.store.watch_prefix(prefix, start_revision)
        try:
            if fault == "end":
                return
            if fault == "error":
                raise ValueError("a bug in the store")
            if fault == "metadata-error":
                raise MetadataError("etcd: PERMISSION_DENIED")
            if fault == "unavailable":
                raise MetadataUnavailable("down")
            if fault == "compacted":
                raise RevisionCompacted(compact_revision=start_revision + 1)
            if fault == "cancelled":
                raise asyncio.CancelledError()  # not the follower's: it must go on
            async for batch in inner:
                yield batch
        finally:
            await inner.aclose()


@pytest.mark.parametrize("fault", ["end", "error", "metadata-error", "unavailable",
                                   "compacted", "cancelled"])
def test_any_watch_failure_relists(store, key, fault, arun):
    async def body():
        faulty = Faulty(store)
        await store.put(key, b"v1")
        seen = Applied()
        # the first watch fails; so do the two lists after it (not MetadataUnavailable)
        faulty.faults = [fault]
        faulty.list_faults = []
        f = KeyFollower(faulty, key, seen, retry_delay=RETRY)
        await f.start()
        faulty.list_faults = [ValueError("a list failed oddly"), MetadataError("odd")]
        try:
            r = await store.put(key, b"v2")  # written while no watch runs: the re-list finds it
            await wait_for_async(lambda: f.revision == r)
            assert f.relists >= 1 and faulty.watches >= 2 and f.running
            r = await store.put(key, b"v3")  # and the new watch follows on
            await wait_for_async(lambda: f.revision == r)
            assert seen.values == [b"v1", b"v2", b"v3"]
        finally:
            await f.close()
        assert not f.running
    arun(body())


def test_failing_apply_is_offered_again(store, key, arun):
    async def body():
        await store.put(key, b"v1")
        seen = Applied()
        fail = [True]

        def apply(value, revision):
            if value == b"v2" and fail[0]:
                fail[0] = False
                raise ValueError("cannot apply v2 yet")
            seen(value, revision)

        f = KeyFollower(store, key, apply, retry_delay=RETRY)
        await f.start()
        try:
            r = await store.put(key, b"v2")
            await wait_for_async(lambda: f.revision == r)
            assert seen.values == [b"v1", b"v2"] and f.relists >= 1
        finally:
            await f.close()
    arun(body())


# ---- order ----------------------------------------------------------------------------------

def test_async_apply_serialized_and_monotonic(store, key, arun):
    async def body():
        await store.put(key, b"0")
        seen = Applied()
        inflight, most = [0], [0]

        async def apply(value, revision):
            inflight[0] += 1
            most[0] = max(most[0], inflight[0])
            await asyncio.sleep(0.02)  # a slow apply (an executor, starting replicators)
            seen(value, revision)
            inflight[0] -= 1

        f = KeyFollower(store, key, apply, retry_delay=RETRY)
        await f.start()
        try:
            last = 0
            for i in range(1, 21):
                last = await store.put(key, str(i).encode())
                if i % 4 == 0:  # refreshes race the watch for the same values
                    await asyncio.gather(f.refresh(), f.refresh())
            await wait_for_async(lambda: f.revision == last, timeout=10)
            assert most[0] == 1, "two applies ran at once"
            revisions = [r for _, r in seen.calls]
            assert revisions == sorted(set(revisions)), "applied out of order or twice"
            assert seen.last == b"20"
        finally:
            await f.close()
    arun(body())


class Stale:
    """A store whose next `get_prefix` answers with an old snapshot."""

    def __init__(self, store) -> None:
        self.store = store
        self.old = None

    def __getattr__(self, name):
        return getattr(self.store, name)

    async def get_prefix(self, prefix):
        if self.old is not None:
            old, self.old = self.old, None
            return old
        return await self.store.get_prefix(prefix)


def test_older_value_never_replaces_newer(store, key, arun):
    async def body():
        await store.put(key, b"v1")
        stale = Stale(store)
        old = await store.get_prefix(key)
        async with following(stale, key) as (f, seen):
            r = await store.put(key, b"v2")
            await wait_for_async(lambda: f.revision == r)
            stale.old = old  # a list that answers from before v2
            assert not await f.refresh()
            await store.delete(key)
            await wait_for_async(lambda: seen.last is None and len(seen.calls) == 3)
            stale.old = old  # an old list must not bring back the deleted value
            assert not await f.refresh()
            assert seen.values == [b"v1", b"v2", None]
    arun(body())


# ---- outages --------------------------------------------------------------------------------

@pytest.fixture(params=["memory",
                        pytest.param("etcd-stop", marks=pytest.mark.integration),
                        pytest.param("etcd-kill", marks=pytest.mark.integration),
                        pytest.param("etcd-pause", marks=pytest.mark.integration)])
def outage(request):
    o = Outage(request.param)
    yield o
    o.close()


def _follow_across(outage: Outage, down_for: float, arun) -> None:
    store = outage.store

    async def body():
        await store.put("/f/k", b"v1")
        seen = Applied()
        f = KeyFollower(store, "/f/k", seen, retry_delay=RETRY)
        await f.start()
        try:
            r = await store.put("/f/k", b"v2")
            await wait_for_async(lambda: f.revision == r)
            await asyncio.to_thread(outage.down)
            assert not await f.refresh()  # fails (the store is down): holds what it has
            await asyncio.sleep(down_for)
            await asyncio.to_thread(outage.up)
            await _until_available(store)
            r = await store.put("/f/k", b"v3")
            await store.put("/f/k/jobs/1", b"longer")
            await wait_for_async(lambda: f.revision == r, timeout=15)
            r = await store.put("/f/k", b"v4")  # and it goes on following
            await wait_for_async(lambda: f.revision == r, timeout=15)
            assert seen.values == [b"v1", b"v2", b"v3", b"v4"] and f.running
            if outage.kind in ("memory", "etcd-stop", "etcd-kill"):
                assert f.relists >= 1  # the watch broke: listed again
        finally:
            await f.close()
    arun(body(), timeout=80)


def test_outage_then_resume(outage, arun):
    _follow_across(outage, 1.0, arun)


@pytest.mark.slow
@pytest.mark.integration
def test_etcd_paused_past_the_stores_timeouts_then_resumed(arun):
    """12 s: more than twice the store's 5 s timeouts (make test keeps outages short; the
    20-25 s pauses users reported are the same case, only longer)."""
    o = Outage("etcd-pause")
    try:
        _follow_across(o, 12.0, arun)
    finally:
        o.close()
