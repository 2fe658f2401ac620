"""ShadowLedger (shadow/ledger.py): a read-only LedgerView that follows a real source
ManagedLedger's ledger list (over the metadata twin and over a real etcd) and reads the
source's files: the same entries with the same ids, writing nothing; the read engine and
the subscription engine work over it unchanged."""
from __future__ import annotations

import asyncio
import os
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import fakes
from support.fakes import Count
from support.waiting import wait_for_async

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import Policies
from shadowtopic.cursors.store import Fence, MemoryCursorStore
from shadowtopic.ledger import wal as walmod
from shadowtopic.ledger.managed import LedgerConfig, ManagedLedger
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import MetadataStore
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import common_pb2
from shadowtopic.read.engine import ReadEngine
from shadowtopic.read.positions import EARLIEST, Start
from shadowtopic.shadow.ledger import ShadowLedger
from shadowtopic.subscriptions import EXCLUSIVE, TopicSubscriptions

SEALED, OPEN = mpb.LedgerState.SEALED, mpb.LedgerState.OPEN
FIRST = MessageId(0, 0)  # entry 0 of ledger 0: where the read_all helper starts by default


# ---- harness ------------------------------------------------------------------------------

@pytest.fixture(params=["memory",
                        pytest.param("etcd", marks=pytest.mark.integration)])
def backend(request):
    return request.param


class SpyStore(MetadataStore):
    """The shadow's view of the store: reads pass through, every write is recorded (and
    passed on, so a test sees a write rather than an error). `after_list` runs once, right
    after the next `get_prefix` read its snapshot; `hold_watches` makes watches silent."""

    def __init__(self, inner: MetadataStore):
        self.inner = inner
        self.writes: list[tuple] = []
        self.after_list = None
        self.hold_watches = False
        self.gate: asyncio.Event | None = None  # set: watches deliver what they held back

    async def get(self, key):
        return await self.inner.get(key)

    async def get_prefix(self, prefix):
        snap = await self.inner.get_prefix(prefix)
        hook, self.after_list = self.after_list, None
        if hook is not None:
            await hook()
        return snap

    def watch_prefix(self, prefix, start_revision):
        if self.hold_watches:
            return self._silent()
        if self.gate is not None:
            return self._gated(self.inner.watch_prefix(prefix, start_revision), self.gate)
        return self.inner.watch_prefix(prefix, start_revision)

    @staticmethod
    async def _gated(watch, gate):
        try:
            async for events in watch:
                await gate.wait()
                yield events
        finally:
            await watch.aclose()

    @staticmethod
    async def _silent():
        await asyncio.Event().wait()
        yield []

    async def put(self, key, value, lease=0):
        self.writes.append(("put", key))
        return await self.inner.put(key, value, lease)

    async def delete(self, key, prefix=False):
        self.writes.append(("delete", key))
        return await self.inner.delete(key, prefix)

    async def txn(self, compares, success, failure=()):
        self.writes.append(("txn", success))
        return await self.inner.txn(compares, success, failure)

    async def grant_lease(self, ttl):
        self.writes.append(("grant_lease", ttl))
        return await self.inner.grant_lease(ttl)

    async def refresh_lease(self, lease):
        self.writes.append(("refresh_lease", lease))
        return await self.inner.refresh_lease(lease)

    async def revoke_lease(self, lease):
        self.writes.append(("revoke_lease", lease))
        return await self.inner.revoke_lease(lease)

    async def compact(self, revision):
        self.writes.append(("compact", revision))
        return await self.inner.compact(revision)

    async def close(self):
        pass  # the test closes the real store


class Env:
    """A source ManagedLedger and shadows of it over one store and one storage root."""

    def __init__(self, request, backend: str, tmp_path):
        self.request = request
        self.backend = backend
        ns = f"ns-{uuid.uuid4().hex[:8]}"  # the session etcd is shared by tests
        self.source = TopicName.parse(f"persistent://t/{ns}/src")
        self.shadow = TopicName.parse(f"persistent://t/{ns}/src-shadow")
        self.root = str(tmp_path / "storage")
        self.storage = Storage(self.root)
        self.executor = ThreadPoolExecutor(4)
        self.store: MetadataStore | None = None
        self.epoch = 0
        self.views: list = []

    async def __aenter__(self) -> Env:
        if self.backend == "memory":
            self.store = MemoryStore()
        else:
            from shadowtopic.metadata.etcd import EtcdStore
            server = self.request.getfixturevalue("etcd_server")
            self.store = EtcdStore(server.endpoint, timeout=5.0)
        return self

    async def __aexit__(self, *exc) -> None:
        for view in self.views:
            await view.close()
        await self.store.close()
        self.executor.shutdown(wait=True)

    async def open_source(self, **cfg) -> ManagedLedger:
        self.epoch += 1
        own_key = keys.ownership("c", self.source)
        value = mpb.Ownership(broker_id="b", epoch=self.epoch).SerializeToString()
        await self.store.put(own_key, value)
        ml = await ManagedLedger.open(self.source, self.store, self.storage, own_key, value,
                                      self.epoch, self.executor, LedgerConfig(**cfg))
        self.views.append(ml)
        return ml

    def new_shadow(self, store: MetadataStore | None = None) -> ShadowLedger:
        """A shadow as another broker has it: its own Storage object on the same root."""
        sl = ShadowLedger(self.shadow, self.source, store or self.store, Storage(self.root),
                          self.executor, retry_delay=0.05)
        self.views.append(sl)
        return sl

    async def open_shadow(self, store: MetadataStore | None = None) -> ShadowLedger:
        sl = self.new_shadow(store)
        await sl.start()
        return sl


def run(request, backend, tmp_path, test, timeout: float = 60):
    async def main():
        async with Env(request, backend, tmp_path) as env:
            await test(env)
    asyncio.run(asyncio.wait_for(main(), timeout))


def message(i: int) -> bytes:
    return common_pb2.Message(payload=f"m{i}".encode(), key=f"k{i % 3}".encode(),
                              properties={"i": str(i)}).SerializeToString()


async def append(ml: ManagedLedger, n: int, start: int = 0) -> tuple[int, int]:
    raws = [message(start + i) for i in range(n)]
    return await ml.append(raws, walmod.request_bytes(raws), sum(map(len, raws)))


async def read_all(view, start: MessageId = FIRST):
    out, pos = [], start
    while True:
        got = await view.read(pos, 7, 1 << 30)  # small reads: many cross ledger ends
        if not got:
            return out
        out += got
        pos = MessageId(got[-1].ledger_id, got[-1].entry_id + 1)


class Heard:
    def __init__(self):
        self.calls = []

    def on_entries(self):
        self.calls.append("entries")

    def on_trimmed(self, trimmed):
        self.calls.append(("trimmed", trimmed.ledgers))

    def on_closed(self, reason):
        self.calls.append(("closed", type(reason).__name__))

    @property
    def entries(self) -> int:
        return self.calls.count("entries")

    @property
    def trims(self) -> list:
        return [c[1] for c in self.calls if isinstance(c, tuple) and c[0] == "trimmed"]


async def three_ledgers(env, ml) -> tuple[list[mpb.LedgerInfo], int]:
    """Two sealed ledgers (5 and 6 entries) and an open one with 4 (in two batches)."""
    await append(ml, 5, 0)
    await ml.roll()
    await append(ml, 3, 5)
    await append(ml, 3, 8)
    await ml.roll()
    lid, _ = await append(ml, 2, 11)
    await append(ml, 2, 13)
    sealed = [i for i in ml.ledgers() if i.state == SEALED]
    assert [i.entries for i in sealed] == [5, 6]
    return sealed, lid


def files(root: str) -> dict[str, tuple[int, int]]:
    out = {}
    for d, _dirs, names in os.walk(root):
        for n in names:
            st = os.stat(os.path.join(d, n))
            out[os.path.relpath(os.path.join(d, n), root)] = (st.st_size, st.st_mtime_ns)
    return out


# ---- reads ----------------------------------------------------------------------------------

def test_reads_are_the_sources_entries_with_its_ids(request, backend, tmp_path):
    """Sealed ledgers from Parquet, the open ledger's confirmed range from the source's WAL:
    byte-identical entries, identical ids, and the same positions as the source's view."""
    async def test(env):
        ml = await env.open_source()
        sealed, open_lid = await three_ledgers(env, ml)
        sl = await env.open_shadow()
        # nothing replicated yet: the sealed ledgers only; the open one ends the view
        assert sl.source_ledger_ids() == [i.ledger_id for i in ml.ledgers()]
        assert sl.last_confirmed() == MessageId(sealed[-1].ledger_id, 5)
        assert sl.next_position() == MessageId(open_lid, 0)
        assert len(await read_all(sl)) == 11

        sl.on_replicated(ml.last_confirmed())
        src, sh = await read_all(ml), await read_all(sl)
        assert len(src) == 15 and src[-1].ledger_id == open_lid
        assert sh == src  # (ledger_id, entry_id, publish_ms, raw): ids and bytes
        assert [e.raw for e in sh] == [message(i) for i in range(15)]
        assert sl.ranges() == [r._replace(size_bytes=0) if not r.sealed else r
                               for r in ml.ranges()]
        assert sl.first_position() == ml.first_position()
        assert sl.last_confirmed() == ml.last_confirmed() == MessageId(open_lid, 3)
        assert sl.next_position() == ml.next_position()
        a, b = sealed[0].ledger_id, sealed[1].ledger_id
        probes = [MessageId(0, 0), MessageId(a, 3), MessageId(a, 5), MessageId(b, 0),
                  MessageId(b, 6), MessageId(open_lid, 2), MessageId(open_lid, 4),
                  MessageId(open_lid + 5, 0)]
        for p in probes:
            assert sl.valid_position(p) == ml.valid_position(p), p
            for q in probes:
                assert sl.entries_between(p, q) == ml.entries_between(p, q), (p, q)
        for t in sorted({e.publish_ms for e in src}) + [0, src[-1].publish_ms + 1]:
            assert await sl.position_at_time(t) == await ml.position_at_time(t), t
        assert sl.number_of_entries() == 15 and sl.entries_deleted == 0
        stats = sl.ledgers()
        assert [(i.ledger_id, i.entries) for i in stats] == \
            [(i.ledger_id, i.entries) for i in ml.ledgers()]
    run(request, backend, tmp_path, test)


def test_on_replicated_moves_forward_only_and_wakes_listeners_once(request, tmp_path):
    async def test(env):
        ml = await env.open_source()
        lid, _ = await append(ml, 5)
        sl = await env.open_shadow()
        heard = Heard()
        sl.add_listener(heard)
        assert sl.last_confirmed() is None and await sl.read(MessageId(0, 0), 10, 1 << 20) == []
        sl.on_replicated(MessageId(lid, 2))
        assert heard.entries == 1 and sl.last_confirmed() == MessageId(lid, 2)
        assert [e.entry_id for e in await read_all(sl)] == [0, 1, 2]
        sl.on_replicated(MessageId(lid, 2))   # resent
        sl.on_replicated(MessageId(lid, 1))   # older (R5)
        assert heard.entries == 1 and sl.last_confirmed() == MessageId(lid, 2)
        assert sl.next_position() == MessageId(lid, 3) and sl.replicated == MessageId(lid, 2)
        sl.on_replicated(MessageId(lid, 4, 3))  # an id with a partition index
        assert heard.entries == 2 and sl.last_confirmed() == MessageId(lid, 4)
        assert [e.raw for e in await sl.read(MessageId(lid, 3), 10, 1 << 20)] == \
            [message(3), message(4)]
        sl.remove_listener(heard)
        await append(ml, 1, 5)
        sl.on_replicated(ml.last_confirmed())
        assert heard.entries == 2
    run(request, "memory", tmp_path, test)


def test_follows_the_list_from_before_the_source_exists(request, backend, tmp_path):
    """A shadow started before the source has a ledger list follows it as it appears,
    rolls and seals; sealing alone makes entries readable (no replicator needed)."""
    async def test(env):
        sl = await env.open_shadow()
        heard = Heard()
        sl.add_listener(heard)
        assert sl.first_position() is None and sl.last_confirmed() is None
        assert sl.next_position() == MessageId(0, 0) and sl.ranges() == []
        ml = await env.open_source()
        await append(ml, 4)
        await wait_for_async(lambda: sl.source_ledger_ids() == [i.ledger_id for i in ml.ledgers()],
                         what="the open ledger")
        assert sl.last_confirmed() is None and heard.entries == 0
        first = await ml.roll()
        await wait_for_async(lambda: sl.last_confirmed() == MessageId(first.ledger_id, 3),
                         what="the sealed ledger")
        assert heard.entries >= 1
        assert await read_all(sl) == await read_all(ml)
        await append(ml, 3, 4)
        sl.on_replicated(ml.last_confirmed())
        assert await read_all(sl) == await read_all(ml)
        assert len(await read_all(sl)) == 7
    run(request, backend, tmp_path, test)


def test_an_update_while_it_starts_is_applied(request, backend, tmp_path):
    """The source's list changes after the shadow listed it but before its watch exists:
    the watch (from the listed revision + 1) brings it; nothing else would."""
    async def test(env):
        ml = await env.open_source()
        lid, _ = await append(ml, 3)
        spy = SpyStore(env.store)
        sl = env.new_shadow(spy)
        spy.after_list = ml.roll  # seals `lid` and opens the next ledger: two list writes
        await sl.start()
        assert sl.last_confirmed() is None  # what it listed: one open ledger, nothing more
        await wait_for_async(lambda: sl.last_confirmed() == MessageId(lid, 2),
                         what="the update made while it started")
        assert sl.source_ledger_ids() == [i.ledger_id for i in ml.ledgers()]
        assert [e.raw for e in await read_all(sl)] == [message(i) for i in range(3)]
        assert sl._follower.relists == 0 and spy.writes == []
    run(request, backend, tmp_path, test)


def test_ids_replicated_before_it_starts_are_kept(request, tmp_path):
    async def test(env):
        ml = await env.open_source()
        lid, _ = await append(ml, 3)
        sl = env.new_shadow()
        heard = Heard()
        sl.add_listener(heard)
        sl.on_replicated(MessageId(lid, 1))  # the replicator is quicker than the start
        assert sl.last_confirmed() is None
        await sl.start()
        assert sl.last_confirmed() == MessageId(lid, 1) and heard.entries == 1
        assert [e.raw for e in await read_all(sl)] == [message(0), message(1)]
    run(request, "memory", tmp_path, test)


def test_it_lists_again_when_the_watched_revision_was_compacted(request, backend, tmp_path):
    async def test(env):
        ml = await env.open_source()
        await append(ml, 3)
        spy = SpyStore(env.store)
        sl = env.new_shadow(spy)

        async def meanwhile():
            await ml.roll()
            rev = (await env.store.get_prefix("/no-such-key/")).revision
            await env.store.compact(rev)  # the watch from the listed revision + 1 fails

        spy.after_list = meanwhile
        await sl.start()
        await wait_for_async(lambda: sl.last_confirmed() == ml.last_confirmed(),
                         what="the list read again")
        assert sl._follower.relists >= 1
        assert await read_all(sl) == await read_all(ml)
    run(request, backend, tmp_path, test)


def test_a_read_of_a_ledger_sealed_meanwhile_reads_the_list_again(request, backend, tmp_path):
    """The source seals the open ledger and removes its WAL; the shadow has not heard (its
    watch is silent): a read finds the WAL gone, reads the list again and gets the
    entries from Parquet. A file retention deleted meanwhile is skipped the same way."""
    async def test(env):
        ml = await env.open_source()
        await append(ml, 4)
        spy = SpyStore(env.store)
        spy.hold_watches = True
        sl = await env.open_shadow(spy)
        sl.on_replicated(ml.last_confirmed())
        sealed = await ml.roll()
        assert not os.path.exists(env.storage.wal_path(
            env.storage.wal_rel(env.source, sealed.ledger_id)))
        assert [i.state for i in sl.ledgers()][0] == OPEN  # it has not heard
        assert await read_all(sl) == await read_all(ml)
        assert sl.ledgers()[0].state == SEALED
        second, _ = await append(ml, 2, 4)
        await ml.roll()
        spy2 = SpyStore(env.store)
        spy2.hold_watches = True
        sl2 = await env.open_shadow(spy2)  # lists both sealed ledgers, then hears nothing
        heard = Heard()
        sl2.add_listener(heard)
        assert sl2.first_position() == MessageId(sealed.ledger_id, 0)
        # retention deletes the first ledger and its file
        assert await ml.apply_retention(0, -1, MessageId(second, 0)) == (1, 4)
        got = await read_all(sl2)  # its list still names that ledger; the file is gone
        assert got == await read_all(ml) and len(got) == 2
        assert sl2.first_position() == MessageId(second, 0)
        assert [[r.ledger_id for r in t] for t in heard.trims] == [[sealed.ledger_id]]
        assert spy.writes == [] and spy2.writes == []
    run(request, backend, tmp_path, test)


def test_a_later_ledger_waits_until_the_earlier_ones_end_is_known(request, tmp_path):
    """The replicator (after an auto-reset, R7) reports an id in a later ledger while an
    earlier one is still unsealed and its last entries were never reported: the view
    does not skip them (valid_position never moves a reader past them); the earlier
    ledger's WAL is complete by then, and counting it reveals the rest. A sealed ledger
    behind an unsealed one waits the same way."""
    async def test(env):
        # a sealed ledger the source made (its file and record), under another id below
        ml = await env.open_source()
        await append(ml, 3, 100)
        sealed = await ml.roll()
        st = env.storage
        lids = [1001, 1002, 1003, 1004]
        rels = {lid: st.wal_rel(env.source, lid) for lid in lids}

        def write_wal(lid, batches):
            f = walmod.WalFile.create(st.wal_path(rels[lid]), lid)
            first = 0
            for n in batches:
                raws = [message(lid * 10 + first + i) for i in range(n)]
                f.write_sync(walmod.encode_batch(first, 1000 + first, walmod.request_bytes(raws),
                                                 n))
                first += n
            f.close()

        write_wal(1001, [3, 4])
        write_wal(1002, [2])
        write_wal(1004, [1])
        copy = mpb.LedgerInfo()
        copy.CopyFrom(sealed)
        copy.ledger_id = 1003
        lst = mpb.LedgerList(ledgers=[
            mpb.LedgerInfo(ledger_id=1001, state=OPEN, wal_path=rels[1001]),
            mpb.LedgerInfo(ledger_id=1002, state=OPEN, wal_path=rels[1002])])
        other = TopicName.parse(f"persistent://t/{env.source.namespace}/crafted")
        await env.store.put(keys.ledgers(other), lst.SerializeToString())
        sl = ShadowLedger(env.shadow, other, env.store, Storage(env.root), env.executor,
                          retry_delay=0.05)
        env.views.append(sl)
        await sl.start()
        heard = Heard()
        sl.add_listener(heard)
        sl.on_replicated(MessageId(1001, 4))
        assert sl.next_position() == MessageId(1001, 5) and heard.entries == 1
        sl.on_replicated(MessageId(1002, 1))  # 1001's entries 5 and 6 were never reported
        assert sl.next_position() == MessageId(1001, 5)  # not counted yet: not past them
        assert sl.valid_position(MessageId(1001, 5)) == MessageId(1001, 5)
        assert [r.ledger_id for r in sl.ranges()] == [1001]
        assert [i.entries for i in sl.ledgers()] == [5, 0]  # 1002: not readable yet
        await wait_for_async(lambda: sl.next_position() == MessageId(1002, 2), what="1001 counted")
        assert heard.entries == 2
        got = await read_all(sl)
        assert [(e.ledger_id, e.entry_id) for e in got] == \
            [(1001, i) for i in range(7)] + [(1002, 0), (1002, 1)]
        assert [e.raw for e in got] == [message(10010 + i) for i in range(7)] + \
            [message(10020), message(10021)]

        # 1002 unsealed and not reported to its end, 1003 sealed behind it
        lst.ledgers.append(copy)
        lst.ledgers.append(mpb.LedgerInfo(ledger_id=1004, state=OPEN, wal_path=rels[1004]))
        write_more = walmod.WalFile(st.wal_path(rels[1002]),
                                    os.open(st.wal_path(rels[1002]), os.O_WRONLY | os.O_APPEND),
                                    os.path.getsize(st.wal_path(rels[1002])))
        raws = [message(10022)]
        write_more.write_sync(walmod.encode_batch(2, 2000, walmod.request_bytes(raws), 1))
        write_more.close()
        await env.store.put(keys.ledgers(other), lst.SerializeToString())
        await wait_for_async(lambda: sl.next_position() == MessageId(1004, 0), what="1002 counted")
        got = await read_all(sl, MessageId(1002, 0))
        assert [(e.ledger_id, e.entry_id) for e in got] == \
            [(1002, 0), (1002, 1), (1002, 2), (1003, 0), (1003, 1), (1003, 2)]
        assert [e.raw for e in got][3:] == [message(100 + i) for i in range(3)]
        assert sl.source_ledger_ids() == [1001, 1002, 1003, 1004]
    run(request, "memory", tmp_path, test)


def test_an_older_list_never_replaces_a_newer_one(request, backend, tmp_path):
    """A read that found a file gone read the list again (newer than what the watch has
    delivered so far); the watch then delivers the older updates: they change nothing, so
    the trimmed ledgers do not come back and are not trimmed (and counted) twice."""
    async def test(env):
        ml = await env.open_source()
        await three_ledgers(env, ml)
        spy = SpyStore(env.store)
        spy.gate = asyncio.Event()  # the watch holds back what it gets
        sl = await env.open_shadow(spy)
        sl.on_replicated(ml.last_confirmed())
        heard = Heard()
        sl.add_listener(heard)
        await ml.truncate()  # three list writes: a new ledger, the seal, the deletion
        assert await read_all(sl) == []  # files gone: the list is read again
        assert len(heard.trims) == 1 and sl.source_ledger_ids() == [ml.ledgers()[0].ledger_id]
        spy.gate.set()
        await asyncio.sleep(0.3)  # the watch delivers the three older updates
        assert len(heard.trims) == 1 and sl.source_ledger_ids() == [ml.ledgers()[0].ledger_id]
        await append(ml, 2, 20)
        sl.on_replicated(ml.last_confirmed())
        assert await read_all(sl) == await read_all(ml) and len(await read_all(sl)) == 2
    run(request, backend, tmp_path, test)


# ---- trimming -------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["truncate", "retention"])
def test_ledgers_the_source_drops_are_trimmed_as_the_source_does(request, backend, tmp_path,
                                                                  how):
    async def test(env):
        ml = await env.open_source()
        sealed, open_lid = await three_ledgers(env, ml)
        sl = await env.open_shadow()
        sl.on_replicated(ml.last_confirmed())
        src_heard, sh_heard = Heard(), Heard()
        ml.add_listener(src_heard)
        sl.add_listener(sh_heard)
        if how == "truncate":
            await ml.truncate()
        else:
            await asyncio.sleep(0.01)
            assert await ml.apply_retention(0, -1) == (2, 11)
        assert len(src_heard.trims) == 1
        await wait_for_async(lambda: sh_heard.trims, what="on_trimmed")
        assert sh_heard.trims == src_heard.trims  # same ledgers, counts and sizes
        assert sl.source_ledger_ids() == [i.ledger_id for i in ml.ledgers()]
        assert sl.first_position() == ml.first_position()
        assert sl.entries_deleted == ml.entries_deleted
        if how == "retention":
            assert sl.first_position() == MessageId(open_lid, 0)
        assert await read_all(sl) == await read_all(ml)
        assert sl.valid_position(MessageId(sealed[0].ledger_id, 2)) == \
            ml.valid_position(MessageId(sealed[0].ledger_id, 2))
    run(request, backend, tmp_path, test)


def test_a_deleted_source_list_trims_everything(request, tmp_path):
    async def test(env):
        ml = await env.open_source()
        sealed, open_lid = await three_ledgers(env, ml)
        sl = await env.open_shadow()
        sl.on_replicated(ml.last_confirmed())
        heard = Heard()
        sl.add_listener(heard)
        before = sl.next_position()
        await env.store.delete(keys.ledgers(env.source))
        await wait_for_async(lambda: heard.trims, what="on_trimmed")
        assert [(r.ledger_id, r.entries) for r in heard.trims[0]] == \
            [(sealed[0].ledger_id, 5), (sealed[1].ledger_id, 6), (open_lid, 4)]
        assert sl.ranges() == [] and sl.first_position() is None
        assert sl.next_position() == before  # never moves back
    run(request, "memory", tmp_path, test)


# ---- read-only --------------------------------------------------------------------------------

def test_the_shadow_writes_nothing(request, backend, tmp_path):
    async def test(env):
        ml = await env.open_source()
        await three_ledgers(env, ml)

        async def state():
            if env.backend == "memory":  # everything, and the store's revision
                snap = await env.store.get_prefix("")
                return snap.revision, [(kv.key, kv.mod_revision, kv.value) for kv in snap.items]
            # the shared etcd: what this test's topics have, and the ledger-id counter
            out = []
            for prefix in (f"{keys.ROOT}/topics/persistent/t/{env.source.namespace}/",
                           f"{keys.ROOT}/clusters/", keys.LEDGER_ID_COUNTER):
                snap = await env.store.get_prefix(prefix)
                out += [(kv.key, kv.mod_revision, kv.value) for kv in snap.items
                        if env.source.namespace in kv.key or kv.key == keys.LEDGER_ID_COUNTER]
            return out

        before, files_before = await state(), files(env.root)
        spy = SpyStore(env.store)
        sl = await env.open_shadow(spy)
        heard = Heard()
        sl.add_listener(heard)
        sl.on_replicated(ml.last_confirmed())
        got = await read_all(sl)
        assert len(got) == 15
        await sl.position_at_time(got[-1].publish_ms)
        await sl.position_at_time(0)
        await sl.close()
        assert sl.closed is not None and heard.calls[-1] == ("closed", "TopicNotOwned")
        assert spy.writes == []
        assert await state() == before
        assert files(env.root) == files_before
    run(request, backend, tmp_path, test)


def test_close_stops_following(request, tmp_path):
    async def test(env):
        ml = await env.open_source()
        await append(ml, 3)
        sl = await env.open_shadow()
        ids = sl.source_ledger_ids()
        await sl.close()
        await sl.close()  # idempotent
        await ml.roll()
        await asyncio.sleep(0.1)
        assert sl.source_ledger_ids() == ids
        sl.on_replicated(MessageId(ids[0], 2))
        assert sl.last_confirmed() is None and isinstance(sl.closed, errors.TopicNotOwned)
    run(request, "memory", tmp_path, test)


# ---- the engines over a shadow ----------------------------------------------------------------

class Outbox(fakes.Outbox):
    """The shared outbox, answering entries as (ledger, entry, publish time, raw)."""

    def entries(self, handle=None) -> list[tuple[int, int, int, bytes]]:
        return [(e.ledger_id, e.entry_id, e.publish_time, e.raw)
                for e in super().entries(handle)]


def as_tuples(entries):
    return [(e.ledger_id, e.entry_id, e.publish_ms, e.raw) for e in entries]


def test_a_reader_from_earliest_reads_everything_through_the_read_engine(request, backend,
                                                                        tmp_path):
    async def test(env):
        ml = await env.open_source()
        await three_ledgers(env, ml)
        sl = await env.open_shadow()

        async def resolve(topic):
            assert topic == env.shadow
            return sl

        engine = ReadEngine(resolve, lambda topic: Count())
        out = Outbox()
        reader, last = await engine.open(out, 1, env.shadow, Start(EARLIEST))
        assert last == MessageId(ml.ledgers()[1].ledger_id, 5)  # sealed ledgers only yet
        engine.flow(reader, 1000)
        await wait_for_async(lambda: len(out.entries(1)) == 11, what="the sealed entries")
        sl.on_replicated(ml.last_confirmed())
        await wait_for_async(lambda: len(out.entries(1)) == 15, what="the WAL entries")
        await ml.roll()                      # the WAL it read goes; Parquet from now on
        await append(ml, 3, 15)
        sl.on_replicated(ml.last_confirmed())
        await wait_for_async(lambda: len(out.entries(1)) == 18, what="the next ledger")
        assert out.entries(1) == as_tuples(await read_all(ml))
        assert out.errors == []
        engine.close(reader)
    run(request, backend, tmp_path, test)


def test_a_durable_subscription_gets_every_message_and_skips_trimmed_ledgers(request, backend,
                                                                             tmp_path):
    async def test(env):
        ml = await env.open_source()
        await three_ledgers(env, ml)
        sl = await env.open_shadow()
        sl.on_replicated(ml.last_confirmed())
        own = keys.ownership("c", env.shadow)  # the shadow broker's own topic ownership
        value = mpb.Ownership(broker_id="shadow-broker", epoch=1).SerializeToString()
        await env.store.put(own, value)
        ts = await TopicSubscriptions(env.shadow, sl, env.store, MemoryCursorStore(env.store),
                                      Fence(own, value), lambda: Policies(), Count(),
                                      0.05).load()
        out = Outbox()
        everything, _, _ = await ts.subscribe(out, 1, "all", EXCLUSIVE, Start(EARLIEST))
        ts.flow(everything, 1000)
        slow, _, _ = await ts.subscribe(out, 2, "slow", EXCLUSIVE, Start(EARLIEST))
        ts.flow(slow, 4)
        await wait_for_async(lambda: len(out.entries(1)) == 15 and len(out.entries(2)) == 4,
                         what="deliveries")
        assert out.entries(1) == as_tuples(await read_all(ml))
        ts.ack(slow, [MessageId(e[0], e[1]) for e in out.entries(2)[:3]], cumulative=False)
        last = out.entries(1)[-1]
        ts.ack(everything, [MessageId(last[0], last[1])], cumulative=True)

        await ml.truncate()  # deletes every ledger the subscriptions were reading
        await wait_for_async(lambda: ts.get("slow").skipped, what="the trim")
        stats = ts.stats()
        assert stats["slow"]["skipped_entries"] == 15 - 3
        assert stats["all"]["skipped_entries"] == 0
        assert stats["slow"]["msg_backlog"] == 0

        await append(ml, 3, 15)
        sl.on_replicated(ml.last_confirmed())
        ts.flow(slow, 100)
        fresh = as_tuples(await read_all(ml))
        assert len(fresh) == 3
        await wait_for_async(lambda: out.entries(2)[4:] == fresh and out.entries(1)[15:] == fresh,
                         what="delivery after the trim")
        assert out.errors == []
        await ts.close()
    run(request, backend, tmp_path, test)
