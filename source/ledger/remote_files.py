"""Sealed ledger files on an object store, fetched whole.

Read by ranges, a remote file costs a round trip per request: a stream for its crc32c, a
GET for the footer and one per column chunk of each row group read (on a local S3 server
about 60 ms for a ledger of 300 KiB, twelve times the one GET of its bytes). So a file of
at most `WHOLE_FILE_BYTES` on an object store is read into memory with one request, its
crc32c checked on those bytes, and its row groups read from them. The process holds at most
`BUDGET_BYTES` of such files at once (`Budget`; a file is given back when its reader is
dropped); past that, or for a bigger file, reads go by ranges as from a local disk. Local
files are always read by ranges: the page cache holds them.
"""
from __future__ import annotations

import threading
import weakref

import pyarrow.fs as pafs

WHOLE_FILE_BYTES = 64 << 20
BUDGET_BYTES = 512 << 20


class Budget:
    """Bytes of whole files held by the process: `take` says whether `n` more fit."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


BUDGET = Budget(BUDGET_BYTES)


def fetch_whole(fs: pafs.FileSystem, path: str, owner: object,
                budget: Budget = BUDGET) -> bytes | None:
    """The whole file at `path` in memory, charged to `budget` until `owner` is collected;
    None for a local file, one over `WHOLE_FILE_BYTES`, or when the budget is spent (the
    caller reads by ranges). Raises what opening or reading raises."""
    if fs.type_name == "local":
        return None
    with fs.open_input_file(path) as f:
        size = f.size()
        if size > WHOLE_FILE_BYTES or not budget.take(size):
            return None
        try:
            data: bytes = f.read(size)
        except BaseException:
            budget.give(size)
            raise
    weakref.finalize(owner, budget.give, size)
    return data
