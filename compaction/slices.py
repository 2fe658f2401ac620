"""Phase two's cut (compaction/spark_job.py): the input's row groups, in id order, cut into
runs of about equal work, one task each.

Phase one's groups are whole files of about equal bytes: every row's key is read. Phase two
reads a file's ids, then only the row groups that hold a survivor (compaction/arrow_tasks.py),
and a key's latest message is near the end of the log: cut like phase one, the task with the
newest ledgers would do nearly all of the work while the others skip theirs. So once the live
positions are known the driver reads each input file's footer and weighs its row groups: one
whose id range (a sealed ledger's id and the group's `entry_id` statistics) holds a live
position weighs its rows, one that holds none a twentieth of them (its ids are still read),
one it cannot tell (no statistics, or a previous compacted ledger's file, whose groups span
ledgers) its rows. The row groups, in id order, are cut into runs of about equal weight; a
run is a list of `Slice`s, `(file, first row group, end row group)`, so the parts the tasks
write are still sorted and follow one another.
"""
from __future__ import annotations

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq

#: storage-relative file, its first row group and the row group after the last
Slice = tuple[str, int, int]
#: the weight of a row's ids read for nothing, against reading the row whole
PROBE = 0.05


def weights(fs: pafs.FileSystem, path: str, ledger_id: int | None, positions: np.ndarray
            ) -> list[float]:
    """Each row group's weight in the file at `path` (`ledger_id`: the one ledger it holds,
    or None when its groups may span ledgers)."""
    with fs.open_input_file(path) as f:
        meta = pq.ParquetFile(f).metadata
    entry = meta.schema.to_arrow_schema().get_field_index("entry_id")
    out = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        stats = rg.column(entry).statistics if entry >= 0 else None
        if ledger_id is None or stats is None or not stats.has_min_max:
            out.append(float(rg.num_rows))
            continue
        lo = np.searchsorted(positions, ledger_id << 32 | stats.min, side="left")
        hi = np.searchsorted(positions, ledger_id << 32 | stats.max, side="right")
        out.append(float(rg.num_rows) * (1.0 if hi > lo else PROBE))
    return out


def cut(files: list[tuple[str, list[float]]], tasks: int) -> list[list[Slice]]:
    """`files` (in id order, each with its row groups' weights) cut into at most `tasks`
    runs of contiguous row groups of about equal weight; runs without row groups dropped."""
    total = sum(sum(w) for _rel, w in files)
    runs: list[list[Slice]] = [[]]
    done = 0.0
    for rel, ws in files:
        for i, w in enumerate(ws):
            if done >= total * len(runs) / tasks and len(runs) < tasks and runs[-1]:
                runs.append([])
            run = runs[-1]
            if run and run[-1][0] == rel and run[-1][2] == i:
                run[-1] = (rel, run[-1][1], i + 1)
            else:
                run.append((rel, i, i + 1))
            done += w
    return [r for r in runs if r]
