"""Compaction on a real Spark standalone cluster (docs/DEPLOYMENT.md, "A Spark cluster"): a
master and two workers started with `spark-class` (tests/support/spark_cluster.py), a
storage root on moto's S3 server, a source broker and a compaction worker that submits to
`spark://` with `--max-concurrent-jobs 3`. Six topics queued together are compacted, some
side by side (the worker's running gauge shows more than one at once while each phase is
held a second by a failpoint), and each compacted view, read back through a compacted
reader, equals a model of the latest message per key (deletes kept as empty payloads).
`make test-cluster` runs it (not `make test`: its six JVMs slow every other test on 2
cores)."""
from __future__ import annotations

import random
import threading
import time
import uuid

import pytest
from support.compaction_support import wait_done
from support.metrics_support import scrape, value
from support.s3_support import MotoS3
from support.spark_cluster import SparkCluster

from shadowtopic import failpoints
from shadowtopic.broker.server import free_port
from shadowtopic.client import Client
from shadowtopic.standalone import BrokerProcess

TOPICS = 6
KEYS = 40


def produce(c: Client, topic: str, rnd: random.Random) -> dict[bytes, bytes]:
    """Messages with updates and deletes of `KEYS` keys; the model: each key's last payload
    (b"" for a delete)."""
    model: dict[bytes, bytes] = {}
    c.admin.create_topic(topic)
    with c.create_producer(topic) as p:
        for i in range(400):
            key = f"k{rnd.randrange(KEYS)}"
            payload = b"" if rnd.random() < 0.1 else f"{topic}-{i}".encode()
            p.send_async(payload, key=key)
            model[key.encode()] = payload
        p.flush()
    return model


def compacted(c: Client, topic: str) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    deadline = time.monotonic() + 60
    with c.create_reader(topic, "earliest", read_compacted=True) as r:
        while r.has_message_available():
            assert time.monotonic() < deadline, "the compacted reader stalled"
            m = r.read_next(timeout=30)
            assert m.key is not None and m.key not in out, f"{m.key!r} twice"
            out[m.key] = m.payload
    return out


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.spark_cluster
def test_a_worker_on_a_spark_cluster_compacts_topics_side_by_side_over_s3(etcd_server,
                                                                          tmp_path):
    with MotoS3(str(tmp_path)) as moto, \
            SparkCluster(str(tmp_path / "spark"), workers=2, cores=1, env=moto.env) as spark:
        root = f"s3://{moto.new_bucket()}/spark"
        cluster = f"c-{uuid.uuid4().hex[:8]}"
        broker = BrokerProcess(etcd_server.endpoint, str(tmp_path / "broker"), free_port(),
                               extra_args=["--cluster", cluster, "--storage-root", root,
                                           *moto.s3_args()], env=moto.env)
        metrics_port = free_port()
        worker = BrokerProcess(
            etcd_server.endpoint, str(tmp_path / "worker"), free_port(),
            module="shadowtopic.compaction.worker",
            env={**moto.env, **failpoints.env({"compaction.phase_start": "sleep(1)"})},
            extra_args=["--cluster", cluster, "--spark-master", spark.master_url,
                        "--max-concurrent-jobs", "3", "--grace", "1", "--relist", "1",
                        "--metrics-port", str(metrics_port),
                        "--spark-conf", "spark.executor.memory=512m",
                        "--spark-conf", "spark.shadowtopic.compaction.minTaskBytes=0",
                        *moto.s3_args()])
        try:
            broker.start(timeout=60)
            worker.start(timeout=180)
            peak = [0.0]
            stop = threading.Event()

            def watch_gauge() -> None:  # the jobs running at once, as /metrics says
                while not stop.wait(0.1):
                    try:
                        n = value(scrape(f"http://127.0.0.1:{metrics_port}/metrics"),
                                  "shadowtopic_compaction_running", cluster=cluster)
                    except Exception:  # noqa: BLE001 - a scrape refused under load: next
                        continue
                    peak[0] = max(peak[0], n or 0.0)

            rnd = random.Random(33)
            with Client(broker.url, timeout=60) as c:
                topics = [f"persistent://public/spark-{uuid.uuid4().hex[:6]}/t{i}"
                          for i in range(TOPICS)]
                models = {t: produce(c, t, rnd) for t in topics}
                gauge = threading.Thread(target=watch_gauge, daemon=True)
                gauge.start()
                jobs = {t: c.admin.compact(t) for t in topics}  # queued together
                for t, job in jobs.items():
                    assert wait_done(c, t, job, timeout=300).phase == "done"
                stop.set()
                gauge.join(5)
                for t in topics:
                    assert compacted(c, t) == models[t], t
            assert peak[0] >= 2, f"at most {peak[0]} job(s) ran at once"
            apps = spark.applications()
            assert apps and all(a["cores"] >= 1 for a in apps), apps  # executors of its own
        finally:
            worker.kill()
            broker.kill()
