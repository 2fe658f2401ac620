"""Phase two's cut (compaction/slices.py): row groups weighed by whether their id range holds a
live position, cut into contiguous runs of about equal weight."""
from __future__ import annotations

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from support.sealed_tables import ledger_table as table

from shadowtopic.compaction import slices
from shadowtopic.ledger.sealed import WRITER_OPTIONS


def test_a_row_group_weighs_its_rows_when_it_holds_a_live_position(tmp_path):
    path = str(tmp_path / "7.parquet")
    pq.write_table(table(1000), path, row_group_size=100, **WRITER_OPTIONS)  # ledger 7
    live = np.array([7 << 32 | 250, 7 << 32 | 999, 8 << 32 | 5], np.int64)
    f = slices.footer(pafs.LocalFileSystem(), path, "7.parquet")
    assert f.rows == (100,) * 10 and f.entries[2] == (200, 299)
    assert slices.by_work([f], {"7.parquet": 7}, live) == [
        ("7.parquet", [5.0, 5.0, 100.0, *[5.0] * 6, 100.0])]
    # a file whose groups may span ledgers (a compacted one) is weighed whole
    assert slices.by_work([f], {}, live) == [("7.parquet", [100.0] * 10)]
    assert slices.by_rows([f]) == [("7.parquet", [100.0] * 10)]
    # without statistics nothing is known of a group's ids
    pq.write_table(table(200), path, row_group_size=100, write_statistics=False)
    f = slices.footer(pafs.LocalFileSystem(), path, "7.parquet")
    assert f.entries == (None, None)
    assert slices.by_work([f], {"7.parquet": 7}, live) == [("7.parquet", [100.0, 100.0])]


def test_runs_are_contiguous_cover_every_row_group_once_and_balance_the_work():
    files = [("old", [1.0] * 10), ("new", [20.0] * 10)]
    runs = slices.cut(files, 2)
    assert runs == [[("old", 0, 10), ("new", 0, 5)], [("new", 5, 10)]]
    # more tasks than row groups: a run each, none empty
    assert slices.cut([("a", [1.0, 1.0])], 4) == [[("a", 0, 1)], [("a", 1, 2)]]
    assert slices.cut([("a", [])], 2) == []
