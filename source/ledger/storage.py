"""Where ledgers live: a pyarrow filesystem root shared by every broker and by Spark.

    <root>/ledgers/<topic-dir>/<ledger_id>-<epoch>.parquet
                                                     sealed ledgers, by the sealing owner's
                                                     epoch (`<ledger_id>.parquet` before it)
    <root>/compacted/<topic-dir>/<job_id>/           compacted ledgers (compaction/ledger.py)
    <wal_root>/wal/<topic-dir>/<ledger_id>.wal       open ledgers' WALs

`root` is a URI pyarrow.fs understands (`file:///data`, `s3://bucket/prefix`, ...); a plain path
means the local filesystem; source/ledger/object_store.py opens it (S3 endpoint, region and
credentials there). The WAL lives under the root when the root is a local (POSIX)
filesystem, so a new owner can seal a dead owner's open ledger; with an object-store root it
stays on the broker's local disk (`wal_dir`) and unsealed entries wait for that broker.
Paths stored in etcd are relative to these roots.

<topic-dir> is `persistent/<tenant>/<namespace>/<topic>` with every segment escaped by
`path_segment`, which is injective and total (it does not trust name validation):

- bytes outside `[A-Za-z0-9_.-]` become `~XX` (two upper-case hex digits of each UTF-8
  byte), and so does a leading `.`: no segment is `.`/`..`/hidden, none holds `/`, NUL,
  `=` (Spark reads `k=v` folders as partitions) or `:` (Hadoop refuses it); `~` itself is
  escaped, so decoding is unique;
- the empty segment is `~` (a lone `~` never comes out of the escaping above);
- an escaped segment longer than 200 bytes is cut to its first 100 bytes (never inside an
  escape) + `~~` + the SHA-256 of the name in hex (`~~` never comes out of the escaping
  above), so every segment stays under 255 bytes.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil

import pyarrow.fs as pafs

from shadowtopic.core.names import TopicName
from shadowtopic.ledger import object_store
from shadowtopic.ledger.disk import DiskState

log = logging.getLogger(__name__)
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
MAX_SEGMENT = 200


def path_segment(name: str) -> str:
    """One name as one safe path segment (module docstring); injective."""
    raw = name.encode("utf-8", "surrogatepass")
    if not raw:
        return "~"
    out = "".join(chr(b) if b in _SAFE and (i or b != 0x2E) else f"~{b:02X}"
                  for i, b in enumerate(raw))
    if len(out) <= MAX_SEGMENT:
        return out
    cut = 100
    tilde = out.rfind("~", cut - 2, cut)
    if tilde >= 0:
        cut = tilde
    return out[:cut] + "~~" + hashlib.sha256(raw).hexdigest()


def topic_dir(topic: TopicName) -> str:
    """`persistent/<tenant>/<namespace>/<topic>`, every segment escaped."""
    return "persistent/" + "/".join(
        path_segment(s) for s in (topic.tenant, topic.namespace, topic.local))


class Storage:
    def __init__(self, root: str, wal_dir: str | None = None,
                 s3: object_store.S3Options | None = None):
        if "://" not in root:
            root = os.path.abspath(root)
        self.s3 = s3 or object_store.S3Options()
        self.fs, self.base = object_store.open_root(root, self.s3)
        self.uri = root
        local = isinstance(self.fs, pafs.LocalFileSystem)
        if wal_dir is None:
            if not local:
                raise ValueError("an object-store root needs a local wal_dir")
            wal_dir = self.base
        self.wal_base = os.path.abspath(wal_dir)
        self.shared_wal = local and self.wal_base == self.base
        #: whether the WAL disk takes writes now (source/ledger/disk.py)
        self.disk = DiskState(self.wal_base)

    @property
    def root_uri(self) -> str:
        """The root as a URI `object_store.open_root` opens alone, in another process (file://
        when local; an s3:// root carries its endpoint and region as URI options)."""
        if isinstance(self.fs, pafs.LocalFileSystem):
            return "file://" + self.base
        if object_store.is_s3(self.uri) and "?" not in self.uri:
            return self.s3.task_uri(self.uri)
        return self.uri

    @staticmethod
    def topic_sealed_dir(topic: TopicName) -> str:
        return f"ledgers/{topic_dir(topic)}"

    @staticmethod
    def topic_wal_dir(topic: TopicName) -> str:
        return f"wal/{topic_dir(topic)}"

    @staticmethod
    def topic_compacted_dir(topic: TopicName) -> str:
        return f"compacted/{topic_dir(topic)}"

    @classmethod
    def compacted_rel(cls, topic: TopicName, job_id: str) -> str:
        """The directory of the compacted ledger that job `job_id` writes."""
        return f"{cls.topic_compacted_dir(topic)}/{path_segment(job_id)}"

    @classmethod
    def sealed_rel(cls, topic: TopicName, ledger_id: int, epoch: int = 0) -> str:
        """A sealed ledger's file; `epoch`, the sealing owner's, makes it that owner's own
        (a deposed owner still sealing never overwrites the file its successor sealed)."""
        name = f"{ledger_id}-{epoch}" if epoch else f"{ledger_id}"
        return f"{cls.topic_sealed_dir(topic)}/{name}.parquet"

    @classmethod
    def wal_rel(cls, topic: TopicName, ledger_id: int) -> str:
        return f"{cls.topic_wal_dir(topic)}/{ledger_id}.wal"

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
        """Remove a WAL; one that cannot be removed now (a read-only disk) stays as an
        orphan, which the topic's next owner sweeps (source/ledger/sealing.py)."""
        try:
            os.remove(self.wal_path(rel))
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove WAL %s (left for the next owner's sweep): %s", rel, exc)

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

    def list_subdirs(self, rel_dir: str) -> list[str]:
        """Relative paths of the directories directly under `rel_dir` (storage root)."""
        sel = pafs.FileSelector(self.full(rel_dir), allow_not_found=True)
        return [f"{rel_dir}/{info.base_name}" for info in self.fs.get_file_info(sel)
                if info.type == pafs.FileType.Directory]

    def delete_dir(self, rel_dir: str) -> None:
        """Remove a directory under the root and everything in it (none: nothing)."""
        try:
            self.fs.delete_dir(self.full(rel_dir))
        except (FileNotFoundError, OSError):
            pass

    def delete_wal_dir(self, rel_dir: str) -> None:
        """Remove a directory under the WAL root and everything in it (none: nothing)."""
        shutil.rmtree(self.wal_path(rel_dir), ignore_errors=True)
