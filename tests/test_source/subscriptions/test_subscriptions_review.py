"""Second reader's tests of the subscription engine (source/subscriptions/, the dispatch groups
of source/read/engine.py and the Connect adapter). Tests named `test_bug_*` show a defect of
the current code (they fail until it is fixed); the others pin behaviour that is right but was
not tested. Harness and helpers come from tests/support/subscriptions_harness.py."""
from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
from support.fakes import Outbox
from support.subscriptions_harness import TOPIC, Harness, msgs, raw, settle, sub

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.pb.v1 import common_pb2
from shadowtopic.read.positions import EARLIEST, Start
from shadowtopic.subscriptions import (
    EXCLUSIVE,
    FAILOVER,
    KEY_SHARED,
    SHARED,
    ActiveChanged,
    CursorMoved,
)
from shadowtopic.subscriptions.keyring import key_hash


def run(coro, timeout: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def key_owned_by(s, consumer, avoid=()) -> str:
    """A key the Key_Shared ring of subscription `s` gives to `consumer`."""
    for i in range(100_000):
        k = f"k{i}"
        if k not in avoid and s.dispatcher.ring.owner(key_hash(k.encode())) is consumer:
            return k
    raise AssertionError("no key found")


# ---- Shared redelivery --------------------------------------------------------------------

def test_bug_shared_redelivery_of_large_messages_loses_the_tail(kind, tmp_path):
    """replay() reads a run of `redo` positions with MAX_FRAME_BYTES and treats a short read
    as 'deleted or past the end': the entries beyond 2 MiB are dropped from `redo` and never
    redelivered (nor acked: the backlog stays, nobody gets them)."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        out = Outbox()
        a = await sub(ts, out, 1, "s", SHARED, permits=100)
        b = await sub(ts, out, 2, "s", SHARED, permits=0)
        await h.append([raw(f"{i}:" + "x" * 400_000) for i in range(10)])
        await settle()
        assert len(out.ids(1)) == 10
        ts.close_consumer(a)            # a dies holding 10 unacked entries of 400 KB
        ts.flow(b, 100)
        await settle()
        assert sorted(out.ids(2)) == sorted(out.ids(1)), \
            f"b got {len(out.ids(2))} of the 10 entries a left unacknowledged"
    run(main())


def test_bug_redo_entries_of_a_trimmed_ledger_cause_duplicates_and_stay_forever(kind, tmp_path):
    """on_trimmed drops holders in deleted ledgers but not `redo`; replay() then reads at a
    deleted position, the view answers with the next ledger's entries, and those are sent
    once per run: duplicates. The deleted positions never leave `redo`."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        out = Outbox()
        a = await sub(ts, out, 1, "s", SHARED, permits=100)
        b = await sub(ts, out, 2, "s", SHARED, permits=0)
        await h.append(msgs(2, "old"))
        await h.roll()
        await h.append(msgs(2, "new"))
        await settle()
        assert len(out.ids(1)) == 4
        first_ledger = out.ids(1)[0][0]
        ts.close_consumer(a)            # 4 entries wait in redo (b has no permits)
        s = ts.get("s")
        assert len(s.dispatcher.redo) == 4
        if kind == "memory":
            h.view.trim(1)
        else:
            await asyncio.sleep(0.01)
            assert (await h.view.apply_retention(0, -1, None))[0] == 1
        ts.flow(b, 100)
        await settle()
        got = out.ids(2)
        assert len(got) == len(set(got)), f"duplicates delivered: {got}"
        assert sorted(got) == sorted(i for i in out.ids(1) if i[0] != first_ledger)
        assert not s.dispatcher.redo, \
            f"positions of a deleted ledger stay in redo: {s.dispatcher.redo}"
    run(main())


def test_bug_shared_redelivery_count_is_lost_when_the_last_consumer_leaves(kind, tmp_path):
    """C3: a dead consumer's unacknowledged messages come back with redelivery_count
    incremented. With one consumer, detach() counts them and then clears `counts` because
    no consumer is left: the next consumer gets them with redelivery_count 0 (Pulsar's
    Shared dispatcher keeps its redelivery tracker while the subscription lives)."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(3))
        out = Outbox()
        a = await sub(ts, out, 1, "s", SHARED)
        await settle()
        assert len(out.ids(1)) == 3
        ts.close_consumer(a)
        out2 = Outbox()
        await sub(ts, out2, 2, "s", SHARED)
        await settle()
        assert out2.ids(2) == out.ids(1)
        assert [e.redelivery_count for e in out2.entries(2)] == [1, 1, 1]
    run(main())


# ---- Key_Shared ---------------------------------------------------------------------------

def test_bug_key_shared_redo_grows_with_the_whole_backlog(kind, tmp_path):
    """C7 (memory bounded): when the consumer owning the keys has no permits, every read
    (driven by another consumer's permits) puts the entries in `redo`; nothing stops reading,
    so the whole backlog ends up in the set (Pulsar stops reading past a look-ahead limit,
    keySharedLookAheadMsgInReplayThreshold*). Each wake also sorts the whole set."""
    n = 30_000

    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        out = Outbox()
        a = await sub(ts, out, 1, "s", KEY_SHARED, consumer_name="a", permits=0)
        await sub(ts, out, 2, "s", KEY_SHARED, consumer_name="b", permits=1000)
        s = ts.get("s")
        k = key_owned_by(s, a)
        for i in range(0, n, 5000):
            await h.append([raw(f"v{j}", key=k) for j in range(i, i + 5000)])
        await settle(100)
        assert not out.ids(1) and not out.ids(2)
        assert len(s.dispatcher.redo) <= 20_000, f"redo holds {len(s.dispatcher.redo)} entries"
    run(main(), timeout=120)


def test_bug_key_shared_new_entries_overtake_redo_beyond_one_frame(kind, tmp_path):
    """Per-key order: replay() sends at most MAX_FRAME_ENTRIES (500) of `redo` per round and
    the same round then reads new entries, which go straight to the key's consumer, before
    the rest of `redo` (Pulsar holds back new entries of a hash that has redeliveries)."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        out_a, out_b = Outbox(), Outbox()
        a = await sub(ts, out_a, 1, "s", KEY_SHARED, consumer_name="a", permits=0)
        await sub(ts, out_b, 2, "s", KEY_SHARED, consumer_name="b", permits=1000)
        s = ts.get("s")
        k = key_owned_by(s, a)
        await h.append([raw(f"v{i}", key=k) for i in range(700)])
        await settle()
        assert len(s.dispatcher.redo) == 700       # a has no permits: they wait
        out_b.room = False              # b stops taking: nothing is read any more
        await h.append([raw(f"v{i}", key=k) for i in range(700, 705)])
        await settle(5)
        ts.flow(a, 2000)
        await settle()
        payloads = [int(p[1:]) for p in map(bytes.decode, out_a.payloads(1))]
        assert len(payloads) == 705
        first_out = next((i for i in range(1, 705) if payloads[i] < payloads[i - 1]), None)
        assert payloads == sorted(payloads), f"key {k} out of order at {first_out}"
    run(main())


def test_dispatch_does_not_spin_while_redo_entries_cannot_go_out(kind, tmp_path):
    """Right today: Key_Shared entries held in `redo` (their consumer has no permits) while
    another consumer has permits: replay() makes no progress and returns False, so the
    dispatch task ends instead of busy-looping; no read happens while nothing changes."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        out = Outbox()
        a = await sub(ts, out, 1, "s", KEY_SHARED, consumer_name="a", permits=0)
        await sub(ts, out, 2, "s", KEY_SHARED, consumer_name="b", permits=1000)
        s = ts.get("s")
        k = key_owned_by(s, a)
        await h.append([raw(f"v{i}", key=k) for i in range(50)])
        await settle()
        assert len(s.dispatcher.redo) == 50 and s in ts.readers.replays
        reads = 0
        real = h.view.read

        async def counting(*args):
            nonlocal reads
            reads += 1
            return await real(*args)
        h.view.read = counting
        ts.readers.wake()
        await settle(5)
        assert ts.readers._task is None, "dispatch task still running"
        before = reads
        await settle(20)
        assert reads == before and ts.readers._task is None
        ts.flow(a, 100)
        await settle()
        assert len(out.ids(1)) == 50 and not s.dispatcher.redo and s not in ts.readers.replays
    run(main())


def test_key_shared_leaver_keys_go_to_others_in_order(kind, tmp_path):
    """Right today: a Key_Shared consumer leaving with unacknowledged messages: its keys'
    messages are redelivered (count 1) before newer ones of the same keys."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        out = Outbox()
        a = await sub(ts, out, 1, "s", KEY_SHARED, consumer_name="a", permits=1000)
        b = await sub(ts, out, 2, "s", KEY_SHARED, consumer_name="b", permits=1000)
        s = ts.get("s")
        k = key_owned_by(s, a)
        await h.append([raw(f"v{i}", key=k) for i in range(20)])
        await settle()
        assert len(out.ids(1)) == 20 and not out.ids(2)
        ts.close_consumer(a)
        await h.append([raw(f"v{i}", key=k) for i in range(20, 30)])
        await settle()
        got = out.entries(2)
        assert [int(common_pb2.Message.FromString(e.raw).payload[1:]) for e in got] == \
            list(range(30))
        assert [e.redelivery_count for e in got] == [1] * 20 + [0] * 10
        ts.ack(b, [MessageId(e.ledger_id, e.entry_id) for e in got], False)
        assert ts.backlog(s) == 0
    run(main())


# ---- acknowledgements ---------------------------------------------------------------------

def test_bug_cumulative_ack_beyond_the_last_entry_swallows_future_messages(kind, tmp_path):
    """A cumulative ack of an id past the last entry moves the mark-delete there (Pulsar
    refuses to mark-delete beyond the last confirmed entry): messages produced later count
    as acknowledged, the backlog says 0 and a restart skips them."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(3))
        out = Outbox()
        c = await sub(ts, out, 1, "s")
        await settle()
        lid = out.ids(1)[-1][0]
        with pytest.raises(errors.InvalidArgument):  # refused, as Pulsar refuses it
            ts.ack(c, [MessageId(lid, 50)], True)
        await h.append(msgs(5, "later"))
        await settle()
        assert ts.backlog(ts.get("s")) == 8  # nothing was acknowledged
    run(main())


def test_bug_individual_ack_of_a_future_id_skips_that_message_when_it_comes(kind, tmp_path):
    """An individual ack of an id that does not exist yet is kept as an acknowledged range;
    when the entry is written later, dispatch skips it as acknowledged: never delivered."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(3))
        out = Outbox()
        c = await sub(ts, out, 1, "s", SHARED)
        await settle()
        lid = out.ids(1)[-1][0]
        ts.ack(c, [MessageId(*i) for i in out.ids(1)], False)
        try:
            ts.ack(c, [MessageId(lid, 5)], False)   # not written yet
        except errors.ShadowTopicError:
            pass
        await h.append(msgs(5, "later"))
        await settle()
        assert out.payloads(1)[3:] == [f"later{i}".encode() for i in range(5)]
        assert ts.backlog(ts.get("s")) == 5
    run(main())


def test_mixed_acks_keep_backlog_exact_across_restart_and_seek(kind, tmp_path):
    """Right today (C6): individual + cumulative acks across a ledger boundary, a flush, a
    restart and a seek back: the backlog is exact at each step."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(6))
        await h.roll()
        await h.append(msgs(6, "b"))
        out = Outbox()
        c = await sub(ts, out, 1, "s", FAILOVER)
        await settle()
        ids = [MessageId(*i) for i in out.ids(1)]
        assert len(ids) == 12
        ts.ack(c, [ids[7], ids[9]], False)
        ts.ack(c, [ids[4]], True)          # 0..4 and 7, 9
        assert ts.backlog(ts.get("s")) == 5
        await ts.flusher.flush_now()
        await h.crash()
        ts = await h.open()
        assert ts.backlog(ts.get("s")) == 5
        again = Outbox()
        c = await sub(ts, again, 1, "s", FAILOVER)
        await settle()
        assert again.ids(1) == [out.ids(1)[i] for i in (5, 6, 8, 10, 11)]
        pos, clamped = await ts.seek(c, Start.at(ids[2], True))
        assert not clamped and ts.backlog(ts.get("s")) == 10
    run(main())


# ---- subscription lifecycle ---------------------------------------------------------------

def test_bug_recreated_subscription_inherits_the_deleted_ones_cursor_after_a_crash(
        kind, tmp_path):
    """Delete a subscription and create it again (earliest) within one flush interval, then
    crash: the new meta is in etcd at once, the old cursor is still in the cursor store and
    `load` applies it to the new subscription, so it skips messages it never acknowledged
    (C4: nothing unacknowledged is lost)."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(10))
        out = Outbox()
        c = await sub(ts, out, 1, "s")
        await settle()
        ts.ack(c, [MessageId(*out.ids(1)[-1])], True)
        await ts.flusher.flush_now()                  # the cursor store: all 10 acked
        ts.close_consumer(c)
        ts.flusher._stop.set()                        # no flush from here on (crash soon)
        await asyncio.sleep(0.01)
        await ts.delete("s", force=False, dry_run=False)
        await ts.create("s", Start(EARLIEST))
        assert ts.backlog(ts.get("s")) == 10
        await h.crash()
        ts = await h.open()
        assert ts.backlog(ts.get("s")) == 10
    run(main())


def test_unload_with_consumers_attached_tells_them_and_keeps_their_acks(kind, tmp_path):
    """Right today: closing the topic's subscriptions (unload) sends TopicNotOwned to every
    consumer, flushes the acknowledgements, and a reload resumes after them."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(6))
        out = Outbox()
        x = await sub(ts, out, 1, "x", EXCLUSIVE)
        s1 = await sub(ts, out, 2, "sh", SHARED)
        await settle()
        ts.ack(x, [MessageId(*out.ids(1)[2])], True)
        ts.ack(s1, [MessageId(*out.ids(2)[i]) for i in (0, 4)], False)
        await ts.close()
        assert sorted(hd for hd, _ in out.errors) == [1, 2]
        assert all(isinstance(e, errors.TopicNotOwned) for _, e in out.errors)
        assert not ts.get("x").consumers and ts.readers.count == 0
        with pytest.raises(errors.TopicNotOwned):
            await ts.subscribe(Outbox(), 3, "x", EXCLUSIVE, Start(EARLIEST))
        ts = await h.open()
        assert ts.backlog(ts.get("x")) == 3 and ts.backlog(ts.get("sh")) == 4
    run(main())


def test_failover_priority_and_a_better_consumer_taking_over(kind, tmp_path):
    """Right today: the lowest priority is active whatever the arrival order; a better one
    arriving takes over from the first unacknowledged entry and the old one is told. What it
    takes over is not counted as redelivered: the old one is alive and gave nothing back
    (C3a)."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        out = Outbox()
        a = await sub(ts, out, 1, "s", FAILOVER, consumer_name="a", priority=5)
        await h.append(msgs(4))
        await settle()
        assert len(out.ids(1)) == 4
        ts.ack(a, [MessageId(*out.ids(1)[1])], True)
        await sub(ts, out, 2, "s", FAILOVER, consumer_name="z", priority=1)
        await settle()
        assert (1, ActiveChanged(False)) in out.notices and (2, ActiveChanged(True)) in out.notices
        assert out.ids(2) == out.ids(1)[2:4]
        assert [e.redelivery_count for e in out.entries(2)] == [0, 0]
        assert ts.stats()["s"]["active_consumer"] == "z"
    run(main())


def test_seek_during_an_in_flight_replay_sends_nothing_stale(kind, tmp_path):
    """Right today: a seek (reset) while replay() awaits its read: nothing read for the old
    redo set goes out after the SeekDone notice."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(6))
        out = Outbox()
        a = await sub(ts, out, 1, "s", SHARED, permits=6)
        b = await sub(ts, out, 2, "s", SHARED, permits=0)
        await settle()
        ts.close_consumer(a)
        gate = asyncio.Event()
        real = h.view.read

        async def slow(*args):
            await gate.wait()
            return await real(*args)
        h.view.read = slow
        ts.flow(b, 3)
        await settle(3)                       # replay() waits in its read
        pos, _ = await ts.seek(b, Start(EARLIEST))
        gate.set()
        await settle()
        assert not out.ids(2), "entries of the replay before the seek went out after it"
        assert (2, CursorMoved(pos, False, False)) in out.notices
        h.view.read = real
        ts.flow(b, 100)
        await settle()
        assert sorted(out.ids(2)) == sorted(out.ids(1))
    run(main())


def test_bug_stats_rates_forget_deleted_subscriptions(kind, tmp_path):
    """`_rates` (stats) is keyed by name and never pruned: a topic whose subscriptions come
    and go (unique names) grows it for ever."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        for i in range(5):
            await ts.create(f"tmp{i}", Start(EARLIEST))
            ts.stats()
            await ts.delete(f"tmp{i}", force=False, dry_run=False)
        ts.stats()
        assert not ts._rates, f"rates kept for deleted subscriptions: {sorted(ts._rates)}"
    run(main())


# ---- Connect: handles -------------------------------------------------------------------------

class _Stream:
    """One in-process Consumer.Connect stream on a real TopicManager (MemoryStore)."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.events: list = []

    async def __aenter__(self):
        from shadowtopic.broker.consumer_service import ConsumerService
        from shadowtopic.broker.ownership import BrokerSession
        from shadowtopic.broker.topic_admin import TopicAdmin
        from shadowtopic.broker.topics import TopicManager
        from shadowtopic.core.policies import Policies
        from shadowtopic.ledger.storage import Storage
        from shadowtopic.metadata.memory import MemoryStore
        store = MemoryStore()
        self.session = BrokerSession(store, "c", "b1", "127.0.0.1:1", ["source"], ttl=10)
        await self.session.start()
        await self.session.wait_ready(5)
        self.topics = TopicManager(store, Storage(str(self.tmp_path / "storage")), self.session)
        self.service = ConsumerService(self.topics)
        self.queue: asyncio.Queue = asyncio.Queue()
        await TopicAdmin(self.topics, []).create(TOPIC, 0, Policies(), {})
        self.task = asyncio.create_task(self._consume())
        return self

    async def _requests(self):
        while True:
            m = await self.queue.get()
            if m is None:
                return
            yield m

    async def _consume(self):
        from shadowtopic.pb.v1 import consumer_pb2
        async for data in self.service.stream(self._requests(), None):
            for f in consumer_pb2.ServerMessage.FromString(data).frames:
                if f.HasField("event"):
                    self.events.append((list(f.handles), f.event.WhichOneof("event"), f.event))

    async def send(self, *cmds):
        from shadowtopic.pb.v1 import consumer_pb2
        await self.queue.put(consumer_pb2.ClientMessage(commands=list(cmds)))

    async def wait(self, pred):
        for _ in range(500):
            hit = [e for e in self.events if pred(e)]
            if hit:
                return hit[0]
            await asyncio.sleep(0.01)
        raise AssertionError(f"no such event in {self.events}")

    async def __aexit__(self, *exc):
        await self.queue.put(None)
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        for name in list(self.topics._loaded):
            await self.topics.unload(name)
        self.topics.executor.shutdown(wait=True)
        await self.session.stop()


def _subscribe(handle, name):
    from shadowtopic.pb.v1 import consumer_pb2
    return consumer_pb2.ClientCommand(handle=handle, subscribe=consumer_pb2.Subscribe(
        topic=str(TOPIC), subscription=name, type=consumer_pb2.SHARED))


def test_bug_connect_handle_of_an_ended_consumer_cannot_be_reused(tmp_path):
    """consumer_service.py `_command`: when the broker ends a consumer handle (subscription
    force-deleted, topic unloaded) the stream keeps `(TopicSubscriptions, SubConsumer)` under
    it, so a new subscribe on that handle is refused 'already in use' (an ended reader's
    handle is reusable: `isinstance(item, Reader) and item.closed`)."""
    async def body():
        async with _Stream(tmp_path) as st:
            await st.send(_subscribe(1, "s"))
            await st.wait(lambda e: e[0] == [1] and e[1] == "subscribed")
            t = await st.topics.topic(TOPIC)
            await t.subscriptions.delete("s", force=True, dry_run=False)
            await st.wait(lambda e: e[0] == [1] and e[1] == "error")
            st.events.clear()
            await st.send(_subscribe(1, "s2"))
            first = await st.wait(lambda e: e[0] == [1])
            assert first[1] == "subscribed", f"reusing handle 1 after the broker ended it: {first}"
    run(body())


@pytest.mark.parametrize("client_closes", [False, True])
def test_connect_ended_handle_does_not_pin_an_unloaded_topic(tmp_path, client_closes):
    """An ended consumer handle stays in the stream's `handles` (with its TopicSubscriptions,
    hence the unloaded topic's ManagedLedger and every subscription) until the client sends
    close, and the bundled client never does for a handle the broker ended (Consumer.close
    skips parts in state "ended"). [client_closes=True passes today; False is the bug.]"""
    from shadowtopic.pb.v1 import consumer_pb2

    async def body():
        async with _Stream(tmp_path) as st:
            await st.send(_subscribe(1, "s"))
            await st.wait(lambda e: e[0] == [1] and e[1] == "subscribed")
            t = await st.topics.topic(TOPIC)
            old_ts, old_view = weakref.ref(t.subscriptions), weakref.ref(t.ledger)
            del t
            await st.topics.unload(TOPIC)
            await st.wait(lambda e: e[0] == [1] and e[1] == "error")
            if client_closes:
                await st.send(consumer_pb2.ClientCommand(handle=1,
                                                         close=consumer_pb2.CloseHandle()))
                await st.wait(lambda e: e[0] == [1] and e[1] == "closed")
            for _ in range(20):
                await asyncio.sleep(0.01)
            gc.collect()
            assert old_ts() is None and old_view() is None, \
                "an ended handle keeps the unloaded topic's engine and ledger alive"
    run(body())


def test_bug_in_flight_read_goes_to_a_new_consumer_without_permits(kind, tmp_path):
    """engine.py `_serve` computes `wanted` before its read and, after it, delivers to every
    member still at that position. An Exclusive consumer that leaves while the read runs
    (having acked all it got) and a new one attaching at the same position before the read
    returns: the entries go to the new consumer, which has sent no flow (permits go
    negative; Pulsar never sends without permits)."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(msgs(3))
        out = Outbox()
        a = await sub(ts, out, 1, "s", EXCLUSIVE, permits=3)
        await settle()
        ts.ack(a, [MessageId(*out.ids(1)[-1])], True)
        gate = asyncio.Event()
        real = h.view.read

        async def slow(*args):
            await gate.wait()
            return await real(*args)
        h.view.read = slow
        ts.flow(a, 5)
        await h.append(msgs(5, "n"))
        await settle(3)                  # the read for a waits
        ts.close_consumer(a)
        b = await sub(ts, out, 2, "s", EXCLUSIVE, permits=0)
        gate.set()
        await settle()
        assert not out.ids(2) and b.permits == 0, \
            f"b got {len(out.ids(2))} entries without a flow (permits {b.permits})"
        h.view.read = real
        ts.flow(b, 10)
        await settle()
        assert out.payloads(2) == [f"n{i}".encode() for i in range(5)]
    run(main())
