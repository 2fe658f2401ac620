"""A compaction published by hand (parquet files, a manifest and the etcd pointer, as the
worker would), and the produce / read helpers of the compacted-read tests."""
from __future__ import annotations

import os
import time

import pyarrow as pa
import pyarrow.parquet as pq

from shadowtopic import columns
from shadowtopic.compaction.ledger import describe_file, write_manifest
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import common_pb2
from support.etcd_support import on_etcd


def publish_compaction(etcd, storage_root: str, topic: str, job: str,
                       pointer_edit=None) -> mpb.CompactionPointer:
    """Compact `topic` (one partition or a plain topic) up to its last sealed entry as the
    worker would, and publish the pointer (after `pointer_edit(pointer)`, if given)."""
    name = TopicName.parse(topic)
    st = Storage(storage_root)
    lst = mpb.LedgerList.FromString(on_etcd(etcd, lambda s: s.get(keys.ledgers(name))).value)
    cols = ["ledger_id", "entry_id", "key", "is_tombstone", "publish_time", "raw"]
    rows = []
    for info in lst.ledgers:
        if info.state == mpb.LedgerState.SEALED:
            t = pq.read_table(st.full(info.path))
            rows += list(zip(*(t.column(c).to_pylist() for c in cols[:-1]),
                             columns.raws(t).to_pylist(), strict=True))
    rows.sort(key=lambda r: (r[0], r[1]))
    latest = {r[2]: (r[0], r[1]) for r in rows if r[2] is not None}
    keep = [r for r in rows if r[2] is None or (latest[r[2]] == (r[0], r[1]) and not r[3])]
    horizon = common_pb2.MessageIdData(ledger_id=rows[-1][0], entry_id=rows[-1][1])
    dir_rel = Storage.compacted_rel(name, job)
    manifest = mpb.CompactedManifest(job_id=job, topic=str(name), horizon=horizon,
                                     entries=len(keep), retain_null_key=True)
    if keep:
        rel = f"{dir_rel}/part-00000.parquet"
        st.fs.create_dir(st.full(dir_rel), recursive=True)
        table = columns.upgrade(pa.table({c: [r[i] for r in keep] for i, c in enumerate(cols)},
                                         schema=columns.SCHEMA_V1))
        pq.write_table(table, st.full(rel), row_group_size=2, write_page_checksum=True)
        manifest.files.append(describe_file(st, rel))
    ptr = mpb.CompactionPointer(manifest_path=write_manifest(st, dir_rel, manifest),
                                horizon=horizon, job_id=job, manifest=manifest,
                                published_ms=int(time.time() * 1000))
    if pointer_edit is not None:
        pointer_edit(ptr)
    on_etcd(etcd, lambda s: s.put(keys.compaction(name), ptr.SerializeToString()))
    return ptr


def produce(client, topic: str, items: list[tuple[str | None, str]]) -> list[MessageId]:
    p = client.create_producer(topic)
    ids = [p.send(v, key=k) for k, v in items]
    p.close()
    return ids


def compacted_ids(client, topic: str, start="earliest", inclusive=False) -> list[MessageId]:
    """What a compacted reader from `start` reads until has_message_available says the end
    (K9: the loop ends)."""
    out = []
    with client.create_reader(topic, start, inclusive=inclusive, read_compacted=True) as r:
        while r.has_message_available():
            out.append(r.read_next(timeout=10).message_id)
            assert len(out) < 10_000
    return out


def storage_root(broker) -> str:
    return os.path.join(broker.data_dir, "storage")


ITEMS = [("a", "a1"), ("b", "b1"), ("a", "a2"), ("c", "c1"), ("b", "b2"), ("c", ""),
         ("d", "d1"), ("d", "")]
