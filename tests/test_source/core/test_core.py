"""Pure core types: topic names, MessageId, the error table, policies."""
from __future__ import annotations

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shadowtopic.core import errors
from shadowtopic.core.message_id import EARLIEST, LATEST, MessageId
from shadowtopic.core.names import TopicName, canonical
from shadowtopic.core.policies import (
    BOOL_FIELDS,
    DEFAULTS,
    MAX_MESSAGE_SIZE,
    MAX_PARTITIONS,
    MAX_PROPERTIES,
    MAX_PROPERTIES_BYTES,
    RANGES,
    Policies,
    validate_partitions,
    validate_properties,
)


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
    assert isinstance(errors.from_status(grpc.StatusCode.NOT_FOUND, "x", None),
                      errors.TopicNotFound)
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


# ---- policy ranges -------------------------------------------------------------------------

INT_FIELDS = sorted(RANGES)


@pytest.mark.parametrize("name", INT_FIELDS)
def test_every_policy_range_is_inclusive_and_fits_its_protobuf_field(name):
    low, high = RANGES[name]
    for ok in (low, high):
        pb = Policies(**{name: ok}).to_pb()
        assert getattr(pb, name) == ok and Policies.from_pb(pb) == Policies(**{name: ok})
    for bad in (low - 1, high + 1):
        with pytest.raises(errors.InvalidPolicies) as info:
            Policies(**{name: bad}).to_pb()
        assert name in info.value.message and f"{low}..{high}" in info.value.message


@pytest.mark.parametrize("policies,field", [
    (Policies(max_message_size=-5), "max_message_size"),
    (Policies(max_message_size=100 << 30), "max_message_size"),      # the CLI's "100G"
    (Policies(max_message_size=MAX_MESSAGE_SIZE + 1), "max_message_size"),
    (Policies(ledger_max_entries=-5), "ledger_max_entries"),
    (Policies(ledger_max_bytes=2**64 - 1), "ledger_max_bytes"),
    (Policies(ledger_max_bytes=2**64), "ledger_max_bytes"),
    (Policies(retention_size_bytes=-2**63 - 1), "retention_size_bytes"),
    (Policies(max_producers=2**32), "max_producers"),
    (Policies(max_message_size="100G"), "max_message_size"),
    (Policies(ledger_max_age_seconds=1.5), "ledger_max_age_seconds"),
    (Policies(max_subscriptions=True), "max_subscriptions"),
    (Policies(retain_null_key="yes"), "retain_null_key"),
    (Policies(retain_null_key=1), "retain_null_key"),
])
def test_bad_policies_are_typed_errors_naming_the_field_never_value_errors(policies, field):
    with pytest.raises(errors.InvalidPolicies) as info:
        policies.to_pb()
    assert field in info.value.message
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT


@settings(max_examples=300, deadline=None, database=None)
@given(name=st.sampled_from(INT_FIELDS),
       value=st.one_of(st.integers(), st.integers(-2**65, 2**65), st.floats(), st.text(),
                       st.booleans(), st.none()))
def test_any_policy_value_round_trips_or_is_invalid_policies(name, value):
    p = Policies(**{name: value})
    try:
        pb = p.to_pb()
    except errors.InvalidPolicies:
        low, high = RANGES[name]
        assert not (type(value) is int and low <= value <= high)
        return
    assert Policies.from_pb(pb) == p


def test_defaults_are_within_the_ranges():
    assert DEFAULTS.validate() is DEFAULTS
    assert set(RANGES) | set(BOOL_FIELDS) == set(DEFAULTS.as_dict())


@pytest.mark.parametrize("ok", [0, 1, MAX_PARTITIONS])
def test_partition_counts_in_range(ok):
    assert validate_partitions(ok) == ok


@pytest.mark.parametrize("bad", [-2, -1, MAX_PARTITIONS + 1, 2**32, "3", 1.0, True, None])
def test_partition_counts_out_of_range_are_invalid_argument(bad):
    with pytest.raises(errors.InvalidArgument) as info:
        validate_partitions(bad)
    assert "partitions" in info.value.message and f"0..{MAX_PARTITIONS}" in info.value.message


def test_properties_are_bounded_strings():
    assert validate_properties({"a": "b"}) == {"a": "b"}
    assert validate_properties({"k": "v" * (MAX_PROPERTIES_BYTES - 1)})
    for bad in ({"k": 1}, {1: "v"}, ["a", "b"], {"k": "\ud800"},
                {"k": "v" * MAX_PROPERTIES_BYTES},
                {str(i): "" for i in range(MAX_PROPERTIES + 1)}):
        with pytest.raises(errors.InvalidArgument):
            validate_properties(bad)
