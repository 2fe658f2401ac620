"""The compaction worker's jobs: `Worker` follows the requests, claims and runs each job,
commits and collects (the process around it, with its Spark session, flags, health and
metrics endpoint: compaction/worker.py).

It follows its cluster's compaction requests (keys.compaction_requests_prefix; a broker
files one when a user asks `topics compact` or the threshold policy fires: see
compaction/admin.py) and runs up to `max_concurrent_jobs` jobs at once (one by default; each
a topic of its own, its Spark jobs in a job group of its own, so Spark schedules the jobs'
tasks side by side on the cluster's cores):

    claim --> SCANNING_KEYS --> WRITING --> COMMITTING --> DONE     (any step: FAILED)

- claim: a key under this worker's etcd lease (keys.compaction_claim), so two workers never
  run one job and a dead worker's jobs are taken over once its lease expires (every worker
  re-lists the requests every `relist` seconds);
- plan (compaction/plan.py) from the ledger list, the current pointer (its mod revision is
  what the commit compares), the topic's `retain_null_key` and the tombstone cutoff of the
  request (its time minus the `delete_retention_seconds` it carries: a rerun keeps the same
  deletes; a request without it, from an older broker, takes the topic's policy now);
- the Spark job (compaction/spark_job.py) writes `<root>/compacted/<topic-dir>/<job_id>/`;
  Spark's progress and the driver's peak memory go into the job record as it runs;
- commit (compaction/commit.py): one transaction publishes the pointer, marks the job DONE
  and deletes the request; the replaced compacted ledger is collected after `grace` seconds
  (with the Iceberg tables on, once no snapshot refers to it: compaction/tables.py, which
  follows the published pointer into the topic's table by itself).

A job that fails is recorded FAILED with its error (an `ErrorStatus`) and its request is
deleted; a worker killed mid-job leaves the request and its claim's lease expires: the job
reruns under the same id and gives the same result (K16). A job whose Spark lost a Python
worker or an executor under it runs again, `JOB_ATTEMPTS` times in all, before it is FAILED
with the cause.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from shadowtopic import failpoints
from shadowtopic.compaction import commit, spark_job
from shadowtopic.compaction import plan as planning
from shadowtopic.compaction.metrics import CompactionMetrics
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import object_store
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import MetadataStore, MetadataUnavailable, Snapshot, WatchEvent, keys
from shadowtopic.metadata.follow import PrefixFollower
from shadowtopic.metadata.migrate import migrate
from shadowtopic.metadata.topic_info import effective_policies
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

if TYPE_CHECKING:
    from py4j.java_gateway import JavaGateway

    from shadowtopic.compaction.tables import TableKeeper

#: runs of a job when Spark loses a Python worker or an executor under it (F15)
JOB_ATTEMPTS = 3
#: what Spark's errors say when a Python worker or an executor was lost (worth a rerun)
LOST_WORKER = ("Python worker exited unexpectedly", "ExecutorLostFailure",
               "Python worker failed to connect back", "Connection reset by peer")


class SparkLost(RuntimeError):
    """Spark's JVM is gone: this worker can run no job."""


def spark_gateway() -> JavaGateway | None:
    """This process's py4j gateway to Spark's JVM (None before a session starts; one per
    process): its `jvm` reaches the JVM, and its `proc`, when it has one, is the JVM process
    of a local driver. pyspark offers no public accessor for it."""
    from pyspark import SparkContext
    return SparkContext._gateway  # noqa: SLF001 - pyspark's only handle on its JVM


def jvm_alive() -> bool:
    """Whether the JVM of this process's SparkSession still runs (a local driver: its
    process; a session whose JVM is not our child counts as alive)."""
    proc = getattr(spark_gateway(), "proc", None)  # a gateway that launched no JVM has none
    return proc is None or proc.poll() is None


#: what an error says when the driver lost its connection to Spark's JVM (which may be dying)
GATEWAY_LOST = ("Connection refused", "Py4JNetworkError", "Answer from Java side is empty",
                "Error while sending or receiving", "Connection reset by peer",
                # py4j's answer to a call whose connection broke (it logs the network error
                # and raises this, unchained); a Java exception is a Py4JJavaError instead
                "Py4JError: An error occurred while calling")


def gateway_lost(exc: BaseException) -> bool:
    """Whether a job's error may be the driver's connection to Spark's JVM breaking (the
    error or one it was raised from)."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen and len(seen) < 20:
        seen.add(id(at))
        text = f"{type(at).__name__}: {at}"
        if isinstance(at, ConnectionError) or any(mark in text for mark in GATEWAY_LOST):
            return True
        at = at.__cause__ or at.__context__
    return False


def lost_worker(exc: BaseException) -> bool:
    """Whether a job's error is Spark losing a Python worker or an executor."""
    text = str(exc)
    return any(mark in text for mark in LOST_WORKER)


log = logging.getLogger("shadowtopic.compaction.worker")  # one logger name for the process
KEEP_JOBS = 10          # job records kept per topic
COLLECT_ATTEMPTS = 10   # collections of a replaced compacted ledger tried (Iceberg away)
PROGRESS_EVERY = 0.5    # seconds between job-record updates while Spark runs
#: Spark stops a Python worker idle for a minute (PythonWorkerFactory, not configurable) and
#: the next job pays for starting new ones (their imports: 0.6-1.5 s on 2 cores, most of a
#: small compaction): while no job runs, a job over no files this often keeps them
WARM_EVERY = 30.0


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(c) for c in f.read().split()]
                out += kids
                todo += kids
        except OSError:
            pass
    return out


def peak_rss_bytes(jvm_pid: int | None) -> int:
    """Peak resident memory (VmHWM) of this process plus Spark's driver JVM and the Python
    workers it runs tasks in (its descendants)."""
    total = 0
    pids = ["self"] + ([str(p) for p in [jvm_pid, *_descendants(jvm_pid)]] if jvm_pid else [])
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


class Worker:
    def __init__(self, store: MetadataStore, spark, cluster: str, worker_id: str,
                 grace: float = 60.0, lease_ttl: int = 10, relist: float = 5.0,
                 spark_alive: Callable[[], bool] = jvm_alive,
                 metrics: CompactionMetrics | None = None,
                 s3: object_store.S3Options | None = None, scratch_dir: str = ".",
                 tables: TableKeeper | None = None, max_concurrent_jobs: int = 1,
                 warm_every: float | None = WARM_EVERY,
                 warm: Callable[[], None] | None = None):
        if max_concurrent_jobs < 1:
            raise ValueError(f"max_concurrent_jobs must be at least 1, not {max_concurrent_jobs}")
        self.store = store
        self.max_concurrent_jobs = max_concurrent_jobs
        #: the topics' Iceberg tables (compaction/tables.py); None: off
        self.tables = tables
        #: how this worker opens an object-store root (source/ledger/object_store.py); a
        #: Storage needs a local WAL dir with such a root, the worker writes no WAL there
        self.s3 = s3
        self.scratch_dir = os.path.abspath(scratch_dir)
        #: job series (compaction/metrics.py); False in `etcd_ok` while the lease fails
        self.metrics = metrics or CompactionMetrics(cluster)
        self.etcd_ok = True
        #: the topics whose jobs run now (a topic runs one job at a time), and when each began
        self._running: dict[TopicName, float] = {}
        #: when the last job (or keep-warm job) ended; the keep-warm job runs
        #: `warm` (default: spark_job.warm_up) when none ran for `warm_every` seconds
        self._last_active = time.monotonic()
        self.warm_every = warm_every if spark is not None or warm is not None else None
        self._warm = warm or (lambda: spark_job.warm_up(self.spark))
        self.warm_runs = 0
        self.spark_alive = spark_alive
        #: set when Spark's JVM is gone (the worker runs no more jobs: its process exits)
        self.lost = asyncio.Event()
        self.cluster = cluster
        self.spark = spark
        self.worker_id = worker_id
        self.grace = grace
        self.lease_ttl = lease_ttl
        self.relist = relist
        self.lease = 0
        self._queue: asyncio.Queue[TopicName] = asyncio.Queue()
        self._queued: set[TopicName] = set()
        self._storages: dict[str, Storage] = {}
        self._executor = ThreadPoolExecutor(max_concurrent_jobs + 1,
                                            thread_name_prefix="compaction")
        self._tasks: list[asyncio.Task] = []
        #: the cluster's compaction requests (list, then watch): each one queued once
        self._requests = PrefixFollower(store, keys.compaction_requests_prefix(cluster),
                                        self._on_requests, self._on_request_events)
        self.jobs_run = 0
        self._jvm_pid: int | None = None  # Spark's driver JVM, whose memory jobs report
        gateway = spark_gateway() if spark is not None else None
        if gateway is not None:
            try:
                self._jvm_pid = int(gateway.jvm.java.lang.ProcessHandle.current().pid())
            except Exception:  # noqa: BLE001 - a remote driver: only our own memory
                self._jvm_pid = None

    # ---- life ------------------------------------------------------------------------------

    async def start(self) -> None:
        await migrate(self.store)  # job records of an older layout move first (once)
        self.lease = await self.store.grant_lease(self.lease_ttl)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._keep_lease()),
                       loop.create_task(self._requests.start_retrying()),
                       loop.create_task(self._relist()),
                       *(loop.create_task(self._run_jobs())
                         for _ in range(self.max_concurrent_jobs))]
        if self.warm_every is not None:
            self._tasks.append(loop.create_task(self._keep_warm(self.warm_every)))
        if self.tables is not None:
            await self.tables.start()

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._requests.close()
        if self.tables is not None:
            await self.tables.close()
        try:
            await self.store.revoke_lease(self.lease)
        except Exception:  # noqa: BLE001 - it expires anyway
            pass
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _keep_warm(self, every: float) -> None:
        """While no job runs, a job over no files every `every` seconds (WARM_EVERY)."""
        loop = asyncio.get_running_loop()
        while True:
            # (at least a second, or `every`, between looks: a job may run a long while)
            await asyncio.sleep(max(min(1.0, every), self._last_active + every - time.monotonic()))
            if self._running or time.monotonic() - self._last_active < every:
                continue
            try:
                await loop.run_in_executor(self._executor, self._warm)
                self.warm_runs += 1
            except Exception as exc:  # noqa: BLE001 - a lost JVM is follow_spark's to see
                log.debug("keeping Spark's Python workers warm: %s", exc)
            self._last_active = time.monotonic()

    async def _keep_lease(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            try:
                await self.store.refresh_lease(self.lease)
                self.etcd_ok = True
            except Exception as exc:  # noqa: BLE001 - a lost lease: take a new one
                self.etcd_ok = False
                log.warning("lease refresh failed (%s); taking a new lease", exc)
                try:
                    self.lease = await self.store.grant_lease(self.lease_ttl)
                except MetadataUnavailable:
                    pass

    def _enqueue(self, key: str) -> None:
        topic = keys.topic_from_compaction_request(self.cluster, key)
        # (a topic whose job runs here is not queued again: its request goes when the job
        # ends, or a relist queues it again)
        if topic is not None and topic not in self._queued and topic not in self._running:
            self._queued.add(topic)
            self._queue.put_nowait(topic)

    async def _on_requests(self, snap: Snapshot) -> None:
        for kv in snap.items:
            self._enqueue(kv.key)

    async def _on_request_events(self, events: list[WatchEvent]) -> None:
        for ev in events:
            if ev.type == "put":
                self._enqueue(ev.key)

    async def _relist(self) -> None:
        """Requests whose worker died (their claims expire) are found again here."""
        while True:
            await asyncio.sleep(self.relist)
            try:
                snap = await self.store.get_prefix(
                    keys.compaction_requests_prefix(self.cluster))
            except MetadataUnavailable:
                continue
            for kv in snap.items:
                self._enqueue(kv.key)

    async def _run_jobs(self) -> None:
        while True:
            topic = await self._queue.get()
            self._queued.discard(topic)
            try:
                await self.run(topic)
            except SparkLost as exc:
                log.error("%s: %s", topic, exc)
                self.lost.set()
                return
            except Exception:  # noqa: BLE001 - one job never stops the worker
                log.exception("%s: compaction failed", topic, extra={"topic": str(topic)})

    # ---- one job ---------------------------------------------------------------------------

    def storage(self, root: str) -> Storage:
        st = self._storages.get(root)
        if st is None:
            local = "://" not in root or root.startswith("file://")
            st = self._storages[root] = Storage(root, None if local else self.scratch_dir,
                                                self.s3)
        return st

    async def _put_job(self, topic: TopicName, job: mpb.CompactionJob) -> None:
        await self.store.put(keys.compaction_job(topic, job.job_id), job.SerializeToString())

    async def run(self, topic: TopicName) -> None:
        """The job of `topic`'s request, if there is one and no other worker holds it."""
        if topic in self._running:
            return  # (its job runs here now)
        self._running[topic] = time.monotonic()
        self.metrics.running = len(self._running)
        try:
            await self._claim_and_run(topic)
        finally:
            del self._running[topic]
            self.metrics.running = len(self._running)
            self._last_active = time.monotonic()

    def _elapsed(self, topic: TopicName) -> float:
        return time.monotonic() - self._running.get(topic, time.monotonic())

    async def _claim_and_run(self, topic: TopicName) -> None:
        kv = await self.store.get(keys.compaction_request(self.cluster, topic))
        if kv is None:
            return
        claim = keys.compaction_claim(self.cluster, topic)
        if not await self.store.create(claim, self.worker_id.encode(), self.lease):
            held = await self.store.get(claim)
            if held is None or held.value != self.worker_id.encode():
                return  # another worker runs it
            # ours, left by a run whose release failed (etcd was away): a topic's jobs run
            # one at a time here (`_running`), so nothing of ours runs it now
            log.info("%s: taking back this worker's own claim", topic)
        try:
            req = mpb.CompactionRequest.FromString(kv.value)
            job = mpb.CompactionJob(job_id=req.job_id, topic=str(topic), trigger=req.trigger,
                                    start_time=int(time.time() * 1000))
            rec = await self.store.get(keys.compaction_job(topic, req.job_id))
            if rec is not None:
                job = mpb.CompactionJob.FromString(rec.value)
            job.worker = self.worker_id
            job.ClearField("error")
            await self._attempts(topic, req, kv.value, job)
            self.jobs_run += 1
            await self._prune(topic)
        finally:
            try:
                await self.store.delete(claim)
            except MetadataUnavailable:
                pass  # it goes with the lease

    async def _attempts(self, topic: TopicName, req: mpb.CompactionRequest, req_bytes: bytes,
                        job: mpb.CompactionJob) -> None:
        """Run the job; again when Spark lost a Python worker or an executor under it (up to
        `JOB_ATTEMPTS` runs), else record it FAILED. When Spark's JVM is gone the job is
        not FAILED: `SparkLost` leaves its request to the next worker. Nor when etcd is
        away (`MetadataUnavailable`): the request stays, and the worker's relist runs the
        job again once etcd answers (recording it FAILED would need etcd too)."""
        for attempt in range(1, JOB_ATTEMPTS + 1):
            try:
                return await self._run(topic, req, req_bytes, job)
            except MetadataUnavailable:
                log.warning("%s: job %s stopped: etcd is unavailable; it runs again once etcd "
                            "is back", topic, req.job_id,
                            extra={"topic": str(topic), "job": req.job_id})
                raise
            except Exception as exc:  # noqa: BLE001 - recorded in the job, the worker goes on
                if await self._jvm_gone(exc):
                    raise SparkLost(f"Spark's JVM exited during job {req.job_id}; the job "
                                    "is left to the next worker") from exc
                if attempt < JOB_ATTEMPTS and lost_worker(exc):
                    log.warning("%s: job %s lost a Spark worker (%s); run %d of %d",
                                topic, req.job_id, str(exc).splitlines()[0][:200],
                                attempt + 1, JOB_ATTEMPTS,
                                extra={"topic": str(topic), "job": req.job_id})
                    continue
                await self._fail(topic, req, req_bytes, job, exc)
                # what it wrote before it failed (say its topic was deleted meanwhile)
                self._tasks.append(asyncio.get_running_loop().create_task(
                    self._collect_later(topic, self.storage(req.storage_root))))
                return

    async def _jvm_gone(self, exc: BaseException, wait: float = 3.0) -> bool:
        """Whether Spark's JVM is gone. A broken connection to it is seen before the JVM's
        process has finished exiting (a large heap takes a while to unmap): after such an
        error the process is watched for `wait` seconds before the job is blamed."""
        if not self.spark_alive():
            return True
        if not gateway_lost(exc):
            return False
        deadline = asyncio.get_running_loop().time() + wait
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
            if not self.spark_alive():
                return True
        return False

    async def _run(self, topic: TopicName, req: mpb.CompactionRequest, req_bytes: bytes,
                   job: mpb.CompactionJob) -> None:
        loop = asyncio.get_running_loop()
        job.phase = mpb.JOB_SCANNING_KEYS
        await self._put_job(topic, job)
        policies = await effective_policies(self.store, topic)
        retain = policies.retain_null_key
        retention = req.delete_retention_seconds if req.HasField("delete_retention_seconds") \
            else policies.delete_retention_seconds
        if retain is None or retention is None:  # effective policies set every field
            raise errors.Internal(f"{topic}: no retain_null_key or delete_retention_seconds "
                                  "in its effective policies")
        cutoff = planning.tombstone_cutoff(req.requested_ms, retention)
        lst_kv = await self.store.get(keys.ledgers(topic))
        ledgers = mpb.LedgerList.FromString(lst_kv.value) if lst_kv else mpb.LedgerList()
        ptr_kv = await self.store.get(keys.compaction(topic))
        pointer = mpb.CompactionPointer.FromString(ptr_kv.value) if ptr_kv else None
        horizon = MessageId.from_pb(req.horizon) if req.HasField("horizon") else None
        storage = self.storage(req.storage_root)
        previous = pointer.horizon if pointer is not None else None
        if horizon is None or (previous is not None and horizon <= MessageId.from_pb(previous)):
            # nothing sealed (K6), or nothing after the current horizon: the view stands
            job.phase, job.end_time = mpb.JOB_DONE, int(time.time() * 1000)
            await commit.finish(self.store, topic, keys.compaction_request(self.cluster, topic),
                                req_bytes, job)
            self.metrics.succeeded(topic, self._elapsed(topic))
            return
        plan = planning.make_plan(topic, job.job_id, ledgers, horizon, pointer, retain,
                                  tombstone_cutoff_ms=cutoff)
        job.tombstone_cutoff_ms = cutoff or 0
        job.entries_total = plan.input_entries
        job.bytes_read = plan.input_bytes
        job.input_ledgers = len(plan.ledgers)
        job.previous_job_id = pointer.job_id if pointer is not None else ""
        job.horizon.CopyFrom(horizon.to_pb())
        await self._put_job(topic, job)
        out_rel = Storage.compacted_rel(topic, job.job_id)
        last = [0.0]

        started: set[mpb.CompactionJobPhase] = set()

        def progress(phase: mpb.CompactionJobPhase, done: int, total: int
                     ) -> None:  # from Spark's thread
            now = time.monotonic()
            if now - last[0] < PROGRESS_EVERY and phase == job.phase:
                return
            last[0] = now
            loop.call_soon_threadsafe(self._progress, topic, job, phase, done, total)
            if not total and phase not in started:  # the job's thread: a phase begins
                started.add(phase)
                failpoints.hit("compaction.phase_start")

        t_spark = time.monotonic()
        manifest = await loop.run_in_executor(
            self._executor, lambda: spark_job.run(self.spark, plan, storage, out_rel, progress))
        t_spark = time.monotonic() - t_spark
        job.compute_ms = round(t_spark * 1000)
        job.phase = mpb.JOB_COMMITTING
        job.entries_read = manifest.input_entries
        job.entries_written = manifest.entries
        job.keys = manifest.keys
        job.bytes_written = manifest.output_bytes
        job.peak_rss_bytes = peak_rss_bytes(self._jvm_pid)
        await self._put_job(topic, job)
        failpoints.hit("compaction.before_publish")
        new_pointer = commit.pointer_for(manifest, f"{out_rel}/manifest.pb")
        job.phase, job.end_time = mpb.JOB_DONE, int(time.time() * 1000)
        await commit.publish(self.store, topic, new_pointer,
                             ptr_kv.mod_revision if ptr_kv else 0,
                             keys.compaction_request(self.cluster, topic), req_bytes, job)
        self.metrics.succeeded(topic, self._elapsed(topic),
                               manifest.input_entries, manifest.entries, plan.input_bytes,
                               manifest.output_bytes, t_spark)
        log.info("%s: job %s published (%d entries, %d keys, horizon %s; %.3f s from the "
                 "request, %.3f s in Spark)", topic, job.job_id, manifest.entries, manifest.keys,
                 horizon, time.time() - req.requested_ms / 1000, t_spark,
                 extra={"topic": str(topic), "job": job.job_id})
        self._tasks.append(loop.create_task(self._collect_later(topic, storage)))

    async def _collect_later(self, topic: TopicName, storage: Storage) -> None:
        """After the grace period: every compacted ledger of `topic` that neither the
        pointer nor a queued or running job names is collected. When the Iceberg tables
        cannot drop their references to it first, it is tried again after another grace
        period (`COLLECT_ATTEMPTS` in all; then the next job collects it)."""
        await asyncio.sleep(self.grace)
        for attempt in range(1, COLLECT_ATTEMPTS + 1):
            try:
                await self.collect(topic, storage)
                return
            except Exception as exc:  # noqa: BLE001 - the next job collects it
                log.info("%s: collection skipped (%d of %d): %s", topic, attempt,
                         COLLECT_ATTEMPTS, exc)
            if self.tables is None:
                return
            await asyncio.sleep(max(self.grace, 5.0))

    async def collect(self, topic: TopicName, storage: Storage, grace: float = 0.0
                      ) -> list[str]:
        """Delete the topic's compacted ledgers no pointer or job names (commit.collect),
        after the Iceberg tables expired every snapshot that refers to them (raises, and
        deletes nothing, when they could not)."""
        keep = set()
        # the request before the pointer: a job that publishes between the two reads (its
        # pointer put and its request deleted in one transaction) is kept by one of them
        req = await self.store.get(keys.compaction_request(self.cluster, topic))
        if req is not None:
            job_id = mpb.CompactionRequest.FromString(req.value).job_id
            keep.add(Storage.compacted_rel(topic, job_id))
        ptr = await self.store.get(keys.compaction(topic))
        if ptr is not None:
            keep.add(mpb.CompactionPointer.FromString(ptr.value).manifest_path.rsplit("/", 1)[0])
        loop = asyncio.get_running_loop()
        rels = await loop.run_in_executor(self._executor, commit.collectable, storage, topic,
                                          keep, grace)
        if rels and self.tables is not None:
            await self.tables.before_collect(topic, rels)
        return await loop.run_in_executor(self._executor, commit.collect, storage, topic, keep,
                                          grace, rels)

    def _progress(self, topic: TopicName, job: mpb.CompactionJob,
                  phase: mpb.CompactionJobPhase, done: int, total: int) -> None:
        if job.phase in (mpb.JOB_COMMITTING, mpb.JOB_DONE, mpb.JOB_FAILED):
            return
        job.phase, job.tasks_done, job.tasks_total = phase, done, total
        job.peak_rss_bytes = peak_rss_bytes(self._jvm_pid)
        asyncio.get_running_loop().create_task(self._put_job(topic, job))

    async def _fail(self, topic: TopicName, req: mpb.CompactionRequest, req_bytes: bytes,
                    job: mpb.CompactionJob, exc: BaseException) -> None:
        # the one line about it: a typed error as it is, anything else with its traceback
        typed = isinstance(exc, errors.ShadowTopicError) or (
            isinstance(exc, OSError) and exc.errno in errors.STORAGE_ERRNOS)
        err = errors.typed(exc) if typed else errors.Internal(
            f"compaction failed: {type(exc).__name__}: {exc}")
        log.error("%s: compaction job %s failed: %s", topic, job.job_id,
                  err.message.splitlines()[0] if err.message else err.reason,
                  exc_info=None if typed else exc,
                  extra={"topic": str(topic), "job": job.job_id,
                         "error": f"{err.reason}: {err.message}"})
        job.phase, job.end_time = mpb.JOB_FAILED, int(time.time() * 1000)
        job.error.CopyFrom(errors.error_status(err))
        await commit.finish(self.store, topic, keys.compaction_request(self.cluster, topic),
                                req_bytes, job)
        self.metrics.failed(topic, self._elapsed(topic))
        if req.storage_root:  # its output, and what earlier crashes left
            try:
                await self.collect(topic, self.storage(req.storage_root))
            except Exception as exc:  # noqa: BLE001 - the next job collects it
                log.info("%s: collection skipped: %s", topic, exc)

    async def _prune(self, topic: TopicName) -> None:
        snap = await self.store.get_prefix(keys.compaction_jobs_prefix(topic))
        for kv in sorted(snap.items, key=lambda kv: kv.key)[:-KEEP_JOBS]:
            await self.store.delete(kv.key)
