"""The compaction's task code on its own (compaction/arrow_tasks.py): phase two reads a
file's ids first and then only the row groups that hold a row to keep."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.sealed_tables import ledger_table as table

from shadowtopic.compaction import arrow_tasks


class CountingFile:
    """A ParquetFile that counts the row groups read whole (every column)."""

    def __init__(self, path):
        self.pf = pq.ParquetFile(path)
        self.metadata = self.pf.metadata
        self.groups: list[int] = []

    def read_row_groups(self, groups, columns=None, use_threads=True):
        if columns is None:
            self.groups += list(groups)
        return self.pf.read_row_groups(groups, columns=columns, use_threads=use_threads)


@pytest.mark.parametrize("retain", [True, False])
def test_phase_two_reads_only_the_row_groups_that_hold_a_survivor(tmp_path, retain):
    t = table(1000)
    path = tmp_path / "in.parquet"
    pq.write_table(t, path, row_group_size=100)   # 10 groups
    live = np.array([7 << 32 | e for e in (5, 250, 251, 999)], np.int64)  # groups 0, 2, 9
    f = CountingFile(path)
    got = pa.concat_tables(arrow_tasks._survivors(f, live, retain))
    keep = [e for e in range(1000) if e in (5, 250, 251, 999) or (retain and e % 13 == 0)]
    assert got.column("entry_id").to_pylist() == keep
    assert got.column("payload").to_pylist() == [f"v{e}".encode() for e in keep]
    # keyless rows are in every group: all are read when they are kept, else only three
    assert f.groups == (list(range(10)) if retain else [0, 2, 9])


def test_phase_two_of_a_file_without_survivors_reads_no_row_group(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(table(300), path, row_group_size=100)
    f = CountingFile(path)
    assert list(arrow_tasks._survivors(f, np.array([8 << 32], np.int64), False)) == []
    assert f.groups == []


def test_phase_one_over_row_group_slices_merges_to_the_whole_files(tmp_path):
    """A file cut between tasks at a row group: the tasks' tables merge to the one task's."""
    pq.write_table(table(1000), tmp_path / "7.parquet", row_group_size=100)
    root = f"file://{tmp_path}"
    run = arrow_tasks.latest_per_key(None)
    (whole,) = run(iter([(0, root, ["7.parquet"])]))
    (a,) = run(iter([(0, root, [("7.parquet", 0, 3)])]))
    (b,) = run(iter([(1, root, [("7.parquet", 3, 10)])]))
    assert a.num_rows == b.num_rows == 50  # every key is in both halves
    entries = [[(r["m"] >> 1) - (7 << 32) for r in t.to_pylist()] for t in (a, b)]
    assert max(entries[0]) < 300 <= min(entries[1])  # each read its own row groups only
    merged = arrow_tasks.merge_latest(a, b)
    assert sorted(merged.to_pylist(), key=lambda r: r["key"]) == \
        sorted(whole.to_pylist(), key=lambda r: r["key"])
    latest = {}  # key -> its last keyed row (every 13th row is keyless)
    for i in range(1000):
        if i % 13:
            latest[f"k{i % 50}".encode()] = i
    assert {r["key"]: (r["m"] >> 1) - (7 << 32) for r in merged.to_pylist()} == latest
