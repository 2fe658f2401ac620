"""Sealing streams (source/ledger/sealed.py): a ledger is written to Parquet from its WAL a
frame at a time, row group by row group, never held whole; the file is the one an
in-memory seal writes (same schema, columns, 1024-row groups, checksums), every entry once
and byte-identical; recovery keeps only the frame index."""
from __future__ import annotations

import asyncio
import itertools
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from shadowtopic import columns
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import sealed, wal
from shadowtopic.ledger.entry_cache import EntryCache
from shadowtopic.ledger.managed import LedgerConfig, ManagedLedger
from shadowtopic.ledger.sealed import GROUP_BYTES, GROUP_ROWS, SealedLedger, seal_wal, write_sealed
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.storage.v1 import views_pb2
from shadowtopic.pb.v1 import common_pb2

TOPIC = TopicName.parse("persistent://t/ns/sealed-stream")


def _msg(rng: random.Random, size: int, key: bytes | None = None, tomb: bool = False) -> bytes:
    m = common_pb2.Message(payload=b"" if tomb else rng.randbytes(size))
    if key is not None:
        m.key = key
    return m.SerializeToString()


def _write_wal(path: str, batches: list[tuple[list[bytes], bytes | None]]) -> wal.FrameIndex:
    """A WAL of one frame per batch ((raws, request or None)), indexed as a writer does."""
    f = wal.WalFile.create(path, 7)
    index = wal.FrameIndex()
    n = 0
    for b, (raws, request) in enumerate(batches):
        frame = wal.encode_batch(n, 1000 + b, request or wal.request_bytes(raws), len(raws))
        at = f.size
        f.write_sync(frame)
        index.add(n, len(raws), 1000 + b, at, len(frame))
        n += len(raws)
    f.close()
    return index


def _mixed_batches(rng: random.Random) -> list[tuple[list[bytes], bytes | None]]:
    """Frames of large messages (read through the mapping), of small ones (decoded), of
    both, with keys, tombstones and opaque bytes, and one whose request holds an unknown
    group field (decoded by protobuf)."""
    out: list[tuple[list[bytes], bytes | None]] = []
    for b in range(60):
        kind = b % 4
        if kind == 0:
            raws = [_msg(rng, rng.randint(5000, 30000), f"k{i % 5}".encode() if i % 2 else None)
                    for i in range(rng.randint(1, 12))]
            raws[0] = _msg(rng, 0, b"gone", tomb=True)
        elif kind == 1:
            raws = [_msg(rng, rng.randint(0, 300), f"k{i % 3}".encode()) for i in range(90)]
        elif kind == 2:
            raws = [rng.randbytes(rng.randint(4096, 9000)) for _ in range(3)]  # not Messages
            raws.append(b"")
        else:
            raws = [_msg(rng, 40000), _msg(rng, 3), _msg(rng, 20, b"k")]
        out.append((raws, None))
    raws = [_msg(rng, 6000, b"g") for _ in range(4)]
    group = bytes([(9 << 3) | 3, (1 << 3) | 0, 1, (9 << 3) | 4])  # field 9: a group
    out.append((raws, wal.request_bytes(raws) + group))
    return out


def _columns(path: str) -> dict:
    """The file's columns, and `raw`: each entry's bytes as they were sent."""
    table = pq.read_table(path)
    return {**table.to_pydict(), "raw": columns.raws(table).to_pylist()}


def expected_groups(sizes: list[int]) -> list[int]:
    """Row groups as the format says: one closes at GROUP_ROWS entries or once its raws
    reach GROUP_BYTES."""
    groups, rows, size = [], 0, 0
    for n in sizes:
        rows, size = rows + 1, size + n
        if rows == GROUP_ROWS or size >= GROUP_BYTES:
            groups.append(rows)
            rows = size = 0
    return groups + ([rows] if rows else [])


def test_a_seal_from_the_wal_writes_the_file_an_in_memory_seal_writes(tmp_path):
    rng = random.Random(1)
    batches = _mixed_batches(rng)
    batches += [([_msg(rng, rng.randint(0, 20), b"t") for _ in range(2000)], None)
                for _ in range(20)]  # tiny messages: groups closed by count
    batches += _mixed_batches(rng)
    wal_path = str(tmp_path / "7.wal")
    index = _write_wal(wal_path, batches)
    sent = [r for raws, _ in batches for r in raws]
    pubs = [1000 + b for b, (raws, _) in enumerate(batches) for _ in raws]
    st = Storage(str(tmp_path / "st"))

    res = seal_wal(st.fs, st.full("l/7.parquet"), wal_path, index, len(sent), ledger_id=7)
    assert (res.entries, res.raw_bytes) == (len(sent), sum(map(len, sent)))
    assert (res.first_publish_ms, res.last_publish_ms) == (pubs[0], pubs[-1])
    assert not os.path.exists(st.full("l/.7.parquet.tmp"))

    entries = wal.recover(wal_path, truncate=False).entries
    assert entries.raws == sent
    size, crc = write_sealed(st.fs, st.full("l/mem.parquet"), entries, ledger_id=7)
    streamed, in_memory = _columns(st.full("l/7.parquet")), _columns(st.full("l/mem.parquet"))
    assert streamed == in_memory
    assert streamed["raw"] == sent and streamed["publish_time"] == pubs
    assert streamed["entry_id"] == list(range(len(sent)))
    rows = columns.Rows()
    rows.extend(sent)
    made = rows.arrays()
    expect_keys = list(zip(made["key"].to_pylist(), made["is_tombstone"].to_pylist()))
    assert list(zip(streamed["key"], streamed["is_tombstone"])) == expect_keys
    assert (None, False) in expect_keys and (b"gone", True) in expect_keys

    meta = pq.ParquetFile(st.full("l/7.parquet")).metadata
    groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert groups == expected_groups(list(map(len, sent)))
    assert GROUP_ROWS in groups and min(groups[:-1]) < GROUP_ROWS  # closed by count and by size
    assert meta.schema.to_arrow_schema().equals(columns.SCHEMA)
    assert columns.version(pq.read_schema(st.full("l/7.parquet"))) == columns.FORMAT
    assert res.file_bytes == os.path.getsize(st.full("l/7.parquet"))
    assert res.crc32c == sealed._file_crc(st.fs, st.full("l/7.parquet"))
    reader = SealedLedger(st.fs, st.full("l/7.parquet"), res.crc32c)  # checksums hold
    got_pubs, got = reader.read(0, len(sent) + 1, 1 << 40)
    assert got == sent and got_pubs == pubs
    for start in itertools.accumulate(groups):  # reads by id across group boundaries
        for at in (start - 1, start):
            if at < len(sent):
                assert reader.read(at, 3, 1 << 40) == (pubs[at:at + 3], sent[at:at + 3])


def test_message_spans_agree_with_protobuf():
    rng = random.Random(3)
    for _ in range(200):
        raws = [rng.randbytes(rng.choice([0, 1, 127, 128, 300, 20000]))
                for _ in range(rng.randint(0, 6))]
        req = views_pb2.RawProduceRequest(topic="t" * rng.randint(0, 200),
                                          producer_name="p", request_id=rng.getrandbits(64),
                                          messages=raws).SerializeToString()
        body = b"\0" * 5 + req
        spans = wal.message_spans(body, 5, len(body))
        assert [body[o:o + n] for o, n in spans] == raws
    assert wal.message_spans(b"\x08", 0, 1) is None            # a cut varint
    assert wal.message_spans(b"\x22\x05ab", 0, 4) is None      # a value past the end
    assert wal.message_spans(b"\x4b\x08\x01\x4c", 0, 4) is None  # a group: protobuf decides


def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) << 10
    raise AssertionError(field)


def test_a_seal_holds_neither_the_ledger_nor_a_row_group_in_memory(tmp_path, monkeypatch):
    """64 MiB of 60 KiB entries: the peak resident set (file pages of the mapped WAL
    included) grows by a fraction of that, RSS comes back, and the row groups close at a
    MiB (18 entries), not at a count of entries."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM, the peak resident set
        exact = True
    except OSError:  # no reset of the peak here: sample the resident set while sealing
        exact = False
    rng = random.Random(5)
    payload = rng.randbytes(60 << 10)
    batches = [([_msg(rng, 0) + payload[i:] + payload[:i] for i in range(b, b + 40)], None)
               for b in range(28)]  # distinct entries, 1120 of them
    sizes = [len(r) for raws, _ in batches for r in raws]
    wal_path = str(tmp_path / "7.wal")
    index = _write_wal(wal_path, batches)
    del batches
    st = Storage(str(tmp_path / "st"))
    monkeypatch.setattr(wal, "recover", None)     # never the whole WAL
    monkeypatch.setattr(wal, "read_frames", None)
    sealed.release_memory()
    if exact:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    before = _vm("VmRSS")
    samples, done = [before], threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(_vm("VmRSS"))
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        res = seal_wal(st.fs, st.full("l/7.parquet"), wal_path, index, 1120, ledger_id=7)
    finally:
        done.set()
        sampler.join(5)
    peak = (_vm("VmHWM") if exact else max(samples)) - before
    assert res.entries == 1120 and res.raw_bytes > 64 << 20
    assert peak < 32 << 20, f"sealing 64 MiB took {peak >> 20} MiB"
    assert _vm("VmRSS") - before < 16 << 20
    meta = pq.ParquetFile(st.full("l/7.parquet")).metadata
    groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert groups == expected_groups(sizes) and groups[0] == 18


@pytest.mark.parametrize("where", ["large", "small"])
def test_a_damaged_wal_frame_fails_the_seal_and_leaves_no_file(tmp_path, where):
    rng = random.Random(7)
    raws_large = [_msg(rng, 10000) for _ in range(5)]
    raws_small = [_msg(rng, 50) for _ in range(5)]
    wal_path = str(tmp_path / "7.wal")
    index = _write_wal(wal_path, [(raws_large, None), (raws_small, None), (raws_large, None)])
    start, stop = index.span(0 if where == "large" else 1)
    with open(wal_path, "r+b") as f:
        f.seek(stop - 7)
        byte = f.read(1)
        f.seek(stop - 7)
        f.write(bytes([byte[0] ^ 0x20]))
    st = Storage(str(tmp_path / "st"))
    path = st.full("l/7.parquet")
    with pytest.raises(errors.ChecksumError):
        seal_wal(st.fs, path, wal_path, index, 15, ledger_id=7)
    assert not os.path.exists(path) and not os.path.exists(st.full("l/.7.parquet.tmp"))
    with pytest.raises(errors.DataLoss):  # a WAL shorter than its index
        os.truncate(wal_path, stop)
        seal_wal(st.fs, path, wal_path, index, 15, ledger_id=7)
    with pytest.raises(errors.DataLoss):
        seal_wal(st.fs, path, str(tmp_path / "missing.wal"), index, 15, ledger_id=7)


def test_an_object_store_seal_writes_one_object_and_deletes_a_failed_one(tmp_path):
    rng = random.Random(9)
    batches = [([_msg(rng, 9000) for _ in range(4)], None) for _ in range(3)]
    wal_path = str(tmp_path / "7.wal")
    index = _write_wal(wal_path, batches)
    os.makedirs(tmp_path / "bucket")
    fs = pafs.SubTreeFileSystem(str(tmp_path / "bucket"), pafs.LocalFileSystem())
    res = seal_wal(fs, "l/7.parquet", wal_path, index, 12, ledger_id=7)
    reader = SealedLedger(fs, "l/7.parquet", res.crc32c)
    assert reader.read(0, 100, 1 << 30)[1] == [r for raws, _ in batches for r in raws]
    with pytest.raises(errors.DataLoss):  # more entries were expected: no object stays
        seal_wal(fs, "l/8.parquet", wal_path, index, 13, ledger_id=7)
    assert fs.get_file_info("l/8.parquet").type == pafs.FileType.NotFound


def test_recovery_keeps_only_the_frame_index(tmp_path):
    rng = random.Random(11)
    batches = [([_msg(rng, rng.randint(1, 3000)) for _ in range(rng.randint(1, 9))], None)
               for _ in range(30)]
    wal_path = str(tmp_path / "7.wal")
    index = _write_wal(wal_path, batches)
    with open(wal_path, "ab") as f:
        f.write(b"\x40\x00\x00\x00torn")
    full = wal.recover(wal_path, truncate=False)
    light = wal.recover(wal_path, keep_raws=False)
    assert light.entries.raws == [] and len(light.entries) == len(full.entries)
    assert light.entries.offset == len(full.entries)
    assert light.entries.size == full.entries.size == sum(len(r) for b, _ in batches for r in b)
    assert light.entries.publish_ms == full.entries.publish_ms
    for rec in (full, light):
        fr = rec.frames
        assert (list(fr.firsts), list(fr.offsets), list(fr.pubs), fr.end, fr.entries) == (
            list(index.firsts), list(index.offsets), list(index.pubs), index.end,
            index.entries)
    assert light.truncated_bytes == 8 and os.path.getsize(wal_path) == index.end


def test_a_new_owner_seals_a_dead_owners_ledger_of_large_entries(tmp_path, arun):
    async def main():
        store = MemoryStore()
        storage = Storage(str(tmp_path / "storage"))
        executor = ThreadPoolExecutor(2)

        async def open_ml(epoch: int) -> ManagedLedger:
            own = keys.ownership("c", TOPIC)
            value = mpb.Ownership(broker_id="b", epoch=epoch).SerializeToString()
            await store.put(own, value)
            return await ManagedLedger.open(TOPIC, store, storage, own, value, epoch,
                                            executor, LedgerConfig(),
                                            entry_cache=EntryCache(64 << 10))

        ml = await open_ml(1)
        rng = random.Random(13)
        sent = []
        for b in range(12):
            raws = [_msg(rng, rng.choice([100, 9000, 30000]), b"k%d" % b) for _ in range(7)]
            await ml.append(raws, wal.request_bytes(raws), sum(map(len, raws)))
            sent += raws
        lid = ml.current_ledger[0]
        tail = ml.tails[lid]
        pubs = list(tail.publish_ms)
        assert tail.offset > 0  # the owner dropped some from memory, then died
        ml2 = await open_ml(2)
        info = next(i for i in ml2.ledgers() if i.ledger_id == lid)
        assert info.state == mpb.SEALED and info.entries == len(sent)
        assert info.size_bytes == sum(map(len, sent))
        assert (info.first_publish_ms, info.last_publish_ms) == (pubs[0], pubs[-1])
        assert not os.path.exists(tail.wal_path)
        got = await ml2.read(MessageId(lid, 0), 1000, 1 << 30)
        assert [e.raw for e in got] == sent and [e.publish_ms for e in got] == pubs
        t = pq.read_table(storage.full(info.path))
        assert t.column("publish_time").to_pylist() == pubs
        await ml2.close()
        await asyncio.sleep(0)

    arun(main())
