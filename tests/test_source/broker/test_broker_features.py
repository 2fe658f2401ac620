"""The broker's feature seam (source/broker/feature.py) and its one topic builder
(source/broker/builder.py), without processes: the features a broker is assembled with, the
order in which what opens with a topic closes (on unload, and when an open fails half way),
and a broker assembled without a feature answering that feature's RPCs UNIMPLEMENTED."""
from __future__ import annotations

from contextlib import asynccontextmanager

import grpc
import pytest

from shadowtopic.broker import feature
from shadowtopic.broker.admin_service import AdminService
from shadowtopic.broker.config import BrokerConfig
from shadowtopic.broker.feature import BrokerFeature
from shadowtopic.broker.ownership import BrokerSession
from shadowtopic.broker.topic_admin import TopicAdmin
from shadowtopic.broker.topics import TopicManager
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import Policies
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.v1 import admin_pb2 as apb

TOPIC = TopicName.parse("persistent://t/ns/features")


def test_the_installed_features_are_found_by_name_and_an_unknown_one_is_refused():
    assert {"shadow", "compaction"} <= set(feature.installed())
    made = feature.load(["compaction", "shadow"])
    assert [f.name for f in made] == ["compaction", "shadow"]
    assert feature.load([]) == []
    with pytest.raises(ValueError, match="unknown broker feature.*nope.*installed: .*shadow"):
        feature.load(["shadow", "nope"])


class Recorder(BrokerFeature):
    """Pushes a close for each hook onto the topic's stack and records the order."""

    name = "recorder"

    def __init__(self, log: list[str], fail_ready: bool = False):
        self.log = log
        self.fail_ready = fail_ready

    async def open_topic(self, t, info, stack):
        self.log.append("open")
        stack.callback(self.log.append, "close open")

    async def topic_ready(self, t, info, stack):
        self.log.append("ready")
        stack.callback(self.log.append, "close ready")
        if self.fail_ready:
            raise errors.Internal("ready failed")


@asynccontextmanager
async def broker(tmp_path, features):
    store = MemoryStore()
    session = BrokerSession(store, "c", "b1", "127.0.0.1:1", ["source"], ttl=10)
    await session.start()
    await session.wait_ready(5)
    topics = TopicManager(store, Storage(str(tmp_path / "storage")), session,
                          features=features)
    try:
        await TopicAdmin(topics, features).create(TOPIC, 0, Policies(), {})
        yield store, topics, session
    finally:
        for name in list(topics._loaded):
            await topics.unload(name)
        topics.executor.shutdown(wait=True)
        await session.stop()


def test_a_topic_closes_what_opened_with_it_in_reverse_order(tmp_path, arun):
    log: list[str] = []

    async def body():
        async with broker(tmp_path, [Recorder(log)]) as (store, topics, session):
            t = await topics.topic(TOPIC)
            assert log == ["open", "ready"]
            assert await store.get(keys.ownership("c", TOPIC)) is not None
            await topics.unload(TOPIC, errors.TopicNotFound("gone"))
            assert log == ["open", "ready", "close ready", "close open"]
            assert t.ledger.closed is not None  # the view closed, after the features
            assert await store.get(keys.ownership("c", TOPIC)) is None  # released last
    arun(body())


def test_an_open_that_fails_half_way_unwinds_and_releases_the_topic(tmp_path, arun):
    log: list[str] = []

    async def body():
        async with broker(tmp_path, [Recorder(log, fail_ready=True)]) as (store, topics, _):
            with pytest.raises(errors.Internal, match="ready failed"):
                await topics.topic(TOPIC)
            assert log == ["open", "ready", "close ready", "close open"]
            assert topics.loaded(TOPIC) is None
            assert await store.get(keys.ownership("c", TOPIC)) is None
            # nothing is left half-open: the next open takes the topic again
            log.clear()
            topics.features[0].fail_ready = False
            t = await topics.topic(TOPIC)
            assert log == ["open", "ready"] and t.ledger.closed is None
    arun(body())


def test_read_compacted_is_refused_by_a_broker_without_the_compaction_feature(tmp_path, arun):
    async def body():
        async with broker(tmp_path, []) as (_, topics, _session):
            with pytest.raises(errors.NotAllowed, match="without the compaction feature"):
                await topics.compacted_view(TOPIC)
    arun(body())


class AbortingContext:
    """Enough of grpc's servicer context for a unary handler that aborts."""

    def __init__(self):
        self.metadata = ()

    def set_trailing_metadata(self, md):
        self.metadata = md

    async def abort(self, code, details):
        self.code, self.details = code, details
        raise grpc.aio.AbortError()

    def invocation_metadata(self):
        return ()


def test_a_feature_rpc_on_a_broker_without_that_feature_is_unimplemented(tmp_path, arun):
    async def body():
        async with broker(tmp_path, []) as (_, topics, session):
            admin = AdminService(topics, session, [])
            for rpc, request, name in (
                    (admin.CreateShadowTopic, apb.CreateShadowTopicRequest(), "shadow"),
                    (admin.Compact, apb.TopicRequest(topic=str(TOPIC)), "compaction")):
                ctx = AbortingContext()
                with pytest.raises(grpc.aio.AbortError):
                    await rpc(request, ctx)
                assert ctx.code == grpc.StatusCode.UNIMPLEMENTED
                assert f"without the {name} feature" in ctx.details
    arun(body())


def test_a_feature_installs_its_admin_rpcs(tmp_path, arun):
    async def body():
        async with broker(tmp_path, []) as (_, topics, session):
            shadow, compaction = feature.load(["shadow", "compaction"])
            for f in (shadow, compaction):
                f.bind(type("Host", (), {"topics": topics, "store": topics.store,
                                         "storage": topics.storage, "session": session,
                                         "config": BrokerConfig()})())
            admin = AdminService(topics, session, [shadow, compaction])
            response = await admin.GetShadowTopics(apb.TopicRequest(topic=str(TOPIC)),
                                                   AbortingContext())
            assert list(response.shadows) == []
            ctx = AbortingContext()
            with pytest.raises(grpc.aio.AbortError):
                await admin.GetCompactionStatus(apb.TopicRequest(topic=str(TOPIC)), ctx)
            assert ctx.code == grpc.StatusCode.NOT_FOUND and "never been compacted" in ctx.details
    arun(body())


class Answering(BrokerFeature):
    """A feature serving GetShadowTopics (unary) and WatchCompaction (a stream) itself."""

    name = "answering"

    def __init__(self):
        self.asked: list[str] = []

    def add_admin_rpcs(self, rpcs):
        rpcs.add("GetShadowTopics", self.shadows)
        rpcs.add("WatchCompaction", self.watch)

    async def shadows(self, request, context):
        self.asked.append(request.topic)
        return apb.ShadowTopicsResponse(shadows=["persistent://t/ns/answered"])

    async def watch(self, request, context):
        for job_id in ("j1", "j2"):
            yield apb.CompactionJob(job_id=job_id)


def test_a_feature_rpc_is_answered_by_the_handler_the_feature_added(tmp_path, arun):
    async def body():
        async with broker(tmp_path, []) as (_, topics, session):
            answering = Answering()
            admin = AdminService(topics, session, [answering])
            response = await admin.GetShadowTopics(apb.TopicRequest(topic=str(TOPIC)),
                                                   AbortingContext())
            assert list(response.shadows) == ["persistent://t/ns/answered"]
            assert answering.asked == [str(TOPIC)]
            jobs = [j.job_id async for j in admin.WatchCompaction(
                apb.TopicRequest(topic=str(TOPIC)), AbortingContext())]
            assert jobs == ["j1", "j2"]
            # the same feature's RPCs it did not add stay unanswered, with the reason
            ctx = AbortingContext()
            with pytest.raises(grpc.aio.AbortError):
                await admin.GetShadowSource(apb.TopicRequest(topic=str(TOPIC)), ctx)
            assert ctx.code == grpc.StatusCode.UNIMPLEMENTED
            assert ctx.details == ("GetShadowSource is not served by this broker (it runs "
                                   "without the shadow feature)")
    arun(body())


def test_a_streamed_feature_rpc_of_an_absent_feature_is_unimplemented_with_its_reason(
        tmp_path, arun):
    async def body():
        async with broker(tmp_path, []) as (_, topics, session):
            admin = AdminService(topics, session, [])
            ctx = AbortingContext()
            with pytest.raises(grpc.aio.AbortError):
                async for _ in admin.WatchCompaction(apb.TopicRequest(topic=str(TOPIC)), ctx):
                    pytest.fail("a stream of an absent feature yields nothing")
            assert ctx.code == grpc.StatusCode.UNIMPLEMENTED
            assert "WatchCompaction is not served" in ctx.details
            assert "without the compaction feature" in ctx.details
            assert dict(ctx.metadata)[errors.REASON_KEY] == errors.Unimplemented.reason
    arun(body())


def test_a_feature_adds_only_the_admin_rpcs_features_serve_and_each_once():
    rpcs = feature.AdminRpcs({"Compact": "compaction"})
    with pytest.raises(ValueError, match="CreateTopic is not an Admin RPC a feature serves"):
        rpcs.add("CreateTopic", Answering().shadows)
    rpcs.add("Compact", Answering().shadows)
    with pytest.raises(ValueError, match="Compact is added twice"):
        rpcs.add("Compact", Answering().shadows)
