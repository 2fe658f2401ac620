"""Where ledgers live: a pyarrow filesystem root shared by every broker and by Spark.

    <root>/ledgers/<topic-path>/<ledger_id>.parquet   sealed ledgers
    <wal_root>/wal/<topic-path>/<ledger_id>.wal       open ledgers' WALs

`root` is a URI pyarrow.fs understands (`file:///data`, `s3://bucket/prefix`, ...); a plain path
means the local filesystem. The WAL lives under the root when the root is a local (POSIX)
filesystem, so a new owner can seal a dead owner's open ledger; with an object-store root it
stays on the broker's local disk (`wal_dir`) and unsealed entries wait for that broker.
Paths stored in etcd are relative to these roots.
"""
from __future__ import annotations

import os

import pyarrow.fs as pafs

from source.core.names import TopicName


class Storage:
    def __init__(self, root: str, wal_dir: str | None = None):
        if "://" not in root:
            root = os.path.abspath(root)
        self.fs, base = pafs.FileSystem.from_uri(root if "://" in root else "file://" + root)
        self.base = base.rstrip("/")
        self.uri = root
        local = isinstance(self.fs, pafs.LocalFileSystem)
        if wal_dir is None:
            if not local:
                raise ValueError("an object-store root needs a local wal_dir")
            wal_dir = self.base
        self.wal_base = os.path.abspath(wal_dir)
        self.shared_wal = local and self.wal_base == self.base

    @staticmethod
    def sealed_rel(topic: TopicName, ledger_id: int) -> str:
        return f"ledgers/{topic.path}/{ledger_id}.parquet"

    @staticmethod
    def wal_rel(topic: TopicName, ledger_id: int) -> str:
        return f"wal/{topic.path}/{ledger_id}.wal"

    def full(self, rel: str) -> str:
        return f"{self.base}/{rel}"

    def wal_path(self, rel: str) -> str:
        return os.path.join(self.wal_base, rel)

    def delete(self, rel: str) -> None:
        try:
            self.fs.delete_file(self.full(rel))
        except (FileNotFoundError, OSError):
            pass

    def delete_wal(self, rel: str) -> None:
        try:
            os.remove(self.wal_path(rel))
        except FileNotFoundError:
            pass

    def list_dir(self, rel_dir: str) -> list[str]:
        """Relative paths of the files directly under `rel_dir` (WAL dirs on the WAL root)."""
        if rel_dir.startswith("wal/"):
            try:
                names = os.listdir(self.wal_path(rel_dir))
            except FileNotFoundError:
                return []
            return [f"{rel_dir}/{n}" for n in names]
        sel = pafs.FileSelector(self.full(rel_dir), allow_not_found=True)
        return [f"{rel_dir}/{info.base_name}" for info in self.fs.get_file_info(sel)
                if info.type == pafs.FileType.File]
