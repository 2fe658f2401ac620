"""The compaction as a Spark job (PIP-14 semantics: compaction/reference.py is the oracle).

Spark schedules, Arrow computes. The input (the plan's files: the previous compacted ledger,
then the ledgers sealed since its horizon, in id order; sealed and compacted ledgers have
the same columns, source/ledger/sealed.py) is read by one Spark task per core Spark has
(`defaultParallelism`), fewer when a task would get under `MIN_TASK_BYTES`, each computing
with pyarrow (compaction/arrow_tasks.py). A task's input is a run of row groups contiguous
in id order (compaction/slices.py: the driver reads the files' footers), cut for each
phase by the work it holds. A message's position is one long, `ledger_id << 32 |
entry_id` (entry ids stay below 2^32 and ledger ids below 2^30).

- Phase one (SCANNING_KEYS) reads only `key`, the ids, `is_tombstone` and `publish_time`
  (its runs are of about equal rows): each task reduces its rows to a table of the latest
  `position << 1 | dropped` per key (dropped: a tombstone published before the plan's
  tombstone cutoff, compaction/plan.py; a newer one stays as a delete marker), the
  tables are merged pairwise on the executors (`treeReduce`; one row per key, never
  payloads), keys whose latest message is dropped are dropped, and the live positions
  (one long per key) are broadcast, sorted.
- Phase two (WRITING): each task keeps the rows whose position is in the broadcast set,
  plus keyless rows when `retain_null_key`, and writes them as `part-<task>.parquet`. It
  reads a file's ids first and then every column of only the row groups that hold a row
  to keep: a key's latest message is near the end of the log, so the older ledgers of a
  big topic are hardly read twice. Its tasks are not phase one's: the row groups are cut
  again by the work they hold (compaction/slices.py), or the task with the newest ledgers
  would do nearly all of it. A task's row groups are contiguous in id order, so the parts
  are sorted and their id ranges follow one another: no shuffle and no sort of payloads.
- An input for one task (less than twice `MIN_TASK_BYTES`, 8 MiB: about 100,000 messages
  of 100 bytes, or one core) is one task over its whole files that runs both phases, one
  Spark job with no merge and no broadcast: on a 2-core machine each Spark job with
  Python tasks costs ~0.1 s, which was most of a small topic's compaction. Its record
  enters SCANNING_KEYS and WRITING together as the task starts.

Then the manifest (compaction/ledger.py) lists the parts in id order with their id
ranges, sizes and checksums, and is written last. The job keeps no state on the driver
beyond the broadcast; its tasks need the storage root reachable from every executor and
this package installed in the executors' Python (`pip install shadowtopic[compaction]`):
`local-cluster[...]` (separate executor JVMs and Python workers) and a standalone Spark
cluster (tests/test_integration/test_spark_cluster.py, `make test-cluster`) prove it.
The job uses Spark's core (RDDs, broadcast, treeReduce), not its SQL engine: on 2 cores and
5,000,000 messages, Spark SQL doing the same two phases with its own Parquet reader took
2-3x as long as these Arrow tasks (bench/NOTES.md), and DataFrame `mapInArrow` needs
pandas, which pyarrow then imports into every broker process.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from shadowtopic.compaction import arrow_tasks, slices
from shadowtopic.compaction.ledger import describe_file
from shadowtopic.compaction.manifest import finish_manifest, new_manifest
from shadowtopic.compaction.plan import Plan
from shadowtopic.ledger.storage import Storage
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

#: Spark conf: the least input bytes a task gets (fewer tasks for small inputs; 0 in tests
#: that want many tasks of little data)
MIN_TASK_BYTES = "spark.shadowtopic.compaction.minTaskBytes"
MIN_TASK_BYTES_DEFAULT = 8 << 20
#: a job's progress: (phase, tasks done, tasks in the phase; 0 and 0 as a phase begins)
Progress = Callable[[mpb.CompactionJobPhase, int, int], None]


def groups(files: list[str], sizes: list[int], tasks: int, min_bytes: int = 0
           ) -> list[list[str]]:
    """`files` (in id order) cut into at most `tasks` runs of contiguous files of about
    equal bytes (`sizes`), fewer when a run would hold less than `min_bytes`."""
    total = sum(sizes)
    tasks = max(1, min(tasks, len(files), total // min_bytes if min_bytes else tasks))
    out: list[list[str]] = [[]]
    done = 0
    for rel, size in zip(files, sizes, strict=True):
        if out[-1] and len(out) < tasks and done >= total * len(out) / tasks:
            out.append([])
        out[-1].append(rel)
        done += size
    return out


class _Tracker:
    """Reports Spark's task progress of the running phase: (phase, done, total) from the
    status tracker's stages of this job's Spark jobs (its job group: the worker may run
    several compactions at once), polled every `every` seconds in a daemon thread."""

    def __init__(self, spark, progress: Progress | None, group: str, every: float = 0.5):
        self.sc = spark.sparkContext
        self.group = group
        self.progress = progress
        self.every = every
        self.phase = mpb.JOB_SCANNING_KEYS
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _Tracker:
        if self.progress is not None:
            self._thread = threading.Thread(target=self._run, args=(self.progress,),
                                            daemon=True, name="spark-progress")
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def set(self, phase: mpb.CompactionJobPhase) -> None:
        self.phase = phase
        if self.progress is not None:
            self.progress(phase, 0, 0)

    def _run(self, progress: Progress) -> None:
        tracker = self.sc.statusTracker()
        while not self._stop.wait(self.every):
            done = total = 0
            active = set(tracker.getActiveStageIds())
            for jid in tracker.getJobIdsForGroup(self.group):
                job = tracker.getJobInfo(jid)
                if job is None or job.status != "RUNNING":
                    continue
                for sid in job.stageIds:
                    info = tracker.getStageInfo(sid) if sid in active else None
                    if info is not None:
                        done += info.numCompletedTasks
                        total += info.numTasks
            if total:
                progress(self.phase, done, total)


def _tasks(spark, root: str, cut: list[list[str]]):
    """The job's tasks: an RDD with one (task, root, files) per partition."""
    rows = [(i, root, g) for i, g in enumerate(cut)]
    return spark.sparkContext.parallelize(rows, len(rows))


def _slice_tasks(spark, storage: Storage, runs: list[list[slices.Slice]]):
    """An RDD with one (task, root, slices) per partition (one task of nothing when there
    are no row groups at all)."""
    rows = [(i, storage.root_uri, run) for i, run in enumerate(runs or [[]])]
    return spark.sparkContext.parallelize(rows, len(rows))


def _live_positions(tasks, tombstone_cutoff_ms: int | None = None) -> np.ndarray:
    """Phase one: the sorted positions of every key's latest message, tombstones older than
    the cutoff dropped (the tasks' partial tables merged on the executors, the last merge
    on the driver)."""
    latest = tasks.mapPartitions(arrow_tasks.latest_per_key(tombstone_cutoff_ms)).treeReduce(
        arrow_tasks.merge_latest, depth=2)
    return arrow_tasks.live_positions(latest)


def warm_up(spark) -> None:
    """Run phase one over no files in a task per core: the Python workers that run the
    tasks start and import what they need before the first job, not during it (and stay
    started: the worker runs it again while idle, compaction/jobs.py WARM_EVERY)."""
    spark.sparkContext.setJobGroup("compaction-warm-up", "keeps the Python workers started")
    _live_positions(_tasks(spark, "file:///", [[] for _ in range(
        spark.sparkContext.defaultParallelism)]))


def run(spark, plan: Plan, storage: Storage, out_dir_rel: str,
        progress: Progress | None = None) -> mpb.CompactedManifest:
    """Compact `plan`'s input into `out_dir_rel` (replaced if it exists: a rerun of a
    crashed job writes the same result) and write its manifest; returns the manifest."""
    storage.delete_dir(out_dir_rel)
    storage.fs.create_dir(storage.full(out_dir_rel), recursive=True)
    manifest = new_manifest(plan)
    files = plan.input_files()
    if not files:
        finish_manifest(manifest, storage, out_dir_rel, 0, 0)
        return manifest
    sc = spark.sparkContext
    cut = groups(files, plan.input_sizes(), sc.defaultParallelism,
                 int(spark.conf.get(MIN_TASK_BYTES, str(MIN_TASK_BYTES_DEFAULT))))
    group = f"compaction-{plan.job_id}"
    # (this thread's Spark jobs: PySpark pins each Python thread to a JVM thread, whose
    # job group this is)
    sc.setJobGroup(group, f"compaction of {plan.topic}, job {plan.job_id}")
    with _Tracker(spark, progress, group) as tracker:
        tracker.set(mpb.JOB_SCANNING_KEYS)
        if len(cut) == 1:  # one task: both phases in it, one Spark job
            tracker.set(mpb.JOB_WRITING)
            written = _tasks(spark, storage.root_uri, cut).mapPartitions(
                arrow_tasks.compact_alone(plan.tombstone_cutoff_ms, plan.retain_null_key,
                                          out_dir_rel)).collect()
            live = sum(n for *_, n in written)
        else:  # row groups cut by rows for phase one, by the work they hold for phase two
            footers = [slices.footer(storage.fs, storage.full(rel), rel) for rel in files]
            positions = _live_positions(
                _slice_tasks(spark, storage, slices.cut(slices.by_rows(footers), len(cut))),
                plan.tombstone_cutoff_ms)
            live = len(positions)
            tracker.set(mpb.JOB_WRITING)
            ledger_of = {info.path: info.ledger_id for info in plan.ledgers}
            runs = slices.cut(slices.by_work(footers, ledger_of, positions), len(cut))
            broadcast = sc.broadcast(positions)
            try:
                written = _slice_tasks(spark, storage, runs).mapPartitions(
                    arrow_tasks.write_survivors(broadcast, plan.retain_null_key,
                                                out_dir_rel)).collect()
            finally:
                broadcast.destroy()
    described: list[mpb.CompactedFile] = []
    for rel in sorted(storage.list_dir(out_dir_rel)):
        name = rel.rsplit("/", 1)[1]
        f = describe_file(storage, rel) \
            if name.startswith("part-") and name.endswith(".parquet") else None
        if f is not None:
            described.append(f)
        else:  # a killed attempt's temp file (or a part without rows: nothing to serve)
            storage.delete(rel)
    described.sort(key=lambda f: (f.first.ledger_id, f.first.entry_id))
    if sum(f.rows for f in described) != sum(w[1] for w in written):
        raise RuntimeError(f"compaction {plan.job_id}: the parts do not hold what the tasks "
                           "wrote")
    manifest.files.extend(described)
    tombstones = sum(w[2] for w in written)
    finish_manifest(manifest, storage, out_dir_rel, plan.input_entries, live - tombstones,
                    tombstones)
    return manifest
