"""Sealing ahead (source/ledger/seal_ahead.py): an open ledger's Parquet file is written as
the ledger fills, and its seal writes only the rest. The file it seals holds the columns and
entries a seal from the WAL writes (its row groups cut at frame boundaries); a failed step,
a crash or a close leaves nothing behind."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import random

import pyarrow.parquet as pq
import pytest
from support.ledger_env import Env
from support.ledger_env import read_all as _read_all
from support.s3_support import REGION, MotoS3

from shadowtopic import failpoints
from shadowtopic.core import errors
from shadowtopic.ledger import sealed, wal
from shadowtopic.ledger.object_store import S3Options
from shadowtopic.ledger.open_ledger import LedgerConfig
from shadowtopic.ledger.seal_ahead import group_ends
from shadowtopic.ledger.storage import Storage
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import common_pb2


def _records(rng: random.Random, n: int) -> list[bytes]:
    """Messages as producers send them: keys, JSON-like values of varied size, a few
    deletes, properties, event times and, now and then, a large random payload (mapped,
    not copied, when sealed)."""
    out = []
    for _ in range(n):
        m = common_pb2.Message(key=f"sym-{rng.randrange(500)}".encode())
        r = rng.random()
        if r < 0.02:
            pass  # a delete: no payload
        elif r < 0.03:
            m.payload = rng.randbytes(rng.randrange(5_000, 20_000))
        else:
            m.payload = json.dumps({"px": round(rng.uniform(1, 900), 2),
                                    "qty": rng.randrange(1, 10_000),
                                    "note": "x" * rng.randrange(0, 120)}).encode()
        if rng.random() < 0.3:
            m.properties["region"] = rng.choice(["eu", "us", "ap"])
        if rng.random() < 0.5:
            m.event_time = 1_700_000_000_000 + rng.randrange(10**6)
        out.append(m.SerializeToString())
    return out


def _batches(seed: int, total: int) -> list[list[bytes]]:
    rng = random.Random(seed)
    out, done = [], 0
    while done < total:
        n = min(rng.choice([1, 7, 50, 300, 900]), total - done)
        out.append(_records(rng, n))
        done += n
    return out


async def _append_all(ml, batches) -> None:
    for raws in batches:
        await ml.append(raws, wal.request_bytes(raws), sum(map(len, raws)))


def _temp_files(env: Env) -> list[str]:
    root = env.storage.full("")
    return [os.path.join(d, f) for d, _dirs, files in os.walk(root) for f in files
            if f.startswith(".") and f.endswith(".tmp")]


async def _until(check, timeout: float = 20.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _sealed_table(env: Env, info: mpb.LedgerInfo):
    return pq.read_table(env.storage.full(info.path)).drop_columns(["ledger_id"])


def test_group_ends_cut_whole_frames_into_row_groups():
    rng = random.Random(7)
    for _ in range(200):
        frames = wal.FrameIndex()
        at, first = wal.HEADER.size, 0
        for _ in range(rng.randrange(0, 80)):
            count = rng.choice([1, 3, 100, 2_000, 9_000, 20_000])
            length = count * rng.choice([20, 130, 4_000]) + 30
            frames.add(first, count, 0, at, length)
            at, first = at + length, first + count
        start = rng.randrange(0, len(frames) + 1)
        ends = group_ends(frames, start)
        n = len(frames)

        def entry(j, frames=frames, n=n):
            return frames.firsts[j] if j < n else frames.entries

        def byte(j, frames=frames, n=n):
            return frames.offsets[j] if j < n else frames.end

        k = start
        for j in ends:
            assert j > k
            rows, size = entry(j) - entry(k), byte(j) - byte(k)
            if j - k > 1:  # a run of several frames never passes a group's limits
                assert rows <= sealed.GROUP_ROWS and size <= sealed.GROUP_BYTES
            # and it fills a group: one more frame would pass a limit, or it reached one
            assert (rows >= sealed.GROUP_ROWS or size >= sealed.GROUP_BYTES or j == n
                    or entry(j + 1) - entry(k) > sealed.GROUP_ROWS
                    or byte(j + 1) - byte(k) > sealed.GROUP_BYTES), (k, j)
            k = j
        # what is left does not fill a group yet
        assert entry(n) - entry(k) < sealed.GROUP_ROWS and byte(n) - byte(k) < sealed.GROUP_BYTES


def test_a_ledger_sealed_ahead_holds_what_a_whole_seal_writes(tmp_path, arun, caplog):
    caplog.set_level(logging.INFO, "shadowtopic.ledger.managed")
    batches = _batches(1, 30_000)
    sent = [raw for b in batches for raw in b]

    async def main():
        ahead, whole = Env(tmp_path / "ahead"), Env(tmp_path / "whole")
        ml_a = await ahead.open(seal_ahead="always")
        ml_w = await whole.open(seal_ahead="never")
        await _append_all(ml_a, batches)
        await _append_all(ml_w, batches)
        # the open ledger's file is being written before anything asks for a seal
        await _until(lambda: any(os.path.getsize(p) > 0 for p in _temp_files(ahead)))
        assert _temp_files(whole) == []
        info_a, info_w = await ml_a.roll(), await ml_w.roll()
        assert _temp_files(ahead) == []
        assert info_a.entries == info_w.entries == len(sent)
        assert info_a.size_bytes == info_w.size_bytes
        # the same columns (publish times are each ledger's own), and its own publish times
        table = _sealed_table(ahead, info_a)
        assert table.drop_columns(["publish_time"]).equals(
            _sealed_table(whole, info_w).drop_columns(["publish_time"]))
        read = await _read_all(ml_a)
        assert table.column("publish_time").to_pylist() == [e.publish_ms for e in read]
        assert (info_a.first_publish_ms, info_a.last_publish_ms) == (
            read[0].publish_ms, read[-1].publish_ms)
        meta = pq.ParquetFile(ahead.storage.full(info_a.path)).metadata
        groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        assert sum(groups) == len(sent) and max(groups) <= sealed.GROUP_ROWS
        # a broker that opens the file checks it against the list's crc32c, and reads it
        assert [e.raw for e in read] == sent
        assert "sealing ahead" not in caplog.text  # finished, not sealed whole
        await ml_a.close()
        await ml_w.close()

    arun(main())


def test_a_broker_seals_ahead_only_once_a_roll_was_asked_for(tmp_path, arun):
    """The broker's mode ("after_roll"): a topic only produced to writes no file ahead (a
    step's ~100 ms of GIL raised produce latency); the first roll asked for (a compaction
    files one) turns it on, for the empty open ledger at once and for every later one."""
    first, second = _batches(4, 20_000), _batches(5, 20_000)
    sent = [raw for b in first + second for raw in b]

    async def main():
        env = Env(tmp_path)
        ml = await env.open(seal_ahead="after_roll")
        await _append_all(ml, first)
        await asyncio.sleep(0.5)  # (time for a step, were one to start)
        assert _temp_files(env) == []
        info = await ml.roll()  # sealed whole; the next ledger is sealed ahead
        assert info.entries == sum(map(len, first))
        await _append_all(ml, second)
        await _until(lambda: any(os.path.getsize(p) > 0 for p in _temp_files(env)))
        await ml.roll()
        assert [e.raw for e in await _read_all(ml)] == sent
        await ml.close()

        aged = Env(tmp_path / "aged")  # a roll by age was asked for by nobody
        ml = await aged.open(seal_ahead="after_roll", max_age_s=0.2)
        await _append_all(ml, first[:1])
        await asyncio.sleep(0.3)
        assert await ml.roll_if_aged()
        ml.config = LedgerConfig()  # (no more rolls by age)
        await _append_all(ml, second)
        await asyncio.sleep(0.5)
        assert _temp_files(aged) == []
        await ml.close()

        fresh = Env(tmp_path / "fresh")  # a roll of an empty ledger turns it on for that one
        ml = await fresh.open(seal_ahead="after_roll")
        (opened,) = ml.ledgers()
        assert opened.state == mpb.OPEN
        assert await ml.roll() is None  # (empty: nothing rolls, nothing is sealed yet)
        await _append_all(ml, second)
        await _until(lambda: any(os.path.getsize(p) > 0 for p in _temp_files(fresh)))
        assert [i.ledger_id for i in ml.ledgers()] == [opened.ledger_id]  # the same ledger
        await ml.close()

    arun(main())


def test_a_failed_step_leaves_the_seal_to_the_wal(tmp_path, arun, caplog):
    caplog.set_level(logging.INFO, "shadowtopic.ledger.managed")
    batches = _batches(2, 20_000)
    sent = [raw for b in batches for raw in b]

    async def main():
        env = Env(tmp_path)
        with failpoints.enabled({"ledger.seal_ahead.step": "1*error(disk trouble)"}):
            ml = await env.open()
            await _append_all(ml, batches)
            info = await ml.roll()
        assert "sealing ahead stopped (its seal writes it whole): disk trouble" in caplog.text
        assert _temp_files(env) == []
        assert info.entries == len(sent)
        assert [e.raw for e in await _read_all(ml)] == sent
        await ml.close()

    arun(main())


@pytest.mark.parametrize("ending", ["crash", "close"])
def test_an_owner_that_ends_leaves_no_file_and_loses_nothing(tmp_path, arun, ending):
    """A crash leaves the temporary file, which the next owner's sweep deletes before it
    seals the ledger from the WAL; a close removes it."""
    batches = _batches(3, 20_000)
    sent = [raw for b in batches for raw in b]

    async def main():
        env = Env(tmp_path)
        ml = await env.open()
        await _append_all(ml, batches)
        await _until(lambda: any(os.path.getsize(p) > 0 for p in _temp_files(env)))
        if ending == "close":
            await ml.close()
            assert _temp_files(env) == []
        ml2 = await env.open()  # a new owner (a new epoch): the ledger sealed from its WAL
        infos = ml2.ledgers()
        assert infos[0].state == mpb.SEALED and infos[0].entries == len(sent)
        assert _temp_files(env) == []
        assert [e.raw for e in await _read_all(ml2)] == sent
        await ml2.close()
        if ending == "crash":
            with pytest.raises(errors.Fenced):
                await ml.roll()

    arun(main())


def test_on_an_object_store_the_file_is_written_beside_the_wal_and_copied_by_the_seal(
        tmp_path, arun, monkeypatch):
    """A real S3 API (moto's server): the steps write the file on the broker's disk next to
    the WAL; the seal copies it to the bucket whole and removes it."""
    batches = _batches(4, 20_000)
    sent = [raw for b in batches for raw in b]
    with MotoS3(str(tmp_path)) as moto:
        for name, value in moto.env.items():
            monkeypatch.setenv(name, value)
        bucket = moto.new_bucket()
        env = Env(tmp_path)
        env.storage = Storage(f"s3://{bucket}/root", wal_dir=str(tmp_path / "wal"),
                              s3=S3Options(endpoint=moto.endpoint, region=REGION))

        def local_temps() -> list[str]:
            return [os.path.join(d, f) for d, _dirs, files in os.walk(tmp_path / "wal")
                    for f in files if f.endswith(".parquet.tmp")]

        async def main():
            ml = await env.open()
            await _append_all(ml, batches)
            await _until(lambda: any(os.path.getsize(p) > 0 for p in local_temps()))
            assert not [k for k in moto.keys(bucket) if k.endswith(".tmp")]
            info = await ml.roll()
            assert local_temps() == []
            assert f"root/{info.path}" in moto.keys(bucket)
            assert info.entries == len(sent)
            assert [e.raw for e in await _read_all(ml)] == sent  # checked against its crc32c
            table = pq.read_table(f"{bucket}/root/{info.path}", filesystem=moto.filesystem())
            assert table.num_rows == len(sent)
            await ml.close()

        arun(main())


def test_an_aborted_file_writes_nothing_more():
    """A seal-ahead dropped on a full disk must not write again (its close would raise and
    leave the file): the writer's abort sends its last column chunks and footer nowhere."""
    class Recording:
        def __init__(self):
            self.writes = 0

        def write(self, data):
            self.writes += 1
            return len(data)

    out = Recording()
    writer = sealed.LedgerWriter(out, 7)
    raws = _records(random.Random(9), 3_000)
    writer.add([(100, raws)])
    writer.cut()
    writer.add([(101, raws[:50])])  # a group filling, not written
    before = out.writes
    assert before > 0
    writer.abort()
    assert out.writes == before
