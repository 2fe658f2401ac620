"""The compaction as a Spark job (PIP-14 semantics: compaction/reference.py is the oracle).

Input: the plan's files (the previous compacted ledger and the ledgers sealed since its
horizon) read as one DataFrame: sealed and compacted ledgers have the same columns
(source/ledger/sealed.py). A message's position is one long, `ledger_id << 32 | entry_id`
(entry ids stay below 2^32 and ledger ids below 2^30: ledgers roll long before).

- Phase one (SCANNING_KEYS) reads only `key`, the ids and `is_tombstone`: the latest position
  of each key, keys whose latest message is a tombstone dropped. The result, one long per
  live key, is cached and counted. (The latest message per key is the max of
  `position << 1 | is_tombstone` over the key's rows: one long aggregate, no struct.)
- Phase two (WRITING) reads every column and keeps the rows whose position is in that set
  through a broadcast left-semi join (the set goes to every task; payloads are never
  shuffled by key), plus the keyless rows when `retain_null_key`; sorted by id and written
  as Parquet into the job's directory. Small outputs are gathered into one task after the
  parallel filter and sorted there (one file);
  large ones by a range-partitioned global sort (files in id order).

Then the manifest (source/ledger/compacted.py) lists the files in id order with their id
ranges, sizes and checksums, and is written last. The job keeps no state on the driver
beyond the broadcast: it runs the same on a cluster (`local-cluster[...]`, a test proves it).
"""
from __future__ import annotations

import threading
from typing import Callable

import pyarrow.fs as pafs

from compaction.plan import Plan
from compaction.reference import finish_manifest, new_manifest
from source.ledger.compacted import describe_file
from source.ledger.storage import Storage
from source.pb.storage.v1 import metadata_pb2 as mpb
from source.pb.v1 import admin_pb2 as apb

#: sealed.SCHEMA in Spark's DDL (given, so reading starts without opening every footer)
SPARK_SCHEMA = ("ledger_id BIGINT, entry_id BIGINT, key BINARY, is_tombstone BOOLEAN, "
                "publish_time BIGINT, raw BINARY")
ONE_FILE_ROWS = 2_000_000   # outputs up to this many rows are sorted in one task
Progress = Callable[[int, int, int], None]


def _uri(storage: Storage, rel: str) -> str:
    """What Spark reads `rel` as: file:// for a local root, the root's scheme otherwise."""
    if isinstance(storage.fs, pafs.LocalFileSystem):
        return "file://" + storage.full(rel)
    return storage.uri.split("://", 1)[0] + "://" + storage.full(rel)


class _Tracker:
    """Reports Spark's task progress of the running phase: (phase, done, total) from the
    status tracker's active stages, polled every `every` seconds in a daemon thread."""

    def __init__(self, spark, progress: Progress | None, every: float = 0.5):
        self.sc = spark.sparkContext
        self.progress = progress
        self.every = every
        self.phase = apb.SCANNING_KEYS
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self) -> "_Tracker":
        if self.progress is not None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="spark-progress")
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def set(self, phase: int) -> None:
        self.phase = phase
        if self.progress is not None:
            self.progress(phase, 0, 0)

    def _run(self) -> None:
        tracker = self.sc.statusTracker()
        while not self._stop.wait(self.every):
            done = total = 0
            for sid in tracker.getActiveStageIds():
                info = tracker.getStageInfo(sid)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
            if total:
                self.progress(self.phase, done, total)


def run(spark, plan: Plan, storage: Storage, out_dir_rel: str,
        progress: Progress | None = None) -> mpb.CompactedManifest:
    """Compact `plan`'s input into `out_dir_rel` (replaced if it exists: a rerun of a
    crashed job writes the same result) and write its manifest; returns the manifest."""
    from pyspark.sql import functions as F

    storage.delete_dir(out_dir_rel)
    manifest = new_manifest(plan)
    files = plan.input_files()
    if not files:
        storage.fs.create_dir(storage.full(out_dir_rel), recursive=True)
        finish_manifest(manifest, storage, out_dir_rel, 0, 0)
        return manifest
    with _Tracker(spark, progress) as tracker:
        df = spark.read.schema(SPARK_SCHEMA).parquet(*[_uri(storage, rel) for rel in files])
        pos = F.shiftleft(F.col("ledger_id"), 32) + F.col("entry_id")
        tracker.set(apb.SCANNING_KEYS)
        # position and tombstone flag in one long (position << 1 | tombstone): the max per
        # key is its latest message, whose low bit says whether it deleted the key
        marked = F.shiftleft(pos, 1) + F.col("is_tombstone").cast("long")
        latest = (df.where(F.col("key").isNotNull())
                  .select("key", marked.alias("m"))
                  .groupBy("key").agg(F.max("m").alias("m"))
                  .where(F.col("m") % 2 == 0)
                  .select(F.shiftright("m", 1).alias("pos"))
                  .cache())
        keys = latest.count()
        tracker.set(apb.WRITING)
        kept = df.withColumn("pos", pos).join(F.broadcast(latest), "pos", "left_semi")
        if plan.retain_null_key:
            kept = kept.unionByName(df.where(F.col("key").isNull()).withColumn("pos", pos))
        kept = kept.drop("pos")
        if keys < ONE_FILE_ROWS:
            out = kept.repartition(1).sortWithinPartitions("ledger_id", "entry_id")
        else:
            out = kept.orderBy("ledger_id", "entry_id")
        out.write.mode("overwrite").parquet(_uri(storage, out_dir_rel))
        latest.unpersist()
        entries_in = plan.input_entries
    described = []
    for rel in sorted(storage.list_dir(out_dir_rel)):
        name = rel.rsplit("/", 1)[1]
        if name.endswith(".crc"):  # Hadoop's checksum files: the manifest has crc32c
            storage.delete(rel)
            continue
        if not name.endswith(".parquet") or name.startswith((".", "_")):
            continue
        f = describe_file(storage, rel)
        if f is None:
            storage.delete(rel)  # an empty part: not listed, not kept
        else:
            described.append(f)
    described.sort(key=lambda f: (f.first.ledger_id, f.first.entry_id))
    manifest.files.extend(described)
    finish_manifest(manifest, storage, out_dir_rel, entries_in, keys)
    return manifest
