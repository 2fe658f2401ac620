"""Reads of one sealed ledger from many threads at once (readers of a source and of its
shadows share a `SealedLedger` through their executor threads): every read returns the
right entries and the process survives. pyarrow's ParquetFile crashed (a segfault in
libarrow) when two threads read row groups of one file at the same time."""
from __future__ import annotations

import threading

import pyarrow.fs as pafs

from shadowtopic.ledger import sealed, wal


def test_many_threads_read_one_sealed_ledger(tmp_path):
    raws = [f"message-{i}".encode() * 20 for i in range(20_000)]
    entries = wal.Entries()
    entries.extend(1_700_000_000_000, raws, sum(map(len, raws)))
    path = str(tmp_path / "ledger.parquet")
    _, crc = sealed.write_sealed(pafs.LocalFileSystem(), path, entries, ledger_id=7)
    ledger = sealed.SealedLedger(pafs.LocalFileSystem(), path, crc)
    failures = []

    def reader(seed: int) -> None:
        try:
            for k in range(60):
                start = (seed * 7919 + k * 1031) % len(raws)
                publish, got = ledger.read(start, 300, 1 << 20)
                assert got == raws[start:start + len(got)] and got
                if k % 20 == 0:
                    assert len(ledger.publish_times()) == len(raws)
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures[:3]
    assert not any(t.is_alive() for t in threads)
