"""F15, without Spark: a job whose Spark lost a Python worker or an executor runs again, a
bounded number of times, before it is FAILED with the cause; a job that fails because
Spark's JVM is gone is not FAILED at all (`SparkLost`: its request waits for the next
worker). The job's run and the FAILED record are replaced by recorders."""
from __future__ import annotations

import asyncio

import pytest

from shadowtopic.compaction import jobs as worker
from shadowtopic.core.errors import MetadataUnavailable
from shadowtopic.core.names import TopicName
from shadowtopic.metadata import keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import admin_pb2 as apb

LOST = RuntimeError("Job aborted: Python worker exited unexpectedly (crashed)")


def _worker(outcomes: list[Exception | None], alive: bool = True):
    w = worker.Worker(MemoryStore(), None, "c", "w", spark_alive=lambda: alive)
    runs, failed = [], []

    async def run(topic, req, req_bytes, job):
        runs.append(job.job_id)
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    async def fail(topic, req, req_bytes, job, exc):
        failed.append(exc)

    w._run, w._fail = run, fail
    return w, runs, failed


def _attempts(w) -> None:
    req = mpb.CompactionRequest(topic="persistent://t/ns/x", job_id="j1")
    asyncio.run(w._attempts(None, req, b"", apb.CompactionJob(job_id="j1")))


def test_a_lost_python_worker_reruns_the_job():
    w, runs, failed = _worker([LOST, LOST, None])
    _attempts(w)
    assert (len(runs), failed) == (worker.JOB_ATTEMPTS, [])


def test_a_job_that_keeps_losing_workers_fails_with_the_cause_after_the_bound():
    w, runs, failed = _worker([LOST] * worker.JOB_ATTEMPTS)
    _attempts(w)
    assert len(runs) == worker.JOB_ATTEMPTS and failed == [LOST]


def test_any_other_error_fails_the_job_at_once():
    bad = ValueError("a bad ledger")
    w, runs, failed = _worker([bad])
    _attempts(w)
    assert (len(runs), failed) == (1, [bad])


def test_a_job_whose_jvm_is_gone_is_left_to_the_next_worker():
    w, runs, failed = _worker([LOST], alive=False)
    with pytest.raises(worker.SparkLost, match="left to the next worker"):
        _attempts(w)
    assert (len(runs), failed) == (1, [])


def test_a_broken_gateway_waits_for_the_jvm_to_finish_exiting():
    """The driver's connection to the JVM breaks before the JVM's process has exited (its
    heap takes a while to unmap): the job is not FAILED if the JVM is gone soon after."""
    checks = iter([True, True, True, False])
    w, runs, failed = _worker([ConnectionRefusedError(111, "Connection refused")])
    w.spark_alive = lambda: next(checks, False)
    with pytest.raises(worker.SparkLost):
        _attempts(w)
    assert failed == []


class Py4JError(Exception):
    """What py4j raises, unchained, for a call whose connection to the JVM broke (it logs
    the network error itself); named as py4j names it, which is what the worker reads."""


@pytest.mark.parametrize("error", [
    Py4JError("An error occurred while calling o43.conf"),  # seen in `make test` (F15)
    RuntimeError("compaction failed"),  # raised from a connection error
], ids=["py4j-call-error", "chained"])
def test_a_call_broken_by_the_jvm_dying_waits_for_it_too(error):
    if isinstance(error, RuntimeError):
        try:
            raise error from ConnectionResetError(104, "Connection reset by peer")
        except RuntimeError as exc:
            error = exc
    checks = iter([True, True, False])
    w, runs, failed = _worker([error])
    w.spark_alive = lambda: next(checks, False)
    with pytest.raises(worker.SparkLost):
        _attempts(w)
    assert failed == []


def test_a_broken_gateway_with_the_jvm_alive_is_an_error_of_the_job():
    w, runs, failed = _worker([ConnectionRefusedError(111, "Connection refused")])
    _attempts(w)  # the JVM stays alive through the wait: the job failed, not Spark
    assert len(failed) == 1


def test_a_job_stopped_by_an_etcd_outage_is_not_failed_and_runs_again():
    """Found by `make chaos`: etcd killed during a job made it fail, the FAILED record could
    not be written either, and the job's record stayed in its phase while later compactions
    were refused (`CompactionInProgress`) until the worker restarted."""
    w, runs, failed = _worker([MetadataUnavailable("etcd is away")])
    with pytest.raises(MetadataUnavailable):
        _attempts(w)
    assert (len(runs), failed) == (1, [])


def test_a_worker_takes_back_its_own_claim_left_by_a_failed_release():
    """A run whose claim could not be deleted (etcd away) leaves the claim under this
    worker's lease: the next run of the topic (the relist finds its request) takes it."""
    async def main():
        store = MemoryStore()
        w = worker.Worker(store, None, "c", "w", spark_alive=lambda: True)
        w.lease = await store.grant_lease(10)
        topic = TopicName.parse("persistent://t/ns/x")
        req = mpb.CompactionRequest(topic=str(topic), job_id="j1")
        await store.put(keys.compaction_request("c", topic), req.SerializeToString())
        await store.put(keys.compaction_claim("c", topic), b"w", w.lease)
        ran = []

        async def attempts(topic, req, req_bytes, job):
            ran.append(job.job_id)
        w._attempts = attempts
        w._prune = lambda topic: asyncio.sleep(0)
        await w.run(topic)
        assert ran == ["j1"]
        assert await store.get(keys.compaction_claim("c", topic)) is None  # released
        await store.put(keys.compaction_claim("c", topic), b"another-worker", w.lease)
        await w.run(topic)
        assert ran == ["j1"]  # another worker's claim: not taken
    asyncio.run(main())


def test_jobs_run_side_by_side_up_to_the_limit_and_a_topic_once_at_a_time():
    """--max-concurrent-jobs: up to N topics' jobs at once (the running gauge counts them);
    a topic queued again while its job runs (a relist finds its request) is not run twice
    at once."""
    async def scenario() -> tuple[int, list[str], int]:
        w = worker.Worker(MemoryStore(), None, "c", "w", max_concurrent_jobs=3)
        release = asyncio.Event()
        running: set[str] = set()
        peak, order, gauge = [0], [], [0]

        async def claim_and_run(topic):
            assert str(topic) not in running, f"{topic} runs twice at once"
            running.add(str(topic))
            order.append(str(topic))
            peak[0] = max(peak[0], len(running))
            gauge[0] = max(gauge[0], w.metrics.running)
            await release.wait()
            running.discard(str(topic))

        w._claim_and_run = claim_and_run
        tasks = [asyncio.create_task(w._run_jobs()) for _ in range(w.max_concurrent_jobs)]
        topics = [TopicName.parse(f"persistent://t/ns/x{i}") for i in range(5)]
        for t in topics:
            w._enqueue(keys.compaction_request("c", t))
        await asyncio.sleep(0.05)
        for t in topics[:3]:  # a relist while they run
            w._enqueue(keys.compaction_request("c", t))
        await asyncio.sleep(0.05)
        release.set()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(order) >= 5 and not running:
                break
        for task in tasks:
            task.cancel()
        return peak[0], order, gauge[0]

    peak, order, gauge = asyncio.run(scenario())
    assert peak == 3 and gauge == 3
    assert sorted(order) == [f"persistent://t/ns/x{i}" for i in range(5)]


def test_spark_is_kept_warm_while_no_job_runs_and_not_while_one_does():
    """Spark stops a Python worker idle for a minute: while no job runs, the worker runs a
    job over no files every `warm_every` seconds; none while a job runs, nor within
    `warm_every` of one ending; a failing warm-up leaves the worker going."""
    async def scenario() -> tuple[int, int, int, int]:
        calls: list[str] = []

        def warm() -> None:
            calls.append("warm")
            if len(calls) == 2:
                raise RuntimeError("Py4JError: An error occurred while calling o1.runJob")
        w = worker.Worker(MemoryStore(), None, "c", "w", warm_every=0.2, warm=warm)
        task = asyncio.create_task(w._keep_warm(0.2))
        await asyncio.sleep(0.75)   # idle: three or so runs, the second failing
        idle = len(calls)
        topic = TopicName.parse("persistent://t/ns/x")
        release = asyncio.Event()

        async def claim_and_run(t):
            await release.wait()
        w._claim_and_run = claim_and_run
        job = asyncio.create_task(w.run(topic))
        await asyncio.sleep(0.05)
        before = len(calls)
        await asyncio.sleep(1.0)    # a job runs: none
        during = len(calls) - before
        release.set()
        await job
        after_job = len(calls)
        await asyncio.sleep(0.1)    # within warm_every of its end: none yet
        soon = len(calls) - after_job
        task.cancel()
        return idle, during, soon, w.warm_runs
    idle, during, soon, runs = asyncio.run(scenario())
    assert idle >= 2 and runs == idle - 1   # the failing one is not counted
    assert (during, soon) == (0, 0)
