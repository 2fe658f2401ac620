"""A data directory held by one process: an exclusive lock file.

    <data-dir>/LOCK          held by `shadowtopic standalone`
    <data-dir>/broker.lock   held by a broker (source or shadow) on its data dir

The file holds one line naming its holder (`pid 1234 (shadowtopic standalone)`). The lock is
`flock(LOCK_EX | LOCK_NB)` on it: the kernel lets it go when the holder exits, even under
kill -9, so a stale file never blocks a restart. A second process on a held directory is
refused at once (`DataDirInUse`, one line naming the holder) and writes nothing: it opens
the existing file without truncating it and closes it again.
"""
from __future__ import annotations

import fcntl
import os

STANDALONE = "LOCK"
BROKER = "broker.lock"


class DataDirInUse(RuntimeError):
    """The directory is held by another process (the message names it)."""


class DirLock:
    """A held lock; `release()` (or the process's exit) lets it go."""

    def __init__(self, fd: int, path: str):
        self.fd = fd
        self.path = path

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)   # closing the descriptor drops the flock
            self.fd = -1

    def __enter__(self) -> DirLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(data_dir: str, what: str, name: str = STANDALONE) -> DirLock:
    """Hold `<data_dir>/<name>` for this process, described as `what`; creates the directory.
    Raises DataDirInUse when another process holds it, OSError when it cannot be opened."""
    path = os.path.join(data_dir, name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        os.makedirs(data_dir, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip().splitlines()
        os.close(fd)
        raise DataDirInUse(f"data dir {os.path.abspath(data_dir)} is in use by "
                           f"{holder[0] if holder else 'another process'} (it holds {path})"
                           ) from None
    except BaseException:
        os.close(fd)
        raise
    line = f"pid {os.getpid()} ({what})\n".encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, line, 0)
    except OSError:
        pass  # a full disk: the lock holds all the same, nameless
    return DirLock(fd, path)
