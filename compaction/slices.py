"""How the compaction's input is cut into tasks (compaction/spark_job.py): its row groups,
in id order, cut into runs of about equal work, one task each, for each phase.

Phase one reads every row's key and ids: its row groups are weighed by their rows. Phase two
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

from dataclasses import dataclass

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq

#: storage-relative file, its first row group and the row group after the last
Slice = tuple[str, int, int]
#: the weight of a row's ids read for nothing, against reading the row whole
PROBE = 0.05


@dataclass(frozen=True)
class Footer:
    """What the cut needs of one input file's footer: its row groups' rows and `entry_id`
    ranges (None where the file keeps no statistics)."""
    rel: str
    rows: tuple[int, ...]
    entries: tuple[tuple[int, int] | None, ...]


def footer(fs: pafs.FileSystem, path: str, rel: str) -> Footer:
    with fs.open_input_file(path) as f:
        meta = pq.ParquetFile(f).metadata
    # (a row group's columns are the leaf columns: a map column before it would shift an
    # Arrow field index)
    paths = [meta.schema.column(i).path for i in range(meta.num_columns)]
    entry = paths.index("entry_id") if "entry_id" in paths else -1
    rows, entries = [], []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        stats = rg.column(entry).statistics if entry >= 0 else None
        rows.append(rg.num_rows)
        entries.append((stats.min, stats.max) if stats is not None and stats.has_min_max
                       else None)
    return Footer(rel, tuple(rows), tuple(entries))


def by_rows(footers: list[Footer]) -> list[tuple[str, list[float]]]:
    """Phase one's weights: every row is read (its key and ids)."""
    return [(f.rel, [float(n) for n in f.rows]) for f in footers]


def by_work(footers: list[Footer], ledger_of: dict[str, int], positions: np.ndarray
            ) -> list[tuple[str, list[float]]]:
    """Phase two's weights against the sorted live `positions`: a row group whose id range
    holds one weighs its rows, one that holds none `PROBE` of them, one whose range is not
    known (no statistics, or a file not in `ledger_of`, the sealed ledgers' ids by file,
    whose groups may span ledgers) its rows."""
    out = []
    for f in footers:
        ledger_id = ledger_of.get(f.rel)
        ws = []
        for n, span in zip(f.rows, f.entries, strict=True):
            if ledger_id is None or span is None:
                ws.append(float(n))
                continue
            lo = np.searchsorted(positions, ledger_id << 32 | span[0], side="left")
            hi = np.searchsorted(positions, ledger_id << 32 | span[1], side="right")
            ws.append(float(n) * (1.0 if hi > lo else PROBE))
        out.append((f.rel, ws))
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
