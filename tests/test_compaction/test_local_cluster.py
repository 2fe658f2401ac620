"""The Spark job on a real cluster: `local-cluster[2,1,1024]` runs two executor JVMs apart
from the driver, so a job that depended on driver-local state (files, Python objects) would
fail or differ here. It runs in a process of its own, beside the test run's SparkSession,
in `make test-cluster` with the standalone cluster's test (three JVMs: not in `make test`)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from shadowtopic.compaction.reference import compact, read_rows
from shadowtopic.ledger.storage import Storage


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.spark_cluster
def test_the_job_runs_on_a_local_cluster(tmp_path, ledgers):
    st = Storage(str(tmp_path / "storage"))
    led = ledgers(st)
    for i in range(3):  # each ledger with keys of its own: survivors in every one
        led.seal([(f"k{i}-{j % 17}" if j % 11 else None, b"" if j % 7 == 0 else b"v%d" % j)
                  for j in range(i * 300, i * 300 + 300)])
    h = led.list.ledgers[-1]
    (tmp_path / "ledgers.pb").write_bytes(led.list.SerializeToString())
    script = textwrap.dedent(f"""
        from shadowtopic.compaction import spark_job
        from shadowtopic.compaction.plan import make_plan
        from shadowtopic.compaction.session import build_session
        from shadowtopic.compaction.worker import stop_spark
        from shadowtopic.core.message_id import MessageId
        from shadowtopic.core.names import TopicName
        from shadowtopic.ledger.storage import Storage
        from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
        lst = mpb.LedgerList.FromString(open({str(tmp_path / "ledgers.pb")!r}, "rb").read())
        spark = build_session("local-cluster[2,1,1024]", {{spark_job.MIN_TASK_BYTES: "0"}})
        try:
            plan = make_plan(TopicName("t", "ns", "compact-me"), "cluster-job", lst,
                             MessageId({h.ledger_id}, {h.entries - 1}), None, True)
            m = spark_job.run(spark, plan, Storage({str(tmp_path / "storage")!r}), "c/job")
            print("executors", spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size())
            print("entries", m.entries)
            print("parts", len(m.files))
        finally:
            stop_spark(spark)
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=240, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = dict(line.split() for line in res.stdout.splitlines() if line.count(" ") == 1)
    assert int(lines["executors"]) == 3  # the driver and two executors
    from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
    m = mpb.CompactedManifest.FromString((tmp_path / "storage/c/job/manifest.pb").read_bytes())
    assert read_rows(st, [f.path for f in m.files]) == compact(led.rows, True)
    assert int(lines["entries"]) == m.entries > 0
    assert int(lines["parts"]) == 2  # a task per core, each writing its part on an executor
