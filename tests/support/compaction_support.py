"""Helpers of the compaction integration tests (test_compaction.py,
test_compaction_failpoints.py): a worker process, etcd reads and writes, waiting for a job,
producing, the rows of a compacted ledger."""
from __future__ import annotations

import os
import time

import pyarrow.parquet as pq

from shadowtopic import columns, failpoints
from shadowtopic.broker.server import free_port
from shadowtopic.client import errors
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import admin_pb2 as apb
from shadowtopic.standalone import BrokerProcess
from support.etcd_support import etcd_get

WORKER_ARGS = ["--spark-master", "local[2]", "--grace", "1", "--lease-ttl", "3",
               "--relist", "1"]


def start_worker(etcd, data_dir: str, cluster: str,
                 points: dict[str, str] | None = None) -> BrokerProcess:
    """A worker process, SERVING. One start that exits during start-up (once, in a CI run
    of the whole suite on the shared 2-core machine: a port taken between `free_port` and
    the bind, or a JVM that did not come up) is retried once on a fresh port; a second
    failure fails the test with both logs. `points`: failpoints enabled in the worker."""
    def launch(attempt: int) -> BrokerProcess:
        w = BrokerProcess(etcd.endpoint, os.path.join(data_dir, f"try{attempt}"), free_port(),
                          module="shadowtopic.compaction.worker",
                          extra_args=[*WORKER_ARGS, "--cluster", cluster],
                          env=failpoints.env(points) if points else None)
        return w.start(timeout=180)

    try:
        return launch(0)
    except RuntimeError as first:
        try:
            return launch(1)
        except RuntimeError as again:
            raise RuntimeError(f"{first}\n--- and again ---\n{again}") from None


def pointer(etcd, topic: str) -> mpb.CompactionPointer | None:
    kv = etcd_get(etcd, keys.compaction(TopicName.parse(topic)))
    return mpb.CompactionPointer.FromString(kv.value) if kv else None


def wait_done(client, topic: str, job_id: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    last = None
    for last in client.admin.watch_compaction(topic, timeout=timeout):
        if last.job_id == job_id and last.done:
            return last
        assert time.monotonic() < deadline, f"job {job_id} not done: {last}"
    raise AssertionError(f"watch ended before job {job_id} was done: {last}")


def compacted_rows(source: BrokerProcess, ptr: mpb.CompactionPointer) -> list[tuple]:
    """(ledger_id, entry_id, key, raw) of the compacted ledger `ptr` names, in id order."""
    st = Storage(os.path.join(source.data_dir, "storage"))
    rows = []
    for f in ptr.manifest.files:
        t = pq.read_table(st.full(f.path))
        rows += list(zip(*(t.column(c).to_pylist() for c in ("ledger_id", "entry_id", "key")),
                         columns.raws(t).to_pylist(), strict=True))
    return rows


def produce(client, topic: str, items: list[tuple[str | None, str]]) -> list:
    try:
        client.admin.create_topic(topic)
    except errors.TopicAlreadyExists:
        pass
    p = client.create_producer(topic)
    ids = [p.send(v, key=k) for k, v in items]
    p.close()
    return ids


def job_phase(etcd, topic: str, job_id: str) -> int | None:
    kv = etcd_get(etcd, keys.compaction_job(TopicName.parse(topic), job_id))
    return apb.CompactionJob.FromString(kv.value).phase if kv else None
