"""remote_files: a file on a store that is not the local disk is fetched whole, within the
process's budget, and given back to the budget when its reader is dropped; local files and
big ones are left to ranged reads."""
from __future__ import annotations

import gc

import pyarrow.fs as pafs
from pyarrow._fs import _MockFileSystem

from shadowtopic.ledger import remote_files
from shadowtopic.ledger.remote_files import Budget, fetch_whole


class Owner:
    """Stands for a sealed ledger's reader."""


def store(data: bytes) -> _MockFileSystem:
    fs = _MockFileSystem()
    fs.create_dir("bucket")
    with fs.open_output_stream("bucket/1.parquet") as f:
        f.write(data)
    return fs


def test_a_remote_file_is_fetched_whole_and_its_bytes_go_back_to_the_budget():
    budget = Budget(100)
    owner = Owner()
    assert fetch_whole(store(b"x" * 60), "bucket/1.parquet", owner, budget) == b"x" * 60
    assert budget.used == 60
    second = Owner()  # 60 more do not fit: that one reads by ranges
    assert fetch_whole(store(b"y" * 60), "bucket/1.parquet", second, budget) is None
    assert budget.used == 60
    del owner
    gc.collect()
    assert budget.used == 0


def test_local_and_big_files_are_read_by_ranges(tmp_path, monkeypatch):
    budget = Budget(1 << 30)
    path = tmp_path / "1.parquet"
    path.write_bytes(b"z" * 10)
    assert fetch_whole(pafs.LocalFileSystem(), str(path), Owner(), budget) is None
    monkeypatch.setattr(remote_files, "WHOLE_FILE_BYTES", 9)
    assert fetch_whole(store(b"z" * 10), "bucket/1.parquet", Owner(), budget) is None
    assert budget.used == 0
