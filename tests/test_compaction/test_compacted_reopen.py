"""A compacted ledger that failed to open is opened again (compaction/view.py): while the
broken pointer is still the current one, `CompactedView` tries it again with backoff; reads of
the compacted prefix fail with the typed error until an open succeeds, then return the
compacted entries, with no new pointer. A newer pointer stops the tries; a corrupt ledger is
tried at the longest delay. Opens fail through the failpoint `compaction.ledger.open` (an
unreachable store) or through the ledger's real files (missing, corrupt). Backoffs here are
tens of milliseconds, so each test takes well under a second."""
from __future__ import annotations

import asyncio
import logging
import os

import pytest

from shadowtopic import failpoints
from shadowtopic.compaction import reference
from shadowtopic.compaction.plan import make_plan
from shadowtopic.compaction.view import CompactedView
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.memory_view import MemoryView
from shadowtopic.ledger.storage import Storage
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

TOPIC = TopicName("t", "ns", "compact-me")  # the topic of the `ledgers` fixture
NAME = TopicName("t", "ns", "reader-of-compact-me")  # the topic the view serves, in logs
WAIT = 10.0  # the longest any test waits for the view to change (a bound, not a timing)


class Woken:
    """A view listener: each `on_entries` (a swap wakes listeners so) sets `event`."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.woken = 0

    def on_entries(self) -> None:
        self.woken += 1
        self.event.set()

    def on_trimmed(self, trimmed) -> None:
        pass

    def on_closed(self, reason) -> None:
        pass


class Setup:
    """Two sealed ledgers of TOPIC compacted by the reference into one compacted ledger, a
    raw tail after it, and a `CompactedView` over them with small backoffs."""

    def __init__(self, storage: Storage, led) -> None:
        self.storage = storage
        led.seal([("a", b"1"), ("b", b"1"), ("a", b"2")])
        led.seal([("b", b""), ("c", b"3"), (None, b"keyless")])
        self.horizon = MessageId(2, 2)
        plan = make_plan(TOPIC, "j1", led.list, self.horizon, None, True)
        m = reference.run(plan, storage, "c/j1")
        self.pointer = mpb.CompactionPointer(manifest=m, horizon=m.horizon, job_id="j1")
        lst = [(lid, [(0, r.raw) for r in led.rows if r.ledger_id == lid], True)
               for lid in (1, 2)]
        lst.append((3, [(0, b"tail")], False))
        self.mem = MemoryView(ledgers=lst, next_id=4, ledgers_of=TOPIC)
        # the survivors: a=2 (1,2), c=3 (2,1), the keyless (2,2); b was deleted; then the tail
        self.want = [(1, 2), (2, 1), (2, 2), (3, 0)]

    def view(self, retry_first: float = 0.01, retry_max: float = 0.04) -> CompactedView:
        return CompactedView(self.mem, storage=self.storage, name=NAME,
                             retry_first=retry_first, retry_max=retry_max)

    def data_file(self) -> str:
        return self.storage.full(self.pointer.manifest.files[0].path)


@pytest.fixture
def setup(tmp_path, ledgers) -> Setup:
    st = Storage(str(tmp_path))
    return Setup(st, ledgers(st))


async def read_all(view: CompactedView) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    pos = view.valid_position(MessageId(0, 0))
    for _ in range(100):  # bounded: a handful of entries
        if not pos < view.next_position():
            break
        got = await view.read(pos, 2, 1 << 20)
        if not got:
            break
        out += [(e.ledger_id, e.entry_id) for e in got]
        pos = view.valid_position(MessageId(got[-1].ledger_id, got[-1].entry_id + 1))
    return out


async def until(check, what: str) -> None:
    """Wait (bounded) until `check()` is true, polling."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"not within {WAIT}s: {what}")
        await asyncio.sleep(0.005)


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "shadowtopic.compaction.view" and r.levelno == logging.WARNING]


def test_a_ledger_that_failed_to_open_is_opened_again(setup, caplog, arun):
    """The first three opens fail (the store is unreachable): reads of the prefix fail with
    DataLoss, then the view opens the same pointer by itself and serves it."""
    caplog.set_level(logging.INFO, logger="shadowtopic.compaction.view")

    async def main() -> None:
        view = setup.view()
        woken = Woken()
        view.add_listener(woken)
        with failpoints.enabled({"compaction.ledger.open": "3*error(object store unreachable)"}):
            await view.update(setup.pointer)
            assert isinstance(view.broken, errors.DataLoss)
            with pytest.raises(errors.DataLoss, match="unreachable"):
                await view.read(view.valid_position(MessageId(0, 0)), 10, 1 << 20)
            tail = await view.read(MessageId(3, 0), 10, 1 << 20)  # the raw tail reads on
            assert [e.raw for e in tail] == [b"tail"]
            woken.event.clear()
            await asyncio.wait_for(woken.event.wait(), WAIT)  # the swap wakes listeners
        assert view.broken is None and view.ledger is not None
        assert view.pointer is setup.pointer  # no new pointer came
        assert await read_all(view) == setup.want
        assert view.last_readable() == MessageId(3, 0)
        # opens 2 and 3 failed: one WARNING each, naming the topic, the delay doubling
        warned = warnings_of(caplog)
        assert len(warned) == 2, warned
        assert all(str(NAME) in w and "unreachable" in w for w in warned)
        assert "in 0.02s" in warned[0] and "in 0.04s" in warned[1], warned
        await view.close()

    arun(main())


def test_reads_fail_until_the_missing_file_is_back(setup, caplog, arun):
    """A compacted ledger's file is away (a real open fails, DataLoss): reads fail with that
    error, retried at the capped delay, until the file is back; then they are served."""
    caplog.set_level(logging.INFO, logger="shadowtopic.compaction.view")

    async def main() -> None:
        path = setup.data_file()
        os.rename(path, path + ".away")
        view = setup.view()
        await view.update(setup.pointer)
        await until(lambda: len(warnings_of(caplog)) >= 4, "four failed tries")
        with pytest.raises(errors.DataLoss, match="missing"):
            await view.read(MessageId(0, 0), 10, 1 << 20)
        assert "in 0.04s" in warnings_of(caplog)[-1]  # capped at retry_max
        os.rename(path + ".away", path)
        await until(lambda: view.broken is None, "the ledger opened again")
        assert view.pointer is setup.pointer
        assert await read_all(view) == setup.want
        await view.close()

    arun(main())


def test_a_newer_pointer_stops_the_tries(setup, caplog, arun):
    """The broken pointer is replaced: its tries end, and a later success of the old
    pointer's files never swaps it back over the newer one; `close` ends the tries too."""
    caplog.set_level(logging.INFO, logger="shadowtopic.compaction.view")

    async def main() -> None:
        path = setup.data_file()
        os.rename(path, path + ".away")
        view = setup.view()
        await view.update(setup.pointer)
        await until(lambda: len(warnings_of(caplog)) >= 1, "a failed try")
        await view.update(None)  # the pointer is gone: raw reads
        assert view.broken is None and view.pointer is None
        os.rename(path + ".away", path)  # the old pointer's ledger would open now
        tried = len(warnings_of(caplog))
        await asyncio.sleep(0.2)  # five capped delays: a try left running would swap
        assert view.pointer is None and view.ledger is None
        assert len(warnings_of(caplog)) == tried
        assert len(await read_all(view)) == 7  # every raw entry
        # broken again, then closed: nothing more is tried
        os.rename(path, path + ".away")
        again = mpb.CompactionPointer()
        again.CopyFrom(setup.pointer)
        await view.update(again)
        assert view.broken is not None
        await view.close()
        os.rename(path + ".away", path)
        await asyncio.sleep(0.2)
        assert view.broken is not None

    arun(main())


def test_a_corrupt_ledger_is_tried_at_the_longest_delay(setup, caplog, arun):
    """A checksum mismatch is not an outage: the next try waits `retry_max` at once; once
    the file is whole again the ledger opens."""
    caplog.set_level(logging.INFO, logger="shadowtopic.compaction.view")

    async def main() -> None:
        path = setup.data_file()
        with open(path, "rb") as f:
            good = f.read()
        with open(path, "wb") as f:
            f.write(good[:-1] + bytes([good[-1] ^ 0xFF]))
        view = setup.view(retry_first=0.01, retry_max=0.3)
        await view.update(setup.pointer)
        assert isinstance(view.broken, errors.ChecksumError)
        await until(lambda: len(warnings_of(caplog)) >= 1, "a failed try")
        assert "in 0.30s" in warnings_of(caplog)[0]
        with pytest.raises(errors.ChecksumError):
            await view.read(MessageId(0, 0), 10, 1 << 20)
        with open(path, "wb") as f:
            f.write(good)
        await until(lambda: view.broken is None, "the repaired ledger opened")
        assert await read_all(view) == setup.want
        await view.close()

    arun(main())


def test_the_follower_recovers_and_its_close_ends_the_tries(setup, arun):
    """Through `CompactionFollower` (as a broker runs it: the pointer read from the metadata
    store, opens in an executor): the first open fails, the view recovers by itself; a newer
    broken pointer is tried again until the follower closes, which leaves no task behind."""
    from concurrent.futures import ThreadPoolExecutor

    from shadowtopic.compaction.view import CompactionFollower
    from shadowtopic.metadata import keys
    from shadowtopic.metadata.memory import MemoryStore

    async def main() -> None:
        before = asyncio.all_tasks()
        store = MemoryStore()
        await store.put(keys.compaction(TOPIC), setup.pointer.SerializeToString())
        with ThreadPoolExecutor(2) as ex:
            follower = CompactionFollower(store, setup.storage, ex, TOPIC, setup.mem,
                                          name=NAME)
            follower.view.retry_first, follower.view.retry_max = 0.01, 0.04
            with failpoints.enabled({"compaction.ledger.open": "1*error(S3 timed out)"}):
                view = await follower.start()
                with pytest.raises(errors.DataLoss, match="timed out"):
                    await view.read(MessageId(0, 0), 10, 1 << 20)
                await until(lambda: view.broken is None, "the ledger opened again")
            assert view.pointer == setup.pointer
            assert await read_all(view) == setup.want
            gone = mpb.CompactionPointer()
            gone.CopyFrom(setup.pointer)
            gone.job_id = "j2"
            gone.manifest.files[0].path += ".gone"
            await store.put(keys.compaction(TOPIC), gone.SerializeToString())
            await until(lambda: view.pointer == gone, "the new pointer followed")
            assert isinstance(view.broken, errors.DataLoss)
            await follower.close()
            assert asyncio.all_tasks() == before  # no try (nor follow) left running
        await store.close()

    arun(main())
