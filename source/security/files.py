"""Secret files (keys, tokens, certificates): written whole or not at all, mode 0600."""
from __future__ import annotations

import os


def write_private(path: str, data: bytes) -> None:
    """`data` at `path`, readable by its owner only: a temp file beside it, fsynced, then
    renamed over it (a reader never sees half of it; a crash leaves the old one)."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
