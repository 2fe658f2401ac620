"""Compacted ledgers: the stored format, shared by the compaction job that writes them
(compaction/) and the brokers that read them (source/ledger/compacted_view.py).

    <root>/compacted/<topic-dir>/<job_id>/part-*.parquet   the surviving messages
    <root>/compacted/<topic-dir>/<job_id>/manifest.pb      CompactedManifest (metadata.proto)

A compacted ledger holds, for every id at or before its horizon, the latest message of each
key that was not deleted (PIP-14: an empty payload deletes its key and is not written), and
the keyless messages when the topic's `retain_null_key` is on. Rows keep their original ids
and `raw` bytes. Files have the columns of a sealed ledger (`sealed.SCHEMA`: ledger_id,
entry_id, key, is_tombstone, publish_time, raw), rows sorted by (ledger_id, entry_id) within
a file, files in id order with ranges that do not overlap; row groups may have any size (a
reader locates rows from the id columns, not from a fixed group size). A compaction that kept
nothing writes no Parquet file, only its manifest.

The manifest is written last (temp name, fsync, rename), after every data file is durable;
the topic's `CompactionPointer` in etcd (keys.compaction) names it and carries a copy, and
is replaced by one transaction on the previous pointer's revision. A directory that no
pointer names is garbage once its job is over (the compaction worker collects it).
"""
from __future__ import annotations

import os

import google_crc32c
import pyarrow.parquet as pq

from source.core.errors import DataLoss
from source.ledger.storage import Storage
from source.ledger import wal as walmod
from source.pb.storage.v1 import metadata_pb2 as mpb
from source.pb.v1 import common_pb2

MANIFEST = "manifest.pb"


def manifest_rel(dir_rel: str) -> str:
    return f"{dir_rel}/{MANIFEST}"


def _crc(storage: Storage, rel: str, chunk: int = 1 << 20) -> int:
    crc = 0
    with storage.fs.open_input_stream(storage.full(rel)) as f:
        while True:
            data = f.read(chunk)
            if not data:
                return crc
            crc = google_crc32c.extend(crc, data)


def describe_file(storage: Storage, rel: str) -> mpb.CompactedFile | None:
    """The manifest entry of one written data file (None when it holds no rows): rows,
    first and last id (from the id columns), size and crc32c."""
    with storage.fs.open_input_file(storage.full(rel)) as f:
        pf = pq.ParquetFile(f)
        rows = pf.metadata.num_rows
        if rows == 0:
            return None
        ids = pf.read(columns=["ledger_id", "entry_id"])
    lids, eids = ids.column(0), ids.column(1)
    first = common_pb2.MessageIdData(ledger_id=lids[0].as_py(), entry_id=eids[0].as_py())
    last = common_pb2.MessageIdData(ledger_id=lids[rows - 1].as_py(),
                                    entry_id=eids[rows - 1].as_py())
    size = storage.fs.get_file_info(storage.full(rel)).size
    return mpb.CompactedFile(path=rel, rows=rows, first=first, last=last, size_bytes=size,
                             crc32c=_crc(storage, rel))


def write_manifest(storage: Storage, dir_rel: str, manifest: mpb.CompactedManifest) -> str:
    """Write `manifest` durably as the last file of its compacted ledger; returns its path."""
    rel = manifest_rel(dir_rel)
    data = manifest.SerializeToString()
    if storage.shared_wal:  # local filesystem: temp name, fsync, rename, fsync the directory
        path = storage.full(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(os.path.dirname(path), "." + MANIFEST + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        walmod.fsync_dir(os.path.dirname(path))
    else:  # object stores: the object appears whole when the stream closes
        storage.fs.create_dir(storage.full(dir_rel), recursive=True)
        with storage.fs.open_output_stream(storage.full(rel)) as out:
            out.write(data)
    return rel


def read_manifest(storage: Storage, rel: str) -> mpb.CompactedManifest:
    try:
        with storage.fs.open_input_stream(storage.full(rel)) as f:
            return mpb.CompactedManifest.FromString(f.read())
    except (FileNotFoundError, OSError) as exc:
        raise DataLoss(f"compaction manifest missing: {rel} ({exc})") from None
