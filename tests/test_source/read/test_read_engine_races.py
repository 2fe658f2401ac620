"""Races in the read engine (source/read/engine.py) and in TopicManager loading
(source/broker/topics.py): asyncio tasks that could lose readers or seeks, or hand one
caller's cancellation to others. In-process, on an in-memory LedgerView (and the metadata
memory twin)."""
from __future__ import annotations

import asyncio
import time

from support.fakes import Count, Outbox

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import memory_view
from shadowtopic.read.engine import ReadEngine
from shadowtopic.read.positions import PUBLISH_TIME, Start

TOPIC = TopicName.parse("persistent://t/ns/review-engine")


class MemoryView(memory_view.MemoryView):
    """The in-memory LedgerView with two test hooks: when `time_gate` is set,
    position_at_time waits on it (a slow Parquet lookup); reads starting in `fail_ledger`
    raise OSError (a broken disk)."""

    def __init__(self, ledgers=None, next_id=1):
        super().__init__(ledgers, next_id)
        self.time_gate: asyncio.Event | None = None
        self.fail_ledger: int | None = None

    def reopened(self) -> MemoryView:
        return MemoryView(self._ledgers, self._next_id)

    async def position_at_time(self, publish_ms):
        if self.time_gate is not None:
            await self.time_gate.wait()
        return await super().position_at_time(publish_ms)

    async def read(self, start, max_entries, max_bytes):
        if self.fail_ledger is not None and start.ledger_id == self.fail_ledger:
            raise OSError(5, "Input/output error")
        return await super().read(start, max_entries, max_bytes)


def msgs(a, b):
    return [f"m{i}".encode() for i in range(a, b)]


async def until(check, timeout=3.0):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def run(body, timeout=20):
    asyncio.run(asyncio.wait_for(body(), timeout))


class Topic:
    """One topic whose view is replaced by a fresh one (same entries) when it closed."""

    def __init__(self):
        self.view = MemoryView()

    async def resolve(self, topic):
        if self.view.closed is not None:
            self.view = self.view.reopened()
        return self.view


# ---- readers lost across a reload -----------------------------------------------------

def test_readers_are_told_when_the_reload_fails_with_an_untyped_error():
    """engine.py:254-262: `follow` catches only ShadowTopicError. Loading a topic can raise
    other exceptions (a WAL with a bad header: ValueError from wal.recover in
    ManagedLedger._recover; OSError from the sweep; a CancelledError from a load another
    caller cancelled). Then the follow task dies and its readers are neither moved nor told:
    they hang for good, with no error on their handles."""
    async def body():
        t = Topic()
        engine = ReadEngine(t.resolve, lambda topic: Count())
        out = Outbox()
        r, _ = await engine.open(out, 1, TOPIC, Start())
        engine.flow(r, 100)

        async def broken(topic):
            raise ValueError("/wal/...: not a shadowtopic WAL (bad header)")

        engine._resolve = broken
        t.view.close()
        await until(lambda: out.errors, timeout=1.0)
        assert [h for h, _ in out.errors] == [1], \
            "the reader got neither an error nor a new view: it is lost"
        assert isinstance(out.errors[0][1], errors.ShadowTopicError)

    run(body)


def test_a_reader_opened_at_a_publish_time_while_the_view_closes_follows_the_reload():
    """engine.py:207-209: `open` awaits `resolve(view, start)` (position_at_time reads
    publish times, from Parquet on the ManagedLedger) between resolving the view and adding
    the reader. If the view closes meanwhile, the reader joins a TopicReaders on the closed
    view: on_closed already fired, wake() never starts a dispatch on a closed view, so the
    reader never gets an entry nor an error."""
    async def body():
        t = Topic()
        t.view.append(msgs(0, 3))
        engine = ReadEngine(t.resolve, lambda topic: Count())
        out = Outbox()
        t.view.time_gate = gate = asyncio.Event()
        opening = asyncio.create_task(
            engine.open(out, 1, TOPIC, Start(PUBLISH_TIME, publish_ms=0)))
        await asyncio.sleep(0.01)
        old = t.view
        old.close()                # the broker unloads/reloads the topic
        await t.resolve(TOPIC)     # ... and a new view of the same entries is live
        gate.set()
        r, _ = await opening
        engine.flow(r, 100)
        t.view.append(msgs(3, 5))
        await until(lambda: len(out.raws(1)) == 5 or out.errors, timeout=1.0)
        assert out.raws(1) == msgs(0, 5) or out.errors, \
            f"reader stranded on the closed view (got {out.raws(1)}, errors {out.errors})"

    run(body)


def test_a_seek_that_crosses_a_reload_is_not_lost():
    """engine.py:224-228: `seek` awaits `resolve(tr.view, start)`; if the view closes
    meanwhile the reader moves to the new view at its old position and the seek is
    dropped (`reader.topic is tr` is False), yet seek() returns the position and the
    service answers SeekDone: the reader goes on from where it was."""
    async def body():
        t = Topic()
        t.view.append(msgs(0, 10))
        engine = ReadEngine(t.resolve, lambda topic: Count())
        out = Outbox()
        r, _ = await engine.open(out, 1, TOPIC, Start())  # at 1:0, no permits yet
        t.view.time_gate = gate = asyncio.Event()
        # seek to the first entry published at/after now + 1h: i.e. the end (1:10)
        seeking = asyncio.create_task(engine.seek(
            r, Start(PUBLISH_TIME, publish_ms=int(time.time() * 1000) + 3_600_000)))
        await asyncio.sleep(0.01)
        t.view.close()
        await until(lambda: r.topic is not None)
        gate.set()
        landed = await seeking
        assert landed == MessageId(1, 10)
        engine.flow(r, 100)
        t.view.append(msgs(10, 12))
        await until(lambda: len(out.raws(1)) >= 2, timeout=1.0)
        assert out.raws(1) == msgs(10, 12), \
            f"SeekDone said {landed} but the reader read from its old position"

    run(body)


# ---- one broken position holds up every reader of the topic ---------------------------

def test_a_read_error_at_one_position_does_not_starve_the_other_readers():
    """engine.py:134-135 + 156-162: `_serve` turns only a ShadowTopicError from view.read
    into errors on that group's handles. Any other exception (an OSError from storage)
    leaves `_dispatch` through its catch-all and ends the whole pass, so groups after the
    broken one are never served; the broken group's readers get no error either."""
    async def body():
        t = Topic()
        t.view.append(msgs(0, 5))
        t.view.roll()
        t.view.append(msgs(5, 10))
        engine = ReadEngine(t.resolve, lambda topic: Count())
        out = Outbox()
        broken, _ = await engine.open(out, 1, TOPIC, Start())  # at 1:0
        fine, _ = await engine.open(out, 2, TOPIC, Start.at(MessageId(2, 0), True))
        t.view.fail_ledger = 1
        engine.flow(broken, 100)
        engine.flow(fine, 100)
        await until(lambda: len(out.raws(2)) == 5, timeout=1.0)
        assert out.raws(2) == msgs(5, 10), "the reader at 2:0 was starved by the one at 1:0"
        assert [h for h, _ in out.errors] == [1], "the reader whose reads fail is not told"

    run(body)


# ---- a cancelled load fails every other caller waiting for it --------------------------

def test_a_load_cancelled_by_one_caller_does_not_fail_the_others(tmp_path):
    """topics.py:185-200: the first caller of `topic()` runs `_load` in its own task and
    the others wait on a future. When that first caller is cancelled (its Connect stream
    ended while its subscribe was loading the topic: Connect's finally cancels the commands
    task; or a Produce call hit its deadline), the future gets the CancelledError, and every
    other caller, not cancelled itself, gets a CancelledError too. In Connect.commands()
    `except Exception` does not catch it: another client's whole stream ends (the client
    sees 'consumer stream ended'); in engine `follow` the readers are stranded."""
    from shadowtopic.broker.ownership import BrokerSession
    from shadowtopic.broker.topic_admin import TopicAdmin
    from shadowtopic.broker.topics import TopicManager
    from shadowtopic.core.policies import Policies
    from shadowtopic.ledger.storage import Storage
    from shadowtopic.metadata.memory import MemoryStore

    async def body():
        store = MemoryStore()
        session = BrokerSession(store, "c", "b1", "127.0.0.1:1", ["source"], ttl=10)
        await session.start()
        await session.wait_ready(5)
        topics = TopicManager(store, Storage(str(tmp_path / "storage")), session)
        try:
            await TopicAdmin(topics, []).create(TOPIC, 0, Policies(), {})
            first = asyncio.create_task(topics.topic(TOPIC))
            for _ in range(10_000):  # the load is in `_loading` for a few loop steps
                await asyncio.sleep(0)
                if TOPIC in topics._loading:
                    break
            assert TOPIC in topics._loading and not first.done()
            other = asyncio.create_task(topics.topic(TOPIC))
            await asyncio.sleep(0)  # `other` now waits for the same load
            first.cancel()
            outcome = (await asyncio.gather(other, return_exceptions=True))[0]
            assert not isinstance(outcome, asyncio.CancelledError), \
                "a caller that was not cancelled got CancelledError from another's load"
        finally:
            for t in list(topics._loaded):
                await topics.unload(t)
            topics.executor.shutdown(wait=True)
            await session.stop()

    run(body)


def test_a_stream_that_ends_while_its_subscribe_loads_the_topic_spares_other_streams(tmp_path):
    """The same bug seen at Consumer.Connect: stream A subscribes to an unloaded topic and
    goes away while the load runs; stream B subscribed to the same topic meanwhile. B's
    subscribe gets A's CancelledError, which escapes commands() (`except Exception`), and
    B's whole stream ends (all its handles, on every topic) without an error."""
    from shadowtopic.broker.consumer_service import ConsumerService
    from shadowtopic.broker.ownership import BrokerSession
    from shadowtopic.broker.topic_admin import TopicAdmin
    from shadowtopic.broker.topics import TopicManager
    from shadowtopic.core.policies import Policies
    from shadowtopic.ledger.storage import Storage
    from shadowtopic.metadata.memory import MemoryStore
    from shadowtopic.pb.v1 import consumer_pb2

    def subscribe(handle):
        return consumer_pb2.ClientMessage(commands=[consumer_pb2.ClientCommand(
            handle=handle, subscribe=consumer_pb2.Subscribe(topic=str(TOPIC)))])

    async def requests(first, stay_open: asyncio.Event):
        yield first
        await stay_open.wait()

    async def body():
        store = MemoryStore()
        session = BrokerSession(store, "c", "b1", "127.0.0.1:1", ["source"], ttl=10)
        await session.start()
        await session.wait_ready(5)
        topics = TopicManager(store, Storage(str(tmp_path / "storage")), session)
        service = ConsumerService(topics)
        forever = asyncio.Event()
        try:
            await TopicAdmin(topics, []).create(TOPIC, 0, Policies(), {})
            got_b: list = []
            b_ended = asyncio.Event()

            async def consume(stream, sink, ended=None):
                async for message in stream:
                    sink.append(message)
                if ended is not None:
                    ended.set()

            stream_a = service.stream(requests(subscribe(1), forever), None)
            task_a = asyncio.create_task(consume(stream_a, []))
            for _ in range(10_000):
                await asyncio.sleep(0)
                if TOPIC in topics._loading:
                    break
            assert TOPIC in topics._loading
            stream_b = service.stream(requests(subscribe(7), forever), None)
            task_b = asyncio.create_task(consume(stream_b, got_b, b_ended))
            for _ in range(5):
                await asyncio.sleep(0)  # B's subscribe now waits for A's load
            task_a.cancel()             # A's client went away (gRPC cancels its handler)
            await asyncio.gather(task_a, return_exceptions=True)
            await until(lambda: got_b or b_ended.is_set(), timeout=2)
            assert not b_ended.is_set(), "stream B ended because stream A was cancelled"
            assert got_b, "stream B got neither Subscribed nor an error"
            task_b.cancel()
            await asyncio.gather(task_b, return_exceptions=True)
        finally:
            forever.set()
            for t in list(topics._loaded):
                await topics.unload(t)
            topics.executor.shutdown(wait=True)
            await session.stop()

    run(body)
