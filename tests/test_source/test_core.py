"""Pure core types: topic names, MessageId, the error table, policies."""
from __future__ import annotations

import grpc
import pytest

from source.core import errors
from source.core.message_id import EARLIEST, LATEST, MessageId
from source.core.names import TopicName, canonical
from source.core.policies import DEFAULTS, Policies


@pytest.mark.parametrize("text,full", [
    ("t", "persistent://public/default/t"),
    ("tn/ns/t", "persistent://tn/ns/t"),
    ("persistent://a/b/c-1.x=y:z", "persistent://a/b/c-1.x=y:z"),
])
def test_topic_names_canonicalise(text, full):
    assert canonical(text) == full


@pytest.mark.parametrize("bad", ["", "non-persistent://a/b/c", "a/b", "persistent://a/b",
                                 "persistent://a/b/c/d", "t with space", "x" * 600, "a/b/c?"])
def test_invalid_topic_names_are_typed_errors(bad):
    with pytest.raises(errors.InvalidTopicName) as info:
        TopicName.parse(bad)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_partition_names():
    t = TopicName.parse("orders")
    p = t.partition(2)
    assert str(p) == "persistent://public/default/orders-partition-2"
    assert p.partition_index == 2 and p.partitioned_parent == t
    assert t.partition_index == -1 and t.partitioned_parent is None


def test_message_id_text_bytes_and_order():
    a, b, c = MessageId(1, 5), MessageId(1, 6), MessageId(2, 0)
    assert a < b < c and EARLIEST < a and c < LATEST
    assert MessageId.parse("1:5") == a and str(MessageId(3, 4, 2)) == "3:4:2"
    for mid in (a, MessageId(7, 9, 3)):
        assert MessageId.deserialize(mid.serialize()) == mid


@pytest.mark.parametrize("junk", ["", "1", "a:b", "1:2:3:4", "-1:2", "1:-5"])
def test_message_id_rejects_junk_text(junk):
    with pytest.raises(errors.InvalidMessageId):
        MessageId.parse(junk)


def test_message_id_rejects_junk_bytes():
    with pytest.raises(errors.InvalidMessageId):
        MessageId.deserialize(b"\xff\xff\xff")


def test_every_error_round_trips_through_the_status_table():
    assert len(errors.REGISTRY) > 20
    for reason, cls in errors.REGISTRY.items():
        code, details, md = errors.to_status(cls("boom"))
        back = errors.from_status(code, details, dict(md)[errors.REASON_KEY])
        assert type(back) is cls and back.message == "boom" and back.reason == reason


def test_status_without_reason_maps_by_code():
    assert isinstance(errors.from_status(grpc.StatusCode.NOT_FOUND, "x", None), errors.TopicNotFound)
    assert errors.from_status(grpc.StatusCode.UNAVAILABLE, "x", None).retriable


def test_policies_merge_validate_and_round_trip():
    p = Policies(retention_size_bytes=10, retain_null_key=False)
    assert Policies.from_pb(p.to_pb()) == p
    merged = p.merged(Policies(retention_size_bytes=20))
    assert merged.retention_size_bytes == 20 and merged.retain_null_key is False
    eff = merged.effective()
    assert eff.max_message_size == DEFAULTS.max_message_size and eff.retention_size_bytes == 20
    with pytest.raises(errors.InvalidPolicies):
        Policies(retention_time_seconds=-5).validate()
    with pytest.raises(errors.InvalidPolicies):
        Policies(max_message_size=0).validate()
