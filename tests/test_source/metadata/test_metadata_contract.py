"""One contract suite for every MetadataStore: MemoryStore and EtcdStore (real etcd).

Tests on etcd share the session server, so each test writes under its own key prefix and
asserts revisions relative to what it observed (never absolute values).
"""
from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from support.outage import Outage
from support.waiting import wait_for_async

from shadowtopic.metadata import (
    Compare,
    Delete,
    LeaseNotFound,
    MemoryStore,
    MetadataError,
    MetadataUnavailable,
    Put,
    RevisionCompacted,
    Snapshot,
    WatchEvent,
)
from shadowtopic.metadata.follow import PrefixFollower

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def p() -> str:
    """A key prefix private to this test."""
    return f"/t/{uuid.uuid4().hex}/"


# ---- helpers ------------------------------------------------------------------------------

async def next_batch(watch, timeout: float = 5.0) -> list[WatchEvent]:
    return await asyncio.wait_for(watch.__anext__(), timeout)


async def collect(watch, n_events: int, timeout: float = 5.0) -> list[list[WatchEvent]]:
    """Read batches until at least `n_events` events arrived (bounded in time)."""
    deadline = time.monotonic() + timeout
    batches: list[list[WatchEvent]] = []
    while sum(map(len, batches)) < n_events:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"only {batches} within {timeout}s, wanted {n_events} events")
        batches.append(await asyncio.wait_for(watch.__anext__(), remaining))
    return batches


async def no_more_events(watch, wait: float = 0.3) -> None:
    try:
        batch = await asyncio.wait_for(watch.__anext__(), wait)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected events {batch}")


def flat(batches):
    return [(e.type, e.key, e.value, e.mod_revision) for b in batches for e in b]


def assert_revisions_not_split(batches):
    """Events of one revision (one txn) arrive in one batch, batches in revision order."""
    seen: dict[int, int] = {}
    last = 0
    for i, batch in enumerate(batches):
        for e in batch:
            assert e.mod_revision >= last, f"out of order: {batches}"
            last = e.mod_revision
            assert seen.setdefault(e.mod_revision, i) == i, f"revision split: {batches}"


# ---- KV basics ----------------------------------------------------------------------------

def test_get_put_delete_versions(store, p, arun):
    async def body():
        assert await store.get(p + "k") is None
        r1 = await store.put(p + "k", b"v1")
        kv = await store.get(p + "k")
        assert (kv.key, kv.value, kv.version) == (p + "k", b"v1", 1)
        assert kv.create_revision == kv.mod_revision == r1
        assert kv.lease == 0

        r2 = await store.put(p + "k", b"v2")
        assert r2 > r1
        kv = await store.get(p + "k")
        assert (kv.value, kv.version, kv.create_revision, kv.mod_revision) == (b"v2", 2, r1, r2)

        assert await store.delete(p + "k") == 1
        assert await store.get(p + "k") is None
        before = (await store.get_prefix(p)).revision
        assert await store.delete(p + "k") == 0
        res = await store.txn([], [Delete(p + "missing")])
        assert res.succeeded and res.revision == before  # nothing deleted: no new revision

        r3 = await store.put(p + "k", b"v3")  # re-create: version and create_revision reset
        kv = await store.get(p + "k")
        assert (kv.version, kv.create_revision, kv.mod_revision) == (1, r3, r3)
        assert r3 > before
    arun(body())


def test_memory_revision_starts_like_etcd(arun):
    async def body():
        s = MemoryStore()
        assert (await s.get_prefix("")).revision == 1  # etcd: empty store is at revision 1
        assert await s.put("/a", b"x") == 2
        assert await s.put("/a", b"x") == 3  # same value still a write
        assert (await s.txn([Compare("/a", "version", "==", 0)], [Put("/b", b"")])).revision == 3
        await s.close()
    arun(body())


def test_txn_one_revision_for_all_ops(store, p, arun):
    async def body():
        await store.put(p + "old/1", b"")
        await store.put(p + "old/2", b"")
        res = await store.txn([], [Put(p + "x", b"1"), Put(p + "y", b"2"),
                                   Delete(p + "old/", prefix=True)])
        assert res.succeeded
        x, y = await store.get(p + "x"), await store.get(p + "y")
        assert x.mod_revision == y.mod_revision == x.create_revision == res.revision
        assert (await store.get_prefix(p + "old/")).items == []
        assert (await store.get_prefix(p)).revision == res.revision
    arun(body())


def test_memory_each_write_bumps_revision_by_one(arun):
    async def body():
        s = MemoryStore()
        r = await s.put("/k", b"")
        assert (await s.txn([], [Put("/a", b""), Put("/b", b"")])).revision == r + 1
        assert await s.delete("/", prefix=True) == 3
        assert (await s.get_prefix("/")).revision == r + 2
    arun(body())


COMPARE_CASES = [
    # existing key "k": value b"m", version 2, created at c, modified at m (c < m)
    ("version", "==", 2, True), ("version", "!=", 2, False), ("version", "<", 3, True),
    ("version", ">", 2, False), ("version", ">", 1, True), ("version", "==", 0, False),
    ("create_revision", "==", "c", True), ("create_revision", "<", "m", True),
    ("create_revision", ">", "c", False), ("create_revision", "!=", "m", True),
    ("mod_revision", "==", "m", True), ("mod_revision", "==", "c", False),
    ("mod_revision", ">", "c", True), ("mod_revision", "<", "m", False),
    ("value", "==", b"m", True), ("value", "!=", b"m", False), ("value", "!=", b"x", True),
    ("value", "<", b"n", True), ("value", "<", b"m", False), ("value", ">", b"a", True),
    ("value", ">", b"z", False), ("value", "==", None, False), ("value", "!=", None, True),
]
MISSING_CASES = [
    ("version", "==", 0, True), ("version", ">", 0, False), ("version", "<", 1, True),
    ("create_revision", "==", 0, True), ("create_revision", "!=", 0, False),
    ("mod_revision", "==", 0, True), ("mod_revision", ">", 0, False),
    ("value", "==", None, True), ("value", "!=", None, False),
    # etcd: a value compare against a missing key fails, whatever the operator
    ("value", "==", b"", False), ("value", "!=", b"x", False), ("value", ">", b"", False),
]


def test_txn_compare_kinds(store, p, arun):
    async def body():
        c = await store.put(p + "k", b"first")
        m = await store.put(p + "k", b"m")
        cases = [(p + "k", t, op, {"c": c, "m": m}.get(v, v), want)
                 for t, op, v, want in COMPARE_CASES]
        cases += [(p + "missing", t, op, v, want) for t, op, v, want in MISSING_CASES]
        failures = []
        for i, (key, target, op, operand, want) in enumerate(cases):
            res = await store.txn([Compare(key, target, op, operand)],
                                  [Put(p + f"r/{i}", b"success")], [Put(p + f"r/{i}", b"failure")])
            got = (await store.get(p + f"r/{i}")).value
            if res.succeeded != want or got != (b"success" if want else b"failure"):
                failures.append((key, target, op, operand, want, res.succeeded, got))
        assert not failures

        # all compares must hold (AND); the failure branch runs otherwise
        both = [Compare(p + "k", "value", "==", b"m"), Compare(p + "k", "version", "==", 2)]
        assert (await store.txn(both, [])).succeeded
        one_false = [both[0], Compare(p + "missing", "version", ">", 0)]
        res = await store.txn(one_false, [Put(p + "s", b"")], [Delete(p + "k")])
        assert not res.succeeded
        assert await store.get(p + "s") is None and await store.get(p + "k") is None
        assert res.revision > m  # the failure branch wrote
    arun(body())


def test_txn_failure_without_ops_keeps_revision(store, p, arun):
    async def body():
        r = await store.put(p + "k", b"v")
        res = await store.txn([Compare(p + "k", "value", "==", b"other")], [Put(p + "k", b"x")])
        assert not res.succeeded and res.revision == r
        assert (await store.get(p + "k")).value == b"v"
    arun(body())


def test_txn_rejects_bad_requests(store, p, arun):
    async def body():
        with pytest.raises(ValueError):
            await store.txn([], [Put(p + "a", b"1"), Put(p + "a", b"2")])
        with pytest.raises(ValueError):
            await store.txn([], [Put(p + "d/a", b"1"), Delete(p + "d/", prefix=True)])
        with pytest.raises(ValueError):
            await store.txn([Compare(p + "a", "version", "==", b"1")], [])
        with pytest.raises(ValueError):
            await store.txn([Compare(p + "a", "value", "<", None)], [])
        assert (await store.get_prefix(p)).items == []
    arun(body())


def test_create_and_cas(store, p, arun):
    async def body():
        assert await store.create(p + "k", b"1")
        assert not await store.create(p + "k", b"2")
        kv = await store.get(p + "k")
        assert kv.value == b"1"

        assert not await store.cas(p + "k", b"x", kv.mod_revision + 1)
        assert await store.cas(p + "k", b"3", kv.mod_revision)
        assert not await store.cas(p + "k", b"4", kv.mod_revision)  # stale now
        assert (await store.get(p + "k")).value == b"3"

        assert await store.cas(p + "new", b"n", 0)  # 0 = must be absent
        assert not await store.cas(p + "new", b"n2", 0)
        new = await store.get(p + "new")
        extra = [Compare(p + "k", "value", "==", b"nope")]
        assert not await store.cas(p + "new", b"n3", new.mod_revision, extra)
        extra = [Compare(p + "k", "value", "==", b"3")]
        assert await store.cas(p + "new", b"n3", new.mod_revision, extra)
    arun(body())


def test_next_id_unique_under_concurrency(store, p, arun):
    async def body():
        assert await store.next_id(p + "seq") == 1
        ids = await asyncio.gather(*(store.next_id(p + "seq") for _ in range(20)))
        assert sorted(ids) == list(range(2, 22))
        assert (await store.get(p + "seq")).value == b"21"
    arun(body())


# ---- leases -------------------------------------------------------------------------------

def test_lease_expiry_deletes_keys_with_events(store, p, arun):
    async def body():
        lease = await store.grant_lease(1)
        start = await store.put(p + "a", b"1", lease)
        await store.put(p + "b", b"2", lease)
        await store.put(p + "plain", b"3")
        assert (await store.get(p + "a")).lease == lease
        watch = store.watch_prefix(p, start)
        try:
            assert len(flat(await collect(watch, 3))) == 3  # the puts
            # idle watcher: the delete events come from lease expiry alone (etcd: TTL >= 2 s)
            batches = await collect(watch, 2, timeout=10)
            events = flat(batches)
            assert [(t, k) for t, k, _, _ in events] == [("delete", p + "a"), ("delete", p + "b")]
            assert len(batches) == 1 and events[0][3] == events[1][3]  # one revision
        finally:
            await watch.aclose()
        assert await store.get(p + "a") is None and await store.get(p + "b") is None
        assert (await store.get(p + "plain")).value == b"3"
        with pytest.raises(LeaseNotFound):
            await store.refresh_lease(lease)
    arun(body())


def test_lease_revoke(store, p, arun):
    async def body():
        lease = await store.grant_lease(30)
        await store.put(p + "a", b"1", lease)
        assert await store.create(p + "b", b"2", lease)
        await store.put(p + "c", b"3", lease)
        await store.put(p + "c", b"3")  # a put without the lease detaches the key
        await store.refresh_lease(lease)
        await store.revoke_lease(lease)
        assert [kv.key for kv in (await store.get_prefix(p)).items] == [p + "c"]
        with pytest.raises(LeaseNotFound):
            await store.refresh_lease(lease)
        with pytest.raises(LeaseNotFound):
            await store.revoke_lease(lease)
        with pytest.raises(LeaseNotFound):
            await store.put(p + "d", b"", lease)
        with pytest.raises(LeaseNotFound):
            await store.txn([], [Put(p + "d", b"", lease)])
        assert await store.get(p + "d") is None
        with pytest.raises(ValueError):
            await store.grant_lease(0)
    arun(body())


def test_lease_refresh_keeps_alive(store, p, arun):
    async def body():
        lease = await store.grant_lease(1)
        await store.put(p + "k", b"v", lease)
        try:
            t_end = time.monotonic() + 3.0  # beyond the TTL (etcd rounds it up to 2 s)
            while time.monotonic() < t_end:
                await store.refresh_lease(lease)
                assert await store.get(p + "k") is not None
                await asyncio.sleep(0.3)
            # stop refreshing: it goes away
            await wait_for_async(lambda: _absent(store, p + "k"), timeout=10)
        finally:
            try:
                await store.revoke_lease(lease)
            except LeaseNotFound:
                pass
    arun(body())


async def _absent(store, key):
    return await store.get(key) is None


# ---- watches ------------------------------------------------------------------------------

def test_watch_from_past_revision_in_order(store, p, arun):
    async def body():
        r1 = await store.put(p + "a", b"1")
        await store.put(p + "x", b"x")
        await store.put(p + "b", b"2")
        await store.delete(p + "a")
        res = await store.txn([], [Put(p + "c", b"3"), Put(p + "d", b"4"), Delete(p + "b")])
        await store.put("/elsewhere/" + p, b"not watched")
        watch = store.watch_prefix(p, r1)
        try:
            batches = await collect(watch, 7)
            events = flat(batches)
            assert [(t, k[len(p):], v) for t, k, v, _ in events] == [
                ("put", "a", b"1"), ("put", "x", b"x"), ("put", "b", b"2"),
                ("delete", "a", b""), ("put", "c", b"3"), ("put", "d", b"4"), ("delete", "b", b"")]
            assert events[0][3] == r1
            assert [e[3] for e in events[-3:]] == [res.revision] * 3
            assert_revisions_not_split(batches)
            # live events after the backlog
            live = await store.put(p + "e", b"5")
            assert flat([await next_batch(watch)]) == [("put", p + "e", b"5", live)]
            res2 = await store.txn([], [Put(p + "f", b"6"), Put(p + "g", b"7")])
            assert flat([await next_batch(watch)]) == [("put", p + "f", b"6", res2.revision),
                                                       ("put", p + "g", b"7", res2.revision)]
            await no_more_events(watch)
        finally:
            await watch.aclose()
    arun(body())


def test_watch_filters_prefix_and_start_revision(store, p, arun):
    async def body():
        now = (await store.get_prefix(p)).revision
        watch = store.watch_prefix(p + "w/", now + 2)  # starts in the future
        try:
            first = asyncio.ensure_future(watch.__anext__())  # the watch is live before the puts
            await asyncio.sleep(0.2)
            await store.put(p + "w/skipped", b"")  # now + 1: before the start revision
            await store.put(p + "x", b"")  # other prefix
            r = await store.put(p + "w/seen", b"")
            assert flat([await asyncio.wait_for(first, 5)]) == [("put", p + "w/seen", b"", r)]
            await no_more_events(watch)
        finally:
            await watch.aclose()
    arun(body())


def test_compaction(store, p, arun):
    async def body():
        r1 = await store.put(p + "k", b"1")
        await store.put(p + "k", b"2")
        r3 = await store.put(p + "k", b"3")
        r4 = await store.put(p + "k", b"4")
        await store.compact(r3)
        await store.compact(r1)  # older than the compaction point: no-op
        with pytest.raises(MetadataError):
            await store.compact(r4 + 1000)  # future revision
        with pytest.raises(RevisionCompacted) as info:
            watch = store.watch_prefix(p, r1)
            try:
                await next_batch(watch)
            finally:
                await watch.aclose()
        assert info.value.compact_revision >= r3
        watch = store.watch_prefix(p, r3)  # the compaction revision itself is still there
        try:
            events = flat(await collect(watch, 2))
            assert events == [("put", p + "k", b"3", r3), ("put", p + "k", b"4", r4)]
        finally:
            await watch.aclose()
        kv = await store.get(p + "k")  # compaction keeps current values
        assert (kv.value, kv.version, kv.create_revision) == (b"4", 4, r1)
    arun(body())


class Follower:
    """Records what a PrefixFollower delivers and keeps the resulting view."""

    def __init__(self):
        self.snapshots: list[Snapshot] = []
        self.batches: list[list[WatchEvent]] = []
        self.view: dict[str, bytes] = {}

    async def on_snapshot(self, snap: Snapshot) -> None:
        self.snapshots.append(snap)
        self.view = {kv.key: kv.value for kv in snap.items}

    async def on_events(self, events: list[WatchEvent]) -> None:
        self.batches.append(events)
        for e in events:
            if e.type == "put":
                self.view[e.key] = e.value
            else:
                self.view.pop(e.key, None)


def _follow(store, prefix, on_snapshot, on_events, **kw) -> PrefixFollower:
    """Follow `prefix` from a task (the first list is retried while the store is down)."""
    follower = PrefixFollower(store, prefix, on_snapshot, on_events, **kw)
    follower.starting = asyncio.create_task(follower.start_retrying())
    return follower


async def _stop(follower: PrefixFollower) -> None:
    follower.starting.cancel()
    await asyncio.gather(follower.starting, return_exceptions=True)
    await follower.close()


def test_a_prefix_follower_lists_then_watches(store, p, arun):
    async def body():
        await store.put(p + "a", b"1")
        await store.put(p + "b", b"2")
        f = Follower()
        task = _follow(store, p, f.on_snapshot, f.on_events)
        try:
            await wait_for_async(lambda: _true(f.snapshots), timeout=5)
            assert f.view == {p + "a": b"1", p + "b": b"2"}
            await store.put(p + "c", b"3")
            await store.delete(p + "a")
            await store.put("/elsewhere" + p, b"x")
            await wait_for_async(lambda: _true(f.view == {p + "b": b"2", p + "c": b"3"}),
                                 timeout=5)
            assert len(f.snapshots) == 1
            assert all(e.key.startswith(p) for b in f.batches for e in b)
        finally:
            await _stop(task)
    arun(body())


async def _true(value):
    return bool(value)


def test_a_prefix_follower_relists_after_compaction(store, p, arun):
    async def body():
        await store.put(p + "a", b"1")
        f = Follower()

        async def on_snapshot(snap):
            await f.on_snapshot(snap)
            if len(f.snapshots) == 1:
                # before the follower starts watching from snap.revision + 1, move on and
                # compact past it: the watch must fail and the follower must re-list
                await store.put(p + "b", b"2")
                await store.delete(p + "a")
                await store.compact(await store.put(p + "c", b"3"))

        task = _follow(store, p, on_snapshot, f.on_events, retry_delay=0.05)
        try:
            await wait_for_async(lambda: _true(len(f.snapshots) >= 2), timeout=5)
            assert f.view == {p + "b": b"2", p + "c": b"3"}
            assert f.batches == []
            await store.put(p + "d", b"4")
            await wait_for_async(lambda: _true(p + "d" in f.view), timeout=5)
        finally:
            await _stop(task)
    arun(body())


# ---- unavailability -----------------------------------------------------------------------

@pytest.fixture(params=["memory",
                        pytest.param("etcd-stop", marks=pytest.mark.integration)])
def outage(request):
    o = Outage(request.param)
    yield o
    o.close()


async def _until_available(store, timeout=15.0):
    async def ok():
        try:
            await store.get("/probe")
            return True
        except MetadataUnavailable:
            return False
    await wait_for_async(ok, timeout=timeout, interval=0.1)


def test_unavailable_then_recovers(outage, arun):
    store = outage.store

    async def body():
        r = await store.put("/k", b"before")
        watch = store.watch_prefix("/", r + 1)
        pending = asyncio.ensure_future(watch.__anext__())
        await asyncio.sleep(0.2)
        await asyncio.to_thread(outage.down)
        t0 = time.monotonic()
        with pytest.raises(MetadataUnavailable):
            await asyncio.wait_for(pending, 10)  # the open watch breaks
        for call in (store.get("/k"), store.put("/k", b"x"), store.get_prefix("/"),
                     store.txn([], [Put("/k", b"y")]), store.grant_lease(5)):
            with pytest.raises(MetadataUnavailable):
                await call
        assert time.monotonic() - t0 < 8, "MetadataUnavailable must come promptly"
        await watch.aclose()
        with pytest.raises(MetadataUnavailable):
            await next_batch(store.watch_prefix("/", 1))

        await asyncio.to_thread(outage.up)
        await _until_available(store)
        assert (await store.get("/k")).value == b"before"  # nothing written while down
        r2 = await store.put("/k", b"after")
        assert r2 > r
        lease = await store.grant_lease(10)
        await store.refresh_lease(lease)
        await store.revoke_lease(lease)
    arun(body(), timeout=50)


def test_a_prefix_follower_across_an_outage(outage, arun):
    store = outage.store

    async def body():
        await store.put("/f/a", b"1")
        f = Follower()
        task = _follow(store, "/f/", f.on_snapshot, f.on_events, retry_delay=0.1)
        try:
            await wait_for_async(lambda: _true(f.view == {"/f/a": b"1"}), timeout=5)
            await store.put("/f/b", b"2")
            await wait_for_async(lambda: _true("/f/b" in f.view), timeout=5)
            await asyncio.to_thread(outage.down)
            await asyncio.sleep(0.5)
            await asyncio.to_thread(outage.up)
            await _until_available(store)
            await store.put("/f/c", b"3")
            await store.delete("/f/a")
            await wait_for_async(lambda: _true(f.view == {"/f/b": b"2", "/f/c": b"3"}),
                                 timeout=10)
            assert len(f.snapshots) >= 2  # re-listed after the outage
        finally:
            await _stop(task)
    arun(body(), timeout=50)


def test_memory_leases_survive_outage_like_etcd(arun):
    async def body():
        s = MemoryStore()
        lease = await s.grant_lease(1)
        await s.put("/k", b"", lease)
        s.set_available(False)
        await asyncio.sleep(1.2)  # the TTL passes while down: no expiry
        s.set_available(True)  # back with a full TTL again (etcd extends leases on restart)
        assert await s.get("/k") is not None
        await wait_for_async(lambda: _absent(s, "/k"), timeout=5)
        await s.close()
    arun(body())


def test_closed_store(store, p, arun):
    async def body():
        r = await store.put(p + "k", b"")
        watch = store.watch_prefix(p, r + 1)
        pending = asyncio.ensure_future(watch.__anext__())
        await asyncio.sleep(0.1)
        await store.close()
        with pytest.raises((StopAsyncIteration, MetadataUnavailable)):
            await asyncio.wait_for(pending, 5)
        with pytest.raises(MetadataUnavailable):
            await store.get(p + "k")
    arun(body())
