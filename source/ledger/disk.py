"""`DiskState`: whether the broker's data disk takes writes now.

A broker on a full or read-only disk keeps serving reads of its topics; only writes fail,
each with a typed error (`errors.storage_error`): `StorageFull` for ENOSPC/EDQUOT,
`StorageReadOnly` for EROFS. `DiskState` is what the broker knows of its disk:

- `error`: the typed error writes get now, or None while the disk takes writes;
- `report(exc)`: a real write (WAL, seal, new ledger) failed: an ENOSPC/EDQUOT/EROFS marks
  the disk unwritable at once (other errors say nothing about the disk);
- `probe()`: writes PROBE_BYTES to `<dir>/.disk-probe-<pid>`, fsyncs and removes it (off
  the event loop): success marks the disk writable again, a full or read-only disk marks it
  unwritable. The broker probes every PROBE_INTERVAL seconds (source/broker/server.py: its
  Producer health follows `error`); a new ledger probes first when the disk was marked
  unwritable, so it never waits for the next tick nor takes a ledger id in vain.
- `on_change`: called (on the event loop) with the new `error` each time it turns from
  None to an error, back, or from one kind to another.
- `write_failure(disk, exc, what)`: the typed error a failed write of the ledger raises
  (an OSError without an errno, as pyarrow raises some, is checked with a probe).

`error`, `report` and `on_change` belong to the event loop thread; only the file I/O of a
probe runs in a worker thread.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import Executor

from shadowtopic.core import errors

log = logging.getLogger(__name__)
PROBE_BYTES = 4096
PROBE_INTERVAL = 1.0  # seconds between the broker's probes


def probe_write(directory: str) -> OSError | None:
    """Write, fsync and remove a small file in `directory` (blocking): None when it worked,
    else the OSError."""
    path = os.path.join(directory, f".disk-probe-{os.getpid()}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"\0" * PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        _remove(path)
        return exc
    _remove(path)
    return None


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class DiskState:
    def __init__(self, directory: str):
        self.directory = directory
        self.error: errors.ShadowTopicError | None = None
        self.on_change: Callable[[errors.ShadowTopicError | None], None] | None = None

    @property
    def writable(self) -> bool:
        return self.error is None

    def refused(self) -> errors.ShadowTopicError | None:
        """A fresh copy of `error` for a write to raise (None while writable)."""
        err = self.error
        return None if err is None else type(err)(err.message)

    def report(self, exc: OSError) -> None:
        """A real write failed with `exc`: a full or read-only disk is unwritable from now."""
        if exc.errno in errors.STORAGE_ERRNOS:
            self._set(errors.storage_error(exc, f"write to {self.directory}"))

    async def probe(self, executor: Executor | None = None) -> errors.ShadowTopicError | None:
        """Try a small write now; update and return `error`."""
        exc = await asyncio.get_running_loop().run_in_executor(executor, probe_write,
                                                               self.directory)
        if exc is None:
            self._set(None)
        elif exc.errno in errors.STORAGE_ERRNOS:
            self._set(errors.storage_error(exc, f"write to {self.directory}"))
        else:  # not a full or read-only disk (EIO, a missing dir, ...): say so, keep state
            log.warning("disk probe in %s failed: %s", self.directory, exc)
        return self.error

    def _set(self, err: errors.ShadowTopicError | None) -> None:
        before = self.error
        self.error = err
        if type(before) is type(err):
            return
        if err is None:
            log.info("storage %s takes writes again", self.directory)
        else:
            log.warning("storage %s takes no writes: %s", self.directory, err.message)
        if self.on_change is not None:
            self.on_change(err)


async def write_failure(disk: DiskState, exc: OSError, what: str,
                        executor: Executor | None = None) -> errors.ShadowTopicError:
    """The typed error of a failed write (`what`, naming the topic): `StorageFull` /
    `StorageReadOnly` when the disk is the reason (an error without an errno, as pyarrow
    raises some, is checked with a probe), else `Internal`."""
    disk.report(exc)
    if exc.errno not in errors.STORAGE_ERRNOS:
        err = await disk.probe(executor)
        if err is not None:
            return type(err)(f"{what} failed: {err.message}")
    return errors.storage_error(exc, what)
