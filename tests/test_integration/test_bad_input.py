"""F7: out-of-range and malformed input gets typed errors naming the field and its range, never a
traceback: from the client library before anything is sent, and from the broker over raw
gRPC (it validates what arrives itself).

The examples of the hardening issue: partitions -2 or above 1024, max_message_size -5, 100G
or above the ceiling, ledger_max_entries -5, a huge uint64 ledger_max_bytes, page_size huge,
and what the fuzzing (test_rpc_fuzz.py) and probing turned up: junk bytes on the Consumer
stream, produce requests with millions of messages, errors echoing megabytes of input.
"""
from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from shadowtopic.broker.rpc import RejectMalformed, unary
from shadowtopic.broker.server import free_port
from shadowtopic.client import Client, Policies
from shadowtopic.core import errors
from shadowtopic.core.errors import MAX_DETAILS
from shadowtopic.core.policies import MAX_BATCH_MESSAGES, MAX_MESSAGE_SIZE, MAX_PARTITIONS
from shadowtopic.pb.v1 import admin_pb2 as apb
from shadowtopic.pb.v1 import admin_pb2_grpc, common_pb2, consumer_pb2, producer_pb2

GiB = 1 << 30


def reason(exc: grpc.RpcError) -> str | None:
    return dict(exc.trailing_metadata() or ()).get(errors.REASON_KEY)


# ---- client library: typed errors before sending -------------------------------------------

CLIENT_CASES = {
    "partitions -2": (lambda a: a.create_topic("t", partitions=-2),
                      errors.InvalidArgument, "partitions", f"0..{MAX_PARTITIONS}"),
    "partitions 1025": (lambda a: a.create_topic("t", partitions=MAX_PARTITIONS + 1),
                        errors.InvalidArgument, "partitions", f"0..{MAX_PARTITIONS}"),
    "partitions '3'": (lambda a: a.create_topic("t", partitions="3"),
                       errors.InvalidArgument, "partitions", f"0..{MAX_PARTITIONS}"),
    "max_message_size -5": (lambda a: a.create_topic("t", policies=Policies(max_message_size=-5)),
                            errors.InvalidPolicies, "max_message_size", f"1..{MAX_MESSAGE_SIZE}"),
    "max_message_size 100G": (
        lambda a: a.set_policies("t", Policies(max_message_size=100 * GiB)),
        errors.InvalidPolicies, "max_message_size", f"1..{MAX_MESSAGE_SIZE}"),
    "max_message_size above the ceiling": (
        lambda a: a.set_policies("t", Policies(max_message_size=MAX_MESSAGE_SIZE + 1)),
        errors.InvalidPolicies, "max_message_size", f"1..{MAX_MESSAGE_SIZE}"),
    "ledger_max_entries -5": (
        lambda a: a.set_policies("t", Policies(ledger_max_entries=-5)),
        errors.InvalidPolicies, "ledger_max_entries", "1.."),
    "ledger_max_bytes 2^64-1": (
        lambda a: a.set_policies("t", Policies(ledger_max_bytes=2**64 - 1)),
        errors.InvalidPolicies, "ledger_max_bytes", "1.."),
    "properties not strings": (lambda a: a.create_topic("t", properties={"k": 1}),
                               errors.InvalidArgument, "properties", "strings"),
    "properties too big": (lambda a: a.create_topic("t", properties={"k": "v" * (64 << 10)}),
                           errors.InvalidArgument, "properties", "bytes"),
}


@pytest.mark.parametrize("case", CLIENT_CASES, ids=list(CLIENT_CASES))
def test_the_client_refuses_bad_arguments_before_sending(case):
    """Nothing listens at the address: any error but ConnectError was raised before sending."""
    action, cls, field, allowed = CLIENT_CASES[case]
    with Client(f"127.0.0.1:{free_port()}", timeout=2) as c:
        with pytest.raises(errors.ShadowTopicError) as info:
            action(c.admin)
    assert type(info.value) is cls, info.value
    assert field in info.value.message and allowed in info.value.message, info.value.message


def test_the_producer_refuses_bad_messages_and_options_and_its_batches_stay_whole(client, topic):
    client.admin.create_topic(topic)
    with client.create_producer(topic) as p:
        first = p.send(b"a")
        bad = [(dict(payload=42), errors.InvalidArgument),
               (dict(payload=b"x" * (MAX_MESSAGE_SIZE + 1)), errors.MessageTooBig),
               (dict(payload=b"b", key=3), errors.InvalidArgument),
               (dict(payload=b"b", event_time=2**70), errors.InvalidArgument),
               (dict(payload=b"b", event_time="now"), errors.InvalidArgument),
               (dict(payload=b"b", properties={"k": 1}), errors.InvalidArgument)]
        for kwargs, cls in bad:
            with pytest.raises(cls):
                p.send(**kwargs)
        second = p.send(b"b")
    assert (second.ledger_id, second.entry_id) == (first.ledger_id, first.entry_id + 1)
    for options in (dict(max_inflight=0), dict(linger_ms=-1), dict(batch_max_messages=0),
                    dict(batch_max_bytes=64 << 20), dict(batch_max_messages=10**9)):
        with pytest.raises(errors.InvalidArgument):
            client.create_producer(topic, **options)
    with client.create_reader(topic) as r:
        assert [r.read_next(10).payload for _ in range(2)] == [b"a", b"b"]
        assert not r.has_message_available()


# ---- raw gRPC: the broker validates what arrives --------------------------------------------

def raw_cases(topic: str) -> dict[str, tuple[str, object, str, str]]:
    """name -> (Admin method, request, reason, text the message must hold)."""
    create = lambda **kw: apb.CreateTopicRequest(topic=topic, **kw)  # noqa: E731
    pol = common_pb2.Policies
    return {
        "partitions 1025": ("CreateTopic", create(partitions=MAX_PARTITIONS + 1),
                            "InvalidArgument", f"0..{MAX_PARTITIONS}"),
        "partitions 2^32-1 (-1 as uint32)": ("CreateTopic", create(partitions=2**32 - 1),
                                             "InvalidArgument", f"0..{MAX_PARTITIONS}"),
        "max_message_size 0": ("CreateTopic", create(policies=pol(max_message_size=0)),
                               "InvalidPolicies",
                               f"max_message_size must be in 1..{MAX_MESSAGE_SIZE}"),
        "max_message_size above the ceiling": (
            "CreateTopic", create(policies=pol(max_message_size=MAX_MESSAGE_SIZE + 1)),
            "InvalidPolicies", f"1..{MAX_MESSAGE_SIZE}"),
        "max_message_size 2^32-1": ("CreateTopic", create(policies=pol(max_message_size=2**32 - 1)),
                                    "InvalidPolicies", "max_message_size"),
        "ledger_max_entries 0": ("CreateTopic", create(policies=pol(ledger_max_entries=0)),
                                 "InvalidPolicies", "ledger_max_entries must be in 1.."),
        "ledger_max_bytes 2^64-1": ("SetPolicies", apb.SetPoliciesRequest(
            topic=topic, policies=pol(ledger_max_bytes=2**64 - 1)),
            "InvalidPolicies", "ledger_max_bytes must be in 1.."),
        "retention_time_seconds -2": ("SetPolicies", apb.SetPoliciesRequest(
            topic=topic, policies=pol(retention_time_seconds=-2)),
            "InvalidPolicies", "retention_time_seconds must be in -1.."),
        "max_producers 2^32-1": ("SetPolicies", apb.SetPoliciesRequest(
            topic=topic, policies=pol(max_producers=2**32 - 1)),
            "InvalidPolicies", "max_producers must be in 0.."),
        "properties above 16 KiB": ("CreateTopic", create(properties={"k": "v" * (16 << 10)}),
                                    "InvalidArgument", "properties"),
        "page_size 1001": ("ListTopics", apb.ListTopicsRequest(
            page=common_pb2.PageRequest(page_size=1001)), "InvalidArgument", "page_size"),
        "page_size 2^32-1": ("ListTopics", apb.ListTopicsRequest(
            page=common_pb2.PageRequest(page_size=2**32 - 1)), "InvalidArgument", "0..1000"),
        "namespace ../..": ("ListTopics", apb.ListTopicsRequest(namespace="../.."),
                            "InvalidTopicName", "tenant"),
    }


def test_raw_grpc_out_of_range_values_get_typed_statuses_and_change_nothing(broker, topic):
    with grpc.insecure_channel(broker.url) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        existing = f"{topic}-existing"
        stub.CreateTopic(apb.CreateTopicRequest(topic=existing), timeout=10)
        before = stub.GetPolicies(apb.TopicRequest(topic=existing), timeout=10)
        for name, (method, request, why, text) in raw_cases(topic).items():
            if method == "SetPolicies":
                request.topic = existing
            with pytest.raises(grpc.RpcError) as info:
                getattr(stub, method)(request, timeout=10)
            got = (info.value.code(), reason(info.value))
            assert got == (grpc.StatusCode.INVALID_ARGUMENT, why), (name, info.value.details())
            assert text in info.value.details(), (name, info.value.details())
        assert stub.GetPolicies(apb.TopicRequest(topic=existing), timeout=10) == before
        with pytest.raises(grpc.RpcError) as info:
            stub.GetTopicMetadata(apb.TopicRequest(topic=topic), timeout=10)
        assert reason(info.value) == "TopicNotFound"
        # the edges themselves are fine: page_size 0 (the default) and 1000, 1024 partitions
        for size in (0, 1000):
            stub.ListTopics(apb.ListTopicsRequest(page=common_pb2.PageRequest(page_size=size)),
                            timeout=10)
        made = stub.CreateTopic(apb.CreateTopicRequest(
            topic=topic, partitions=MAX_PARTITIONS,
            policies=common_pb2.Policies(max_message_size=MAX_MESSAGE_SIZE)), timeout=30)
        assert made.partitions == MAX_PARTITIONS
        assert made.policies.max_message_size == MAX_MESSAGE_SIZE


def produce(channel: grpc.Channel, requests: list[bytes], timeout: float = 60):
    call = channel.stream_stream("/shadowtopic.v1.Producer/Produce", request_serializer=None,
                                 response_deserializer=producer_pb2.ProduceReceipt.FromString)
    return list(call(iter(requests), timeout=timeout))


def test_produce_requests_beyond_the_limits_get_in_band_errors_and_the_stream_goes_on(
        broker, client, topic):
    client.admin.create_topic(topic)
    head = producer_pb2.ProduceRequest(topic=topic, request_id=1).SerializeToString()
    too_many = head + b"\x22\x00" * (MAX_BATCH_MESSAGES + 1)   # field 4: empty messages
    long_name = producer_pb2.ProduceRequest(topic=topic, producer_name="p" * 300, request_id=2,
                                            messages=[common_pb2.Message(payload=b"x")])
    ok = producer_pb2.ProduceRequest(topic=topic, request_id=3,
                                     messages=[common_pb2.Message(payload=b"ok")])
    with grpc.insecure_channel(broker.url) as channel:
        receipts = produce(channel, [too_many, long_name.SerializeToString(),
                                     ok.SerializeToString()])
    assert [r.request_id for r in receipts] == [1, 2, 3]
    assert receipts[0].error.reason == "InvalidArgument"
    assert str(MAX_BATCH_MESSAGES) in receipts[0].error.message
    assert receipts[1].error.reason == "InvalidArgument"
    assert "producer_name" in receipts[1].error.message
    assert not receipts[2].HasField("error") and receipts[2].count == 1
    with client.create_reader(topic) as r:
        assert r.read_next(10).payload == b"ok" and not r.has_message_available()


@pytest.mark.slow
def test_a_produce_request_of_millions_of_empty_messages_is_refused(broker, client, topic):
    """64 MiB of empty messages (30 million) used to be appended: 7 s on the event loop.
    Now it is refused once parsed; the parse itself still takes seconds (see the report of
    the hardening issue), so the topic may fence and reload meanwhile, but nothing of the
    request is stored and the topic goes on."""
    client.admin.create_topic(topic)
    with client.create_producer(topic) as p:
        p.send(b"before")
    head = producer_pb2.ProduceRequest(topic=topic, request_id=7).SerializeToString()
    with grpc.insecure_channel(broker.url, options=[
            ("grpc.max_send_message_length", 128 << 20)]) as channel:
        receipts = produce(channel, [head + b"\x22\x00" * (30 << 20)])
    assert receipts[0].error.reason == "InvalidArgument"
    with client.create_producer(topic) as p:
        deadline = time.monotonic() + 30
        while True:  # the stall may have fenced the topic: a retriable error, then a reload
            try:
                p.send(b"after")
                break
            except errors.ShadowTopicError as exc:
                assert exc.retriable and time.monotonic() < deadline, exc
                time.sleep(0.2)
    with client.create_reader(topic) as r:
        assert [r.read_next(10).payload for _ in range(2)] == [b"before", b"after"]
        assert not r.has_message_available()


def test_consumer_stream_bad_commands_get_typed_errors(broker, client, topic):
    client.admin.create_topic(topic)
    with grpc.insecure_channel(broker.url) as channel:
        connect = channel.stream_stream(
            "/shadowtopic.v1.Consumer/Connect", request_serializer=None,
            response_deserializer=consumer_pb2.ServerMessage.FromString)
        with pytest.raises(grpc.RpcError) as info:
            list(connect(iter([b"\xff"]), timeout=10))
        assert (info.value.code(), reason(info.value)) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                           "InvalidArgument")
        beyond = common_pb2.StartPosition(message_id=common_pb2.MessageIdData(
            ledger_id=1, entry_id=2**64 - 1))
        commands = [
            consumer_pb2.ClientCommand(handle=1, subscribe=consumer_pb2.Subscribe(
                topic=topic, start=beyond)),
            consumer_pb2.ClientCommand(handle=2, subscribe=consumer_pb2.Subscribe(
                topic=topic, subscription="../x")),
            consumer_pb2.ClientCommand(handle=3, subscribe=consumer_pb2.Subscribe(
                topic=topic, subscription="durable")),
        ]
        message = consumer_pb2.ClientMessage(commands=commands).SerializeToString()
        frames = [f for m in connect(iter([message]), timeout=10) for f in m.frames]
    errs = {f.handles[0]: f.event.error for f in frames if f.event.HasField("error")}
    assert errs[1].reason == "InvalidMessageId"
    assert errs[2].reason == "InvalidArgument" and "subscription" in errs[2].message
    subscribed = {f.handles[0]: f.event.subscribed for f in frames
                  if f.event.HasField("subscribed")}
    assert 3 not in errs and subscribed[3].created  # the good one among them went through


# ---- service-side error mapping (shadowtopic.broker.rpc, shadowtopic.core.errors), in-process --

class _Servicer(admin_pb2_grpc.AdminServicer):
    @unary
    async def GetPolicies(self, request, context):
        raise errors.TopicNotFound("x" * 100_000)

    @unary
    async def Lookup(self, request, context):
        raise ValueError("a bug")

    @unary
    async def GetTopicMetadata(self, request, context):
        return apb.TopicMetadata(topic=request.topic)

    async def WatchCompaction(self, request, context):
        yield apb.CompactionJob(topic=request.topic)


async def _rpc_mapping() -> dict[str, tuple]:
    server = grpc.aio.server(interceptors=[RejectMalformed()])
    admin_pb2_grpc.add_AdminServicer_to_server(_Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    out = {}
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            def unary_call(name):
                return channel.unary_unary(f"/shadowtopic.v1.Admin/{name}",
                                           request_serializer=None, response_deserializer=None)
            watch = channel.unary_stream("/shadowtopic.v1.Admin/WatchCompaction",
                                         request_serializer=None, response_deserializer=None)
            good = apb.TopicRequest(topic="t").SerializeToString()
            calls = {"big message": unary_call("GetPolicies")(good),
                     "bug": unary_call("Lookup")(good),
                     "junk": unary_call("GetTopicMetadata")(b"\x0a\x05ab"),
                     "fine": unary_call("GetTopicMetadata")(good),
                     "junk stream": _collect(watch(b"\xff")),
                     "fine stream": _collect(watch(good))}
            for name, pending in calls.items():
                try:
                    out[name] = ("ok", await asyncio.wait_for(pending, 10))
                except grpc.aio.AioRpcError as exc:
                    out[name] = (exc.code(), reason(exc), exc.details())
    finally:
        await server.stop(0)
    return out


async def _collect(stream) -> list:
    return [item async for item in stream]


def test_rpc_mapping_types_every_failure_and_bounds_its_message(arun):
    out = arun(_rpc_mapping())
    code, why, details = out["big message"]
    assert (code, why) == (grpc.StatusCode.NOT_FOUND, "TopicNotFound")
    assert len(details) <= MAX_DETAILS + 3
    assert out["bug"][:2] == (grpc.StatusCode.INTERNAL, "Internal")
    for name in ("junk", "junk stream"):
        assert out[name][:2] == (grpc.StatusCode.INVALID_ARGUMENT, "InvalidArgument"), out[name]
        assert "malformed request" in out[name][2]
    assert out["fine"] == ("ok", apb.TopicMetadata(topic="t").SerializeToString())
    assert out["fine stream"] == ("ok", [apb.CompactionJob(topic="t").SerializeToString()])
