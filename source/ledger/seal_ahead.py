"""Sealing ahead: an open ledger's Parquet file written while the ledger fills, so that its
seal writes only the last entries.

A seal reads the whole ledger back from its WAL and encodes it (~10 us an entry here, most
of it cutting the columns out of each entry). A roll pays it in the background, but a
compaction asks for the open ledger sealed on its request path: 100,000 new entries kept a
recompaction waiting a second before Spark started.

- the file: the one a seal writes (source/ledger/sealed.py), at the same temporary name
  (`.<name>.tmp` beside the sealed file), the same columns and entries, its row groups
  cut at frame boundaries: a group ends before the frame that would take it past
  `GROUP_ROWS` entries or `GROUP_BYTES` of WAL (a larger frame is cut as a seal cuts it),
  so with the usual batches a group is nearly full, and with batches of very uneven sizes
  some are small.
- when: the broker seals ahead once a roll was asked for on the topic (`SealAheadMode`
  "after_roll", source/ledger/writer.py): a compaction asks for one each time, so a
  compacted topic's ledgers are sealed ahead from its first compaction on, and a topic
  only produced to never pays for steps (~100 ms of Python a row group) in its produce
  latency.
- steps: after each group commit the writer offers the ledger's frame index (`offer`, on
  the event loop), and a step that ends offers it again. Once the confirmed frames not yet
  written fill a row group, one step in the executor it was given (the broker's
  `seal-ahead` threads, apart from the WAL's fsyncs) reads them back from the WAL (only
  confirmed frames: fsynced, or in the local copy of the WAL on object storage) and writes
  them as whole row groups; one step at a time per ledger, and never more than what has
  filled whole groups. The file is open only during a step (a broker with many open
  ledgers holds no descriptor for each), and is fsynced once, by the seal.
- the seal (`finish`): waits for the step under way, writes the frames left, fsyncs the
  file, checks its footer and renames it as a seal from the WAL does; the caller then marks
  the ledger SEALED. Nothing reads the temporary file before that.
- failure: a step or a finish that fails (a full disk, a damaged frame) ends the ledger's
  seal-ahead and removes its file; the seal then writes the whole ledger from the WAL, as
  without it. A crash leaves the temporary file, which the next owner's sweep deletes
  (source/ledger/sealing.py) before it seals the ledger from its WAL.
- on an object store the file is written beside the WAL (`.<name>.tmp` in the WAL's
  directory, on the broker's disk: an object appears whole only when its stream closes)
  and the seal copies it to the store in one stream, checks it there and removes the local
  file. A crashed broker's local file stays on its disk until that broker sweeps the
  topic's WAL directory, as it owns the topic again (as its WALs do).
"""
from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
from concurrent.futures import Executor
from typing import BinaryIO, Literal

import pyarrow.fs as pafs

from shadowtopic import failpoints
from shadowtopic.ledger import wal as walmod
from shadowtopic.ledger.sealed import (
    GROUP_BYTES,
    GROUP_ROWS,
    LedgerWriter,
    SealResult,
    page_written,
    publish_local,
    publish_remote,
    release_memory,
    temp_path,
)

log = logging.getLogger("shadowtopic.ledger.managed")

#: When a topic's open ledgers are sealed ahead (source/ledger/writer.py): from the start,
#: once a roll was asked for (a compaction, `topics roll`, `truncate`: the broker's), never
SealAheadMode = Literal["always", "after_roll", "never"]


def group_ends(frames: walmod.FrameIndex, start: int) -> list[int]:
    """From frame `start` on, the ends of the runs of whole frames that each fill a row
    group: a run stops before the frame that would take it past `GROUP_ROWS` entries or
    `GROUP_BYTES` of WAL (a frame larger than that is a run of its own). The frames after
    the last end do not fill a group yet."""
    n = len(frames)
    firsts, offsets = frames.firsts, frames.offsets

    def entry(j: int) -> int:  # the first entry of frame j (n: after the last)
        return firsts[j] if j < n else frames.entries

    def byte(j: int) -> int:
        return offsets[j] if j < n else frames.end

    ends: list[int] = []
    k = start
    while k < n:
        want_e, want_b = firsts[k] + GROUP_ROWS, offsets[k] + GROUP_BYTES
        j = bisect.bisect_left(firsts, want_e, k + 1)
        if j == n and frames.entries < want_e:
            j = n + 1
        jb = bisect.bisect_left(offsets, want_b, k + 1)
        if jb == n and frames.end < want_b:
            jb = n + 1
        j = min(j, jb)
        if j > n:
            break  # not a group's worth yet
        if (entry(j) - firsts[k] > GROUP_ROWS or byte(j) - offsets[k] > GROUP_BYTES) \
                and j - 1 > k:
            j -= 1  # the frame that reached the limit went past it: it starts the next run
        ends.append(j)
        k = j
    return ends


class _AppendFile:
    """The temporary file, opened for a step's writes and closed after them (a broker with
    many open ledgers holds no descriptor for each between steps)."""

    def __init__(self, path: str):
        self.path = path
        self._f: BinaryIO | None = None

    def _open(self) -> BinaryIO:
        if self._f is None:  # never created again here: one a sweep removed fails the step
            f = open(self.path, "r+b")  # noqa: SIM115 - closed by `release`
            f.seek(0, os.SEEK_END)
            self._f = f
        return self._f

    def write(self, data: bytes) -> int:
        return self._open().write(data)

    def fsync(self) -> None:
        f = self._open()
        f.flush()
        os.fsync(f.fileno())

    def release(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def local_temp(fs: pafs.FileSystem, path: str, wal_path: str) -> str:
    """Where the seal-ahead of the ledger sealed to `path` on `fs` writes: the temporary
    name a seal uses on a local root, else the same name beside the ledger's WAL."""
    if isinstance(fs, pafs.LocalFileSystem):
        return temp_path(path)
    return os.path.join(os.path.dirname(wal_path), f".{path.rsplit('/', 1)[1]}.tmp")


class SealAhead:
    """The seal-ahead of one open ledger, sealed to `path` on `fs`: its Parquet file at
    `local_temp(...)`, written a step at a time in `executor` from the WAL at `wal_path`."""

    def __init__(self, fs: pafs.FileSystem, path: str, wal_path: str, ledger_id: int,
                 executor: Executor):
        self.path = path
        self._fs = fs
        self._tmp = local_temp(fs, path, wal_path)
        self._wal_path = wal_path
        self._ledger_id = ledger_id
        self._executor = executor
        self._file: _AppendFile | None = None
        self._writer: LedgerWriter | None = None
        self.frames_written = 0
        self._step: asyncio.Future[int] | None = None
        self._frames: walmod.FrameIndex | None = None  # the ledger's, as last offered
        self._stopping = False  # finish or discard began: no step starts
        self.ended = False  # failed or discarded: the seal writes the whole ledger

    # ---- on the event loop -------------------------------------------------------------

    def offer(self, frames: walmod.FrameIndex) -> None:
        """The ledger confirmed entries: write the frames that fill row groups, unless a
        step is under way (the next offer starts the next one)."""
        self._frames = frames
        if self.ended or self._stopping or self._step is not None:
            return
        ends = group_ends(frames, self.frames_written)
        if not ends:
            return
        window = frames.window(self.frames_written, ends[-1])
        cuts = [e - self.frames_written for e in ends]
        self._step = asyncio.get_running_loop().run_in_executor(
            self._executor, self._write_step, window, cuts, ends[-1])
        self._step.add_done_callback(self._stepped)

    def _stepped(self, step: asyncio.Future[int]) -> None:
        self._step = None
        if step.cancelled():
            self.ended = True
            return
        exc = step.exception()
        if exc is not None:
            self.ended = True
            log.info("ledger %d: sealing ahead stopped (its seal writes it whole): %s",
                     self._ledger_id, exc)
            return
        self.frames_written = step.result()
        if self._frames is not None:  # what filled meanwhile, without waiting for a commit
            self.offer(self._frames)

    async def _settled(self) -> None:
        while self._step is not None:
            await asyncio.wait([self._step])
            await asyncio.sleep(0)  # let the done callback run

    async def finish(self, frames: walmod.FrameIndex, count: int) -> SealResult:
        """The ledger takes no more appends (`frames` holds its `count` entries): write
        the rest, fsync, check and rename the file to `path`. Raises (and removes the file)
        when the seal-ahead ended or this fails: the caller seals from the WAL."""
        self._stopping = True
        await self._settled()
        if self.ended:
            raise RuntimeError("sealing ahead ended")
        self.ended = True
        window = frames.window(self.frames_written, len(frames))
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._finish, window, count)

    async def discard(self) -> None:
        """Stop and remove the file (the ledger is sealed whole, or not here). Never raises."""
        self._stopping = True
        await self._settled()
        self.ended = True
        if self._file is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(self._executor, self._drop)
            except Exception as exc:  # noqa: BLE001 - the sweep of the next owner removes it
                log.warning("ledger %d: could not remove its file sealed ahead: %s",
                            self._ledger_id, exc)

    # ---- in the executor ---------------------------------------------------------------

    def _open(self) -> LedgerWriter:
        if self._writer is None:
            os.makedirs(os.path.dirname(self._tmp), exist_ok=True)
            with open(self._tmp, "wb"):  # a file left by an earlier try starts over
                pass
            self._file = _AppendFile(self._tmp)
            self._writer = LedgerWriter(self._file, self._ledger_id)
        return self._writer

    def _write_step(self, window: walmod.FrameIndex, cuts: list[int], end: int) -> int:
        """Write the frames of `window` as row groups ending at `cuts` (frames into the
        window); returns the ledger's frames written."""
        try:
            failpoints.hit("ledger.seal_ahead.step")
            writer = self._open()
            with walmod.MappedWal(self._wal_path, window) as wal:
                writer.sink.on_write = page_written(wal)
                at = 0
                for run in wal.runs():
                    writer.add((run,))
                    at += 1
                    if at == cuts[0]:  # (a group ends: it holds no view of the mapping)
                        writer.cut()
                        cuts.pop(0)
                writer.sink.on_write = None
            assert self._file is not None
            self._file.release()
        except BaseException:
            self._drop()
            raise
        finally:
            release_memory()  # as a seal does: the broker's RSS stays where it was
        return end

    def _finish(self, window: walmod.FrameIndex, count: int) -> SealResult:
        failpoints.hit("ledger.seal.write")  # as a seal from the WAL
        try:
            writer = self._open()
            with walmod.MappedWal(self._wal_path, window) as wal:
                writer.sink.on_write = page_written(wal)
                writer.add(wal.runs())
                res = writer.close()
            assert self._file is not None
            self._file.fsync()
            self._file.release()
            self._file = self._writer = None
        except BaseException:
            self._drop()
            raise
        finally:
            release_memory()
        if isinstance(self._fs, pafs.LocalFileSystem):
            publish_local(self._fs, self._tmp, self.path, res, count)
        else:
            publish_remote(self._fs, self._tmp, self.path, res, count)
        return res

    def _drop(self) -> None:
        """Forget the file and remove it; never raises (a full disk may have failed the
        writes that brought us here, the removal still happens)."""
        try:
            if self._writer is not None:
                self._writer.abort()
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.release()
        finally:
            self._file = self._writer = None
            with contextlib.suppress(OSError):
                os.remove(self._tmp)
