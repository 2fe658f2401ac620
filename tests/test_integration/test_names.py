"""Topic names at the service boundary: names that could reach outside the storage root or
share a folder are refused with InvalidTopicName over raw gRPC, and nothing is created."""
from __future__ import annotations

import os

import grpc
import pytest

from shadowtopic.core import errors
from shadowtopic.pb.v1 import admin_pb2 as apb
from shadowtopic.pb.v1 import admin_pb2_grpc

BAD = ["../../etc", "public/default/..", "public/default/.", "./default/x",
       "persistent://../../..", "persistent://a/../x", "persistent://b/../x", "a/b/x\x00",
       "a/b/" + "x" * 300]


def _reason(exc: grpc.RpcError) -> str | None:
    return dict(exc.trailing_metadata() or ()).get(errors.REASON_KEY)


@pytest.mark.parametrize("name", BAD)
@pytest.mark.own_broker
def test_bad_names_are_refused_and_nothing_is_created(broker, client, etcd_server, name):
    with grpc.insecure_channel(broker.url) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.CreateTopic(apb.CreateTopicRequest(topic=name), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert _reason(info.value) == "InvalidTopicName"
        assert "\n" not in info.value.details()
        for call, request in ((stub.GetTopicStats, apb.TopicRequest),
                              (stub.Lookup, apb.TopicRequest),
                              (stub.GetLastMessageId, apb.GetLastMessageIdRequest)):
            with pytest.raises(grpc.RpcError) as info:
                call(request(topic=name), timeout=10)
            assert _reason(info.value) == "InvalidTopicName"
    with pytest.raises(errors.InvalidTopicName):
        client.admin.create_topic(name)
    # (the broker's periodic disk probe, source/ledger/disk.py, writes and removes a file
    # of its own: a walk may see it)
    written = [os.path.join(d, f) for d, _, files in os.walk(broker.data_dir) for f in files
               if not f.startswith(".disk-probe-")]
    assert all(os.path.basename(p) in ("broker.id", "broker.lock") or "/logs/" in p
               for p in written), written
