"""A compaction request's horizon never passes a ledger that is still being sealed, so the job
covers every message produced before the request (K1; issue 21: the source's compacted read
over S3 that "hung" in about 1 run of 8).

Seals run side by side: a ledger rolled when it filled may still be sealing when `Compact`
rolls the next one, and over S3 the small one's seal can finish first. The request then
carried the second ledger's last entry as its horizon while the first was still OPEN; the
worker's plan reads SEALED ledgers only (compaction/plan.py), so the first ledger's messages
were left out of the compacted ledger for good, and a compacted reader waiting for one of
them waited forever (nothing failed, nothing was logged). Here the failpoint
`ledger.seal.write=1*sleep(S)` holds the first seal in its executor thread, on local files,
and the request is checked as the worker would plan it. No worker (no Spark) is needed: the
request waits in a cluster of this module's own.
"""
from __future__ import annotations

import uuid

import pytest
from support.etcd_support import etcd_get

from shadowtopic import failpoints
from shadowtopic.broker.server import free_port
from shadowtopic.client import Client, Policies
from shadowtopic.compaction.plan import make_plan
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.metadata import keys
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.standalone import BrokerProcess

HOLD_S = 3  # how long the first seal is held (the Compact call waits for it)


@pytest.fixture(scope="module")
def slow_seal_broker(etcd_server, tmp_path_factory):
    """A source broker of a cluster of its own whose first seal is held `HOLD_S` seconds."""
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path_factory.mktemp("slow-seal")),
                      free_port(), extra_args=["--lease-ttl", "3", "--cluster", cluster],
                      env=failpoints.env({"ledger.seal.write": f"1*sleep({HOLD_S})"}))
    b.start(timeout=60)
    try:
        yield b, cluster
    finally:
        b.kill()


def test_the_horizon_waits_for_an_earlier_ledger_still_sealing(etcd_server, slow_seal_broker):
    b, cluster = slow_seal_broker
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"
    name = TopicName.parse(topic)
    items = [("a", "a1"), ("b", "b1"), ("a", "a2"), ("c", "c1"), ("b", "b2"), ("a", "a3")]
    with Client(b.url, timeout=30) as c:
        c.admin.create_topic(topic, policies=Policies(ledger_max_entries=4))
        with c.create_producer(topic) as p:  # the first ledger fills at c1: its seal is held
            ids = [p.send(v.encode(), key=k) for k, v in items]
        assert ids[3].ledger_id < ids[4].ledger_id, ids
        c.admin.compact(topic)
    req = mpb.CompactionRequest.FromString(
        etcd_get(etcd_server, keys.compaction_request(cluster, name)).value)
    ledgers = mpb.LedgerList.FromString(etcd_get(etcd_server, keys.ledgers(name)).value)
    horizon = MessageId.from_pb(req.horizon)
    assert (horizon.ledger_id, horizon.entry_id) == (ids[-1].ledger_id, ids[-1].entry_id)
    # every ledger up to the horizon was sealed when the request was filed ...
    states = {i.ledger_id: mpb.LedgerState.Name(i.state) for i in ledgers.ledgers
              if i.ledger_id <= horizon.ledger_id}
    assert states == {ids[0].ledger_id: "SEALED", ids[-1].ledger_id: "SEALED"}, states
    # ... so the job the worker plans from them reads all six messages (it read two: b2, a3)
    plan = make_plan(name, req.job_id, ledgers, horizon, None, True)
    assert [i.ledger_id for i in plan.ledgers] == [ids[0].ledger_id, ids[-1].ledger_id]
    assert plan.input_entries == len(items)
