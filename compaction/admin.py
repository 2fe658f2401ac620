"""Compaction requests and status: the broker's side of compaction (the compaction worker in
compaction/ runs the jobs; compaction/ledger.py owns the compacted ledger format).

Compact(topic), on the topic's owner:
1. a shadow is refused (`NotAllowed`: a shadow reads its source's compacted ledger, the
   source is what gets compacted); a running or queued job is refused with
   `CompactionInProgress` naming its job id (K11);
2. the open ledger is sealed, and the seals of the ledgers before it are waited for, so the
   job covers every message produced before the request; its horizon is the last entry of
   the newest ledger that is sealed with every ledger before it (a job reads SEALED ledgers
   only: a horizon past a ledger still being sealed would leave that ledger's messages out
   of the compacted view for good);
3. one etcd transaction creates, only if the topic has no request yet, the
   `CompactionRequest` (keys.compaction_request, watched by the cluster's compaction
   workers) and the job record
   (keys.compaction_job, phase PENDING). A partitioned topic gets one request per partition,
   all with the same job id. The request carries its time and the topic's
   `delete_retention_seconds` then, and the job record the tombstone cutoff they give
   (compaction/plan.py): a rerun of the job keeps the same deletes.

Status is the newest job record (job ids sort by time); a partitioned topic's status
combines its partitions' records of that job. Watch streams the record on every change
until the job ends. The threshold trigger (K13) runs on the owner after every retention
pass: when the policy `compaction_threshold_bytes` is set and the bytes in ledgers after
the current horizon exceed it, it files a request as Compact does (trigger "threshold").
"""
from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator

from shadowtopic.broker.feature import Topics
from shadowtopic.broker.topic import Topic
from shadowtopic.compaction.plan import tombstone_cutoff
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.managed import ManagedLedger
from shadowtopic.metadata import Compare, Put, keys
from shadowtopic.metadata.topic_info import SHADOW
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import admin_pb2 as apb

log = logging.getLogger(__name__)
ENDED = (mpb.JOB_DONE, mpb.JOB_FAILED)


def new_job_id() -> str:
    """Sortable by creation time: `<ms since epoch, 13 digits>-<8 hex>`."""
    return f"{int(time.time() * 1000):013d}-{secrets.token_hex(4)}"


#: how long a compaction request waits for the ledgers rolled before it to be sealed
SEAL_WAIT_S = 30.0


def writer_of(t: Topic) -> ManagedLedger:
    """The ledger a compaction request seals: a source topic's (a shadow has none; the
    topics' `writable` refuses it first)."""
    if t.writer is None:
        raise errors.NotAllowed(f"{t.name} reads another topic's ledgers: compact that one")
    return t.writer


def sealed_horizon(t: Topic) -> MessageId | None:
    """The last entry of the newest ledger with entries that is sealed with every ledger
    before it (None: nothing sealed). Never past an unsealed ledger: the job's plan reads
    SEALED ledgers only (compaction/plan.py) and would skip it."""
    horizon = None
    for r in t.ledger.ranges():
        if not r.sealed:
            break
        if r.entries:
            horizon = MessageId(r.ledger_id, r.entries - 1)
    return horizon


async def wait_sealed(t: Topic, upto: int, timeout: float = SEAL_WAIT_S,
                      step: float = 0.02) -> None:
    """Wait until every ledger up to `upto` (the one `roll` sealed) is sealed.

    `roll` waits for the seal of the ledger it rolls only. A ledger rolled earlier (when it
    filled) may still be sealing: seals run side by side, and over S3 a small ledger's can
    finish first. Filing the request then gave a horizon past that ledger, the job skipped
    it, and its messages were missing from the compacted view for good (a compacted reader
    waiting for one of them seemed to hang). A seal that failed meanwhile is tried again
    here and its error raised; after `timeout` seconds, `ServiceUnavailable`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    writer = writer_of(t)
    pending: list[int] = []
    for i in range(int(timeout / step) + 2):  # bounded: the deadline ends it first
        if writer.fenced is not None:
            raise writer.fenced
        pending = [r.ledger_id for r in t.ledger.ranges() if r.ledger_id <= upto
                   and not r.sealed]
        if not pending:
            return
        if i == 0:
            log.info("%s: compaction request waits for ledgers %s to be sealed", t.name,
                     pending, extra={"topic": str(t.name)})
        await writer.retry_seals()  # a seal that failed is tried again (or raises)
        if loop.time() >= deadline:
            break
        await asyncio.sleep(step)
    raise errors.ServiceUnavailable(
        f"{t.name}: ledgers {pending} are still being sealed after {timeout:.0f} s; "
        f"compact again later")


def job_pb(job: mpb.CompactionJob) -> apb.CompactionJob:
    """A job's record (storage.v1.CompactionJob) as the admin API answers it: the two messages
    share every field's number and type (metadata.proto), so the record's bytes are the
    answer's."""
    return apb.CompactionJob.FromString(job.SerializeToString())


def combine(jobs: list[mpb.CompactionJob], topic: TopicName) -> mpb.CompactionJob:
    """One record for a partitioned topic's job: FAILED if any partition failed, DONE when
    all are done, else the earliest phase; counters summed."""
    if len(jobs) == 1:
        return jobs[0]
    out = mpb.CompactionJob(job_id=jobs[0].job_id, topic=str(topic),
                            trigger=jobs[0].trigger,
                            tombstone_cutoff_ms=jobs[0].tombstone_cutoff_ms)
    failed = [j for j in jobs if j.phase == mpb.JOB_FAILED]
    out.phase = mpb.JOB_FAILED if failed else min(j.phase for j in jobs)
    if failed:
        out.error.CopyFrom(failed[0].error)
    for f in ("entries_read", "entries_total", "keys", "bytes_written", "entries_written",
              "bytes_read", "tasks_done", "tasks_total", "input_ledgers", "compute_ms"):
        setattr(out, f, sum(getattr(j, f) for j in jobs))
    out.start_time = min(j.start_time for j in jobs)
    out.end_time = max(j.end_time for j in jobs) if out.phase in ENDED else 0
    out.peak_rss_bytes = max(j.peak_rss_bytes for j in jobs)
    return out


class CompactionAdmin:
    def __init__(self, topics: Topics, cluster: str):
        self.topics = topics
        self.store = topics.store
        self.cluster = cluster
        #: topics whose compaction request is being filed (sealed, not yet in etcd):
        #: retention keeps their ledgers meanwhile
        self.filing: set[TopicName] = set()

    async def _parts(self, topic: TopicName) -> list[TopicName]:
        info = await self.topics.info(topic)
        if info.kind == SHADOW:
            raise errors.NotAllowed(
                f"{topic} is a shadow of {info.source}: compact the source (its shadows read "
                f"the source's compacted ledger)")
        return [topic.partition(i) for i in range(info.partitions)] or [topic]

    async def _running(self, part: TopicName) -> str | None:
        kv = await self.store.get(keys.compaction_request(self.cluster, part))
        return mpb.CompactionRequest.FromString(kv.value).job_id if kv is not None else None

    async def compact(self, topic: TopicName, trigger: str = "admin") -> str:
        """File a compaction of `topic` (every partition of a partitioned one); its job id."""
        parts = await self._parts(topic)
        for part in parts:
            running = await self._running(part)
            if running is not None:
                raise errors.CompactionInProgress(
                    f"{part} is being compacted by job {running}")
        job_id = new_job_id()
        for part in parts:
            await self._file(part, job_id, trigger)
        return job_id

    async def _file(self, part: TopicName, job_id: str, trigger: str) -> None:
        t = await self.topics.writable(part)
        self.filing.add(part)  # retention keeps the ledgers from now on
        try:
            sealed = await writer_of(t).roll()
            if sealed is not None:  # earlier ledgers may still be sealing: see wait_sealed
                await wait_sealed(t, sealed.ledger_id)
            await self._put_request(part, t, job_id, trigger)
        finally:
            self.filing.discard(part)

    async def _put_request(self, part: TopicName, t: Topic, job_id: str, trigger: str
                           ) -> None:
        horizon = sealed_horizon(t)
        now = int(time.time() * 1000)
        retention = t.policies.delete_retention_seconds or 0
        req = mpb.CompactionRequest(topic=str(part), job_id=job_id, trigger=trigger,
                                    storage_root=self.topics.storage.uri, requested_ms=now,
                                    delete_retention_seconds=retention)
        job = mpb.CompactionJob(job_id=job_id, topic=str(part), phase=mpb.JOB_PENDING,
                                start_time=now, trigger=trigger,
                                tombstone_cutoff_ms=tombstone_cutoff(now, retention) or 0)
        if horizon is not None:
            req.horizon.CopyFrom(horizon.to_pb())
            job.horizon.CopyFrom(horizon.to_pb())
        key = keys.compaction_request(self.cluster, part)
        res = await self.store.txn(
            [Compare(key, "version", "==", 0)],
            [Put(key, req.SerializeToString()),
             Put(keys.compaction_job(part, job_id), job.SerializeToString())])
        if not res.succeeded:
            raise errors.CompactionInProgress(
                f"{part} is being compacted by job {await self._running(part)}")

    async def _latest(self, part: TopicName) -> mpb.CompactionJob | None:
        snap = await self.store.get_prefix(keys.compaction_jobs_prefix(part))
        if not snap.items:
            return None
        newest = max(snap.items, key=lambda kv: kv.key)
        return mpb.CompactionJob.FromString(newest.value)

    async def status(self, topic: TopicName) -> mpb.CompactionJob:
        """The newest job's record (`NotFound` when the topic was never compacted)."""
        parts = await self._parts(topic)
        jobs = [j for j in [await self._latest(p) for p in parts] if j is not None]
        if not jobs:
            raise errors.CompactionNotFound(f"{topic} has never been compacted")
        newest = max(j.job_id for j in jobs)
        return combine([j for j in jobs if j.job_id == newest], topic)

    async def watch(self, topic: TopicName, recheck: float = 1.0
                    ) -> AsyncIterator[mpb.CompactionJob]:
        """The newest job's record now and at every change, until the job ends: an etcd
        watch on each partition's job records from the revision the first answer was read
        at (re-read at least every `recheck` seconds, should a watch fail)."""
        parts = await self._parts(topic)
        revision = (await self.store.get_prefix(keys.compaction_jobs_prefix(parts[0]))).revision
        current = await self.status(topic)
        yield current
        if current.phase in ENDED:
            return
        changed = asyncio.Event()

        async def follow(part: TopicName) -> None:
            async for _ in self.store.watch_prefix(keys.compaction_jobs_prefix(part),
                                                   revision + 1):
                changed.set()
        tasks = [asyncio.create_task(follow(p)) for p in parts]
        try:
            while current.phase not in ENDED:
                try:
                    await asyncio.wait_for(changed.wait(), recheck)
                except TimeoutError:
                    pass
                changed.clear()
                now = await self.status(topic)
                if now != current:
                    current = now
                    yield current
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def check_threshold(self, topic: TopicName, t: Topic) -> None:
        """The threshold trigger (K13), called after each retention pass of an owned source
        topic: files a compaction when the bytes after the horizon exceed the policy."""
        threshold = t.policies.compaction_threshold_bytes
        if not threshold:
            return
        try:
            if await self.store.get(keys.compaction_request(self.cluster, topic)) is not None:
                return
            kv = await self.store.get(keys.compaction(topic))
            after = MessageId(0, 0)
            if kv is not None:
                h = mpb.CompactionPointer.FromString(kv.value).horizon
                after = MessageId(h.ledger_id, h.entry_id + 1)
            backlog = sum(r.size_bytes for r in t.ledger.ranges() if r.ledger_id >= after.ledger_id
                          and (r.ledger_id > after.ledger_id or r.entries > after.entry_id))
            if backlog < threshold:
                return
            job_id = new_job_id()
            await self._file(topic, job_id, "threshold")
            log.info("%s: %d bytes since the compaction horizon (threshold %d): job %s",
                     topic, backlog, threshold, job_id)
        except errors.CompactionInProgress:
            return
        except errors.ShadowTopicError as exc:
            log.info("%s: compaction threshold check skipped: %s", topic, exc)
