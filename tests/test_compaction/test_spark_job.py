"""The compaction core (compaction/plan.py, reference.py, spark_job.py): the reference
semantics on their own, then the Spark job (the run's one SparkSession) against the reference
over sealed ledgers written as a broker writes them: single runs, randomized put / delete /
keyless sequences compacted incrementally at random points (each result equal to the
reference and to a full run, K12), empty input (K6), reruns."""
from __future__ import annotations

import random

import pyarrow.parquet as pq
import pytest

from shadowtopic.compaction import reference, spark_job
from shadowtopic.compaction.plan import make_plan
from shadowtopic.compaction.reference import Row, compact
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.storage import Storage
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import admin_pb2 as apb

TOPIC = TopicName("t", "ns", "compact-me")  # the topic of the `ledgers` fixture



def written(storage: Storage, manifest: mpb.CompactedManifest) -> list[Row]:
    return reference.read_rows(storage, [f.path for f in manifest.files])


def pointer(manifest: mpb.CompactedManifest) -> mpb.CompactionPointer:
    return mpb.CompactionPointer(manifest=manifest, horizon=manifest.horizon,
                                 job_id=manifest.job_id)


# ---- the reference --------------------------------------------------------------------------

def r(lid, eid, key, payload=b"v"):
    return Row(lid, eid, key, not payload, 0, payload)


def test_reference_keeps_the_latest_per_key_with_its_id():
    rows = [r(1, 0, b"k", b"v1"), r(1, 1, b"j", b"x"), r(1, 2, b"k", b"v2"), r(2, 0, b"k", b"v3")]
    assert compact(rows, True) == [rows[1], rows[3]]  # K1, K2: ids and order kept


def test_reference_deletes_and_readds():
    rows = [r(1, 0, b"k", b"v1"), r(1, 1, b"k", b""), r(1, 2, b"j", b"a"), r(1, 3, b"j", b""),
            r(1, 4, b"j", b"b")]
    assert compact(rows, True) == [rows[4]]  # K4: k gone, j only its new value


@pytest.mark.parametrize("retain", [True, False])
def test_reference_keyless_policy(retain):
    rows = [r(1, 0, None, b"a"), r(1, 1, b"k", b"v"), r(1, 2, None, b"b")]
    assert compact(rows, retain) == (rows if retain else [rows[1]])  # K5


def test_plan_reads_the_previous_compaction_and_only_newer_ledgers(tmp_path, ledgers):
    led = ledgers(Storage(str(tmp_path)))
    h1 = led.seal([("a", b"1")])
    led.seal([("b", b"2")])
    h3 = led.seal([("c", b"3")])
    first = make_plan(TOPIC, "j1", led.list, h1, None, True)
    assert [i.ledger_id for i in first.ledgers] == [1] and first.previous is None
    prev = mpb.CompactedManifest(job_id="j1", horizon=h1.to_pb(), entries=1)
    prev.files.add(path="compacted/x/j1/part-0.parquet")
    inc = make_plan(TOPIC, "j2", led.list, h3, pointer(prev), True)
    assert [i.ledger_id for i in inc.ledgers] == [2, 3]
    assert inc.input_files()[0] == "compacted/x/j1/part-0.parquet" and inc.input_entries == 3
    full = make_plan(TOPIC, "j2", led.list, h3, pointer(prev), True, full=True)
    assert [i.ledger_id for i in full.ledgers] == [1, 2, 3] and full.previous is None
    same = make_plan(TOPIC, "j3", led.list, h1, pointer(prev), True)
    assert same.ledgers == () and same.input_files() == ["compacted/x/j1/part-0.parquet"]


# ---- the Spark job ----------------------------------------------------------------------------

def test_spark_job_equals_the_reference(spark, tmp_path, ledgers):
    st = Storage(str(tmp_path))
    led = ledgers(st)
    led.seal([("a", b"a1"), ("b", b"b1"), (None, b"free"), ("a", b"a2")])
    h = led.seal([("b", b""), ("c", b"c1"), ("a", b"a3"), (None, b"free2")])
    plan = make_plan(TOPIC, "j1", led.list, h, None, True)
    phases = []
    m = spark_job.run(spark, plan, st, "compacted/x/j1",
                      lambda phase, done, total: phases.append(phase))
    want = compact(led.rows, True)
    assert written(st, m) == want
    assert (m.entries, m.keys, m.input_entries) == (4, 2, 8)
    # a part per phase-two task, in id order: ledger 1 holds no live key (only a keyless
    # row, kept), so its row groups weigh little and both ledgers are one task's
    ranges = [((f.first.ledger_id, f.first.entry_id), (f.last.ledger_id, f.last.entry_id))
              for f in m.files]
    assert [f.rows for f in m.files] == [4]
    assert ranges == [((1, 2), (2, 3))]
    assert MessageId.from_pb(m.horizon) == h and list(m.input_ledgers) == [1, 2]
    assert {apb.SCANNING_KEYS, apb.WRITING} <= set(phases)
    manifest = mpb.CompactedManifest.FromString(
        open(st.full("compacted/x/j1/manifest.pb"), "rb").read())
    assert manifest == m
    # a rerun into the same directory (a crashed job's rerun) writes the same rows
    again = spark_job.run(spark, plan, st, "compacted/x/j1")
    assert written(st, again) == want and len(st.list_dir("compacted/x/j1")) >= 2


def test_spark_job_drops_keyless_when_told(spark, tmp_path, ledgers):
    st = Storage(str(tmp_path))
    led = ledgers(st)
    h = led.seal([(None, b"x"), ("k", b"v"), (None, b"y")])
    m = spark_job.run(spark, make_plan(TOPIC, "j", led.list, h, None, False), st, "c/j")
    assert written(st, m) == compact(led.rows, False) and m.entries == 1


def test_spark_job_on_nothing_writes_no_file(spark, tmp_path, ledgers):
    """K6 (and everything deleted): a manifest without files."""
    st = Storage(str(tmp_path))
    led = ledgers(st)
    h = led.seal([("k", b"v"), ("k", b"")])
    m = spark_job.run(spark, make_plan(TOPIC, "j", led.list, h, None, True), st, "c/j")
    assert list(m.files) == [] and m.entries == 0 and m.keys == 0
    assert [p.rsplit("/", 1)[1] for p in st.list_dir("c/j")] == ["manifest.pb"]
    empty = spark_job.run(spark, make_plan(TOPIC, "e", mpb.LedgerList(), None, None, True),
                          st, "c/e")
    assert list(empty.files) == [] and empty.input_entries == 0


def test_spark_job_keeps_tombstones_from_the_cutoff_on(spark, tmp_path, ledgers):
    """K18: a key whose latest message is a tombstone published at or after the plan's
    cutoff keeps it (a delete marker); an older one is dropped with its key."""
    st = Storage(str(tmp_path))
    led = ledgers(st)   # ledger n's messages are published at 1000 + n
    led.seal([("a", b"a1"), ("b", b"b1"), ("c", b"c1"), (None, b"")])
    led.seal([("a", b""), ("c", b"c2")])
    h = led.seal([("b", b""), ("e", b"")])
    plan = make_plan(TOPIC, "j", led.list, h, None, True, tombstone_cutoff_ms=1003)
    m = spark_job.run(spark, plan, st, "c/j")
    want = compact(led.rows, True, 1003)
    assert [(r.key, r.is_tombstone) for r in want] == [(None, True), (b"c", False),
                                                       (b"b", True), (b"e", True)]
    assert written(st, m) == want
    assert (m.entries, m.keys, m.tombstones, m.tombstone_cutoff_ms) == (4, 1, 2, 1003)


@pytest.fixture(params=["a task per ledger", "one task"])
def task_bytes(request, spark):
    """The test session's least bytes per task: 0 (a task per core, each ledger its own:
    phase one, the merge, the broadcast, phase two) or more than any test's input (one task
    runs both phases in one Spark job)."""
    old = spark.conf.get(spark_job.MIN_TASK_BYTES)
    spark.conf.set(spark_job.MIN_TASK_BYTES, "0" if request.param != "one task" else str(1 << 40))
    yield request.param
    spark.conf.set(spark_job.MIN_TASK_BYTES, old)


@pytest.mark.parametrize("retain", [True, False])
def test_randomized_incremental_compactions_equal_reference_and_full(spark, tmp_path, retain,
                                                                    ledgers, task_bytes):
    """Random puts, deletes and keyless messages over many ledgers, compacted incrementally
    at random points, each job with a tombstone cutoff (moving forward) among its input's
    publish times, so deletes on both sides of it: every result equals the reference over
    everything so far, and a full run at the same cutoff (K12, K18); in a task per ledger
    and in one task."""
    rnd = random.Random(20261124 + retain)
    st = Storage(str(tmp_path))
    led = ledgers(st)
    ptr = None
    cutoff = kept = 0
    for job in range(4):
        for _ in range(rnd.randint(1, 3)):
            items = []
            for _ in range(rnd.randint(1, 60)):
                roll = rnd.random()
                key = None if roll < 0.1 else f"k{rnd.randint(0, 15)}"
                payload = b"" if 0.1 <= roll < 0.3 else f"v{rnd.random():.6f}".encode()
                items.append((key, payload))
            h = led.seal(items)
        # ledger n is published at 1000 + n: keep the tombstones of the newest 0-2 ledgers
        cutoff = max(cutoff, 1000 + led.next_id - rnd.randint(0, 2))
        plan = make_plan(TOPIC, f"j{job}", led.list, h, ptr, retain, tombstone_cutoff_ms=cutoff)
        tracker = spark.sparkContext.statusTracker()
        before = set(tracker.getJobIdsForGroup(f"compaction-j{job}"))
        m = spark_job.run(spark, plan, st, f"c/j{job}")
        spark_jobs = set(tracker.getJobIdsForGroup(f"compaction-j{job}")) - before
        one = task_bytes == "one task" or len(plan.input_files()) == 1
        assert len(spark_jobs) == 1 if one else len(spark_jobs) >= 2, (task_bytes, spark_jobs)
        assert len(m.files) <= 1 if one else True
        want = compact(led.rows, retain, cutoff)
        assert written(st, m) == want, f"job {job}"
        full = spark_job.run(spark, make_plan(TOPIC, f"f{job}", led.list, h, ptr, retain,
                                              full=True, tombstone_cutoff_ms=cutoff),
                             st, f"c/f{job}")
        assert written(st, full) == want and full.keys == m.keys
        assert m.keys == len({r.key for r in want if r.key is not None and not r.is_tombstone})
        assert m.tombstones == sum(1 for r in want if r.key is not None and r.is_tombstone)
        ptr = pointer(m)
        kept += m.tombstones
    dropped = [r for r in led.rows if r.key is not None and r.is_tombstone
               and r.publish_time < cutoff]
    assert kept and dropped  # deletes on both sides of the cutoffs


def test_sealed_ledgers_read_as_one_dataset_with_full_ids(tmp_path, ledgers):
    """A directory of sealed ledgers reads as one dataset (pyarrow here; Spark in the job)
    with the whole MessageId in its columns."""
    st = Storage(str(tmp_path))
    led = ledgers(st)
    led.seal([("a", b"1"), ("b", b"2")])
    led.seal([("c", b"3")])
    table = pq.read_table(st.full(Storage.topic_sealed_dir(TOPIC)))
    ids = sorted(zip(table.column("ledger_id").to_pylist(), table.column("entry_id").to_pylist()))
    assert ids == [(1, 0), (1, 1), (2, 0)]
