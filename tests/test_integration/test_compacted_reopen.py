"""A shadow broker on another machine whose object store is briefly unreachable when it first
opens the source's compacted ledger (failpoint `compaction.ledger.open`, the first opens fail
as an unreachable store does): `read_compacted` readers of the shadow get DATA_LOSS while the
ledger cannot be opened, then, with no new compaction pointer, the broker has opened it again
by itself and they read the source's compacted view (compaction/view.py)."""
from __future__ import annotations

import os
import time
import uuid

from support.compaction_support import pointer, produce, wait_done

from shadowtopic import failpoints
from shadowtopic.broker.server import free_port
from shadowtopic.client import Client, errors
from shadowtopic.standalone import BrokerProcess

FAILED_OPENS = 4  # the broker tries again after 0.5, 1, 2 and 4 s: the 5th open succeeds


def compacted_ids(client, topic: str) -> list:
    out = []
    with client.create_reader(topic, "earliest", read_compacted=True) as r:
        while len(out) < 1000 and r.has_message_available():
            out.append(r.read_next(timeout=10).message_id)
    return out


def test_a_shadow_broker_opens_the_compacted_ledger_again(etcd_server, tmp_path, cluster,
                                                          worker):
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"
    shadow = topic + "-shadow"
    src = BrokerProcess(etcd_server.endpoint, str(tmp_path / "source"), free_port(),
                        extra_args=["--lease-ttl", "3", "--cluster", cluster])
    sh = BrokerProcess(etcd_server.endpoint, str(tmp_path / "shadow-broker"), free_port(),
                       extra_args=["--lease-ttl", "3", "--cluster", cluster, "--storage-root",
                                   os.path.join(str(tmp_path / "source"), "storage")],
                       module="shadowtopic.shadow.broker",
                       env=failpoints.env({"compaction.ledger.open":
                                           f"{FAILED_OPENS}*error(object store unreachable)"}))
    try:
        src.start(timeout=60)
        with Client(src.url, timeout=30) as c:
            produce(c, topic, [(f"k{i % 4}", f"v{i}") for i in range(20)])
            job = c.admin.compact(topic)
            assert wait_done(c, topic, job).phase == "done"
            want = compacted_ids(c, topic)
            assert len(want) == 4
            c.admin.create_shadow_topic(shadow, topic)
        sh.start(timeout=60)
        with Client(sh.url, timeout=30) as c2:
            # the first compacted read opens the view: that open fails, and so do reads
            try:
                with c2.create_reader(shadow, "earliest", read_compacted=True) as r:
                    r.read_next(timeout=5)
                raise AssertionError("a compacted read of an unopened ledger returned")
            except errors.DataLoss as exc:
                assert "unreachable" in str(exc)
            deadline = time.monotonic() + 60
            while True:
                try:
                    got = compacted_ids(c2, shadow)
                    break
                except errors.DataLoss:  # not opened yet
                    pass
                assert time.monotonic() < deadline, "the compacted ledger was never reopened"
                time.sleep(0.2)
            assert got == want
        assert pointer(etcd_server, topic).job_id == job  # the same pointer, opened again
        with open(sh.log_path) as f:
            log = f.read()
        assert log.count("still unreadable, trying again") == FAILED_OPENS - 1
        assert f"{shadow}: compacted ledger of job {job} opened again" in log
    finally:
        sh.kill()
        src.kill()
