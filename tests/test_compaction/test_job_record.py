"""A compaction job's record in etcd is the storage message storage.v1.CompactionJob, which
the admin API answers as shadowtopic.v1.CompactionJob (compaction/admin.py `job_pb`).
Records were written as the API message before: they must parse as they are."""
from __future__ import annotations

from shadowtopic.compaction.admin import combine, job_pb
from shadowtopic.core.names import TopicName
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import admin_pb2 as apb
from shadowtopic.pb.v1 import common_pb2


def every_field_set() -> apb.CompactionJob:
    job = apb.CompactionJob(
        job_id="1700000000000-0a1b2c3d", topic="persistent://t/ns/jobs", phase=apb.FAILED,
        entries_read=4, entries_total=5, keys=6, bytes_written=7,
        error=common_pb2.ErrorStatus(code="INTERNAL", reason="Internal", message="boom",
                                     details={"stage": "write"}),
        start_time=9, end_time=10,
        horizon=common_pb2.MessageIdData(ledger_id=11, entry_id=12, partition=-1),
        entries_written=12, bytes_read=13, tasks_done=14, tasks_total=15, trigger="threshold",
        worker="w-17", input_ledgers=18, previous_job_id="1600000000000-00000000",
        peak_rss_bytes=20, tombstone_cutoff_ms=-21, compute_ms=22)
    unset = [f.name for f in job.DESCRIPTOR.fields
             if not (job.HasField(f.name) if f.message_type else getattr(job, f.name))]
    assert not unset, f"the old record leaves fields unset: {unset}"
    return job


def test_an_old_record_written_as_the_api_message_parses_with_every_field_equal():
    old = every_field_set()
    record = mpb.CompactionJob.FromString(old.SerializeToString())
    # nothing of it is left unknown: it writes back as the bytes it was read from
    assert record.SerializeToString(deterministic=True) == old.SerializeToString(deterministic=True)
    for f in old.DESCRIPTOR.fields:
        want, got = getattr(old, f.name), getattr(record, f.name)
        if f.message_type:
            assert got.SerializeToString(deterministic=True) == \
                want.SerializeToString(deterministic=True), f.name
        else:
            assert got == want, f.name
    assert record.phase == mpb.JOB_FAILED
    # and the admin API answers the record as the message it was
    assert job_pb(record) == old


def test_the_storage_record_and_the_api_message_have_the_same_fields_and_phases():
    api, stored = apb.CompactionJob.DESCRIPTOR, mpb.CompactionJob.DESCRIPTOR
    def shape(descriptor):
        return {(f.name, f.number, f.type, f.message_type.full_name if f.message_type else "")
                for f in descriptor.fields}
    assert shape(stored) == shape(api)
    api_phases = {v.number: v.name for v in apb.CompactionPhase.DESCRIPTOR.values}
    stored_phases = {v.number: v.name for v in mpb.CompactionJobPhase.DESCRIPTOR.values}
    assert stored_phases.keys() == api_phases.keys()
    assert all(stored_phases[n].endswith(api_phases[n].removeprefix("COMPACTION_"))
               for n in api_phases), (stored_phases, api_phases)


def test_a_partitioned_topics_status_combines_its_partition_records():
    topic = TopicName.parse("persistent://t/ns/jobs")
    parts = [mpb.CompactionJob(job_id="j", topic=f"{topic}-partition-{i}", phase=phase,
                               keys=3, start_time=10 + i, end_time=20 + i)
             for i, phase in enumerate([mpb.JOB_DONE, mpb.JOB_WRITING])]
    out = combine(parts, topic)
    assert (out.phase, out.keys, out.start_time, out.end_time) == (mpb.JOB_WRITING, 6, 10, 0)
    assert job_pb(out).phase == apb.WRITING
