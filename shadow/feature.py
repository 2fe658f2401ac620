"""The shadow feature: everything about shadow topics (PIP-180) a broker does, in one place.

On every broker (both sides of a shadow):

- the shadow RPCs of the Admin service (create, delete, list, source of: shadow/admin.py),
  and the deletion of a shadow through `topics delete`;
- a source topic with shadows cannot be deleted (`HasShadowTopics`): `delete_guard`;
- on the broker that owns a source topic: one `ShadowReplicator` per shadow
  (shadow/replicators.py, shadow/replicator.py), started as the topic opens and stopped
  with it; their numbers in the topic's stats (`shadowReplication`);
- retention of a source keeps what its shadows' durable subscriptions still need, when
  its policy `retention_keeps_shadow_backlog` says so (`retention_keep`).

On a broker with the role `shadow` (`python -m shadowtopic.shadow.broker`), also:

- shadow topics open here, as a `ShadowLedger` over the source's ledgers (shadow/ledger.py);
  the broker core runs the same subscriptions and readers over that view;
- the Replication service (shadow/replication.py), the receiving end of the replicators;
- for each served shadow, its published need (shadow/needs.py, shadow/served.py); a shadow
  deleted through another broker is retired by the broker core, as every topic.
"""
from __future__ import annotations

import logging
from contextlib import AsyncExitStack

import grpc

from shadowtopic.broker.feature import AdminRpcs, BrokerFeature, BrokerHost, ViewOpener
from shadowtopic.broker.rpc import unary
from shadowtopic.broker.shedding import Shedder
from shadowtopic.broker.topic import Ownership, Topic
from shadowtopic.broker.topic_admin import topic_metadata
from shadowtopic.core import errors
from shadowtopic.core.errors import error_status
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import Policies
from shadowtopic.ledger import retention
from shadowtopic.metadata import keys, namespace_policies
from shadowtopic.metadata.base import Compare, Delete, KeyValue
from shadowtopic.metadata.topic_info import SHADOW
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import admin_pb2 as apb
from shadowtopic.pb.v1 import replication_pb2_grpc
from shadowtopic.shadow.admin import ShadowAdmin
from shadowtopic.shadow.ledger import ShadowLedger
from shadowtopic.shadow.metrics import replication_metrics
from shadowtopic.shadow.needs import INTERVAL_S, NeedsPublisher
from shadowtopic.shadow.replication import Inbound, ReplicationService
from shadowtopic.shadow.replicators import Channels, TopicReplicators
from shadowtopic.shadow.served import Served

log = logging.getLogger(__name__)

ROLE = "shadow"


def replicator_stats(d: dict) -> apb.ReplicatorStats:
    """A shadow replicator's numbers (ShadowReplicator.stats) as the protobuf message."""
    d = dict(d)
    err = d.pop("last_error")
    out = apb.ReplicatorStats(**d)
    if err is not None:
        out.last_error.CopyFrom(error_status(err))
    return out


def refuse_shadows(topic: TopicName, kv: KeyValue | None) -> None:
    shadows = list(mpb.ShadowList.FromString(kv.value).shadows) if kv is not None else []
    if shadows:
        raise errors.HasShadowTopics(
            f"{topic} has shadow topics: {', '.join(shadows)}; delete them first")


class ShadowFeature(BrokerFeature):
    name = "shadow"

    def __init__(self) -> None:
        self._host: BrokerHost | None = None
        self._admin: ShadowAdmin | None = None
        # to the brokers of this broker's sources' shadows, dialled as the broker's config says
        self.channels = Channels(lambda: self.host.config.dial())
        self.inbound = Inbound()  # what its shadows' stats say of their replication
        self._replicators: dict[Topic, TopicReplicators] = {}
        self._publisher: NeedsPublisher | None = None
        self.shedder: Shedder | None = None  # load shedding, on a shadow broker

    def bind(self, host: BrokerHost) -> None:
        self._host = host
        self._admin = ShadowAdmin(host.topics, not host.config.auth.authorization)

    @property
    def host(self) -> BrokerHost:
        """The broker this feature serves (`bind` runs before any other hook)."""
        if self._host is None:
            raise errors.Internal(f"the {self.name} feature is used before it is bound")
        return self._host

    @property
    def admin(self) -> ShadowAdmin:
        """Shadow creation, deletion and listing (made by `bind`)."""
        if self._admin is None:
            raise errors.Internal(f"the {self.name} feature is used before it is bound")
        return self._admin

    @property
    def serving(self) -> bool:
        """Whether this broker serves shadow topics (it has the shadow role)."""
        return ROLE in self.host.config.roles

    async def start(self) -> None:
        if self.serving:
            self.shedder = Shedder(self.host, ROLE, self.host.config.load_shedding_interval,
                                   victims=self._shadows)
            self.shedder.start()

    def _shadows(self) -> list[Topic]:
        """The shadows loaded here: what load shedding may give up."""
        return [t for t in self.host.topics.loaded_topics() if isinstance(t.ledger, ShadowLedger)]

    async def close(self) -> None:
        if self.shedder is not None:
            await self.shedder.close()
        if self._publisher is not None:
            await self._publisher.close()
        await self.channels.close()

    # ---- the needs publisher --------------------------------------------------------------

    def needs(self) -> NeedsPublisher:
        if self._publisher is None:
            topics = self.host.topics
            self._publisher = NeedsPublisher(
                topics.store, max(INTERVAL_S, 2 * topics.cursor_flush_interval))
        return self._publisher

    # ---- topics ----------------------------------------------------------------------------

    def openers(self) -> dict[int, ViewOpener]:
        return {SHADOW: self._open} if self.serving else {}

    async def _open(self, topic: TopicName, info: mpb.TopicInfo,
                    own: Ownership) -> ShadowLedger:
        if self.host.session.held.refuses(topic):
            raise errors.TopicNotOwned(f"{topic} was moved off this broker (load shedding); "
                                       f"look it up again")
        topics = self.host.topics
        return await ShadowLedger.open(topic, TopicName.parse(info.source), topics.store,
                                       topics.storage, topics.executor,
                                       entry_cache=topics.entry_cache,
                                       dial=self.host.config.dial())

    async def topic_ready(self, t: Topic, info: mpb.TopicInfo, stack: AsyncExitStack) -> None:
        if t.writer is not None:
            await self._replicate(t, info, stack)
        elif isinstance(t.ledger, ShadowLedger):
            await self._serve(t, info, stack)

    async def _replicate(self, t: Topic, info: mpb.TopicInfo, stack: AsyncExitStack) -> None:
        """A source topic: one replicator per shadow, following the source's shadow list."""
        host = self.host
        own = t.ownership
        replicators = TopicReplicators(
            t.name, info, t.ledger, host.store, host.session.cluster,
            lambda: (own.key, own.value, own.epoch),
            lambda: t.policies.replicator_auto_reset_backlog_entries or 0,
            self.channels, host.session.picks).start()
        self._replicators[t] = replicators
        stack.callback(self._replicators.pop, t, None)
        stack.push_async_callback(replicators.close)

    async def _serve(self, t: Topic, info: mpb.TopicInfo, stack: AsyncExitStack) -> None:
        """A shadow topic: publish its need (a shadow deleted elsewhere is retired by the
        broker core, as every topic)."""
        served = Served(self, t.name, TopicName.parse(info.source), t)
        t.ledger.add_listener(served)
        served.start_need()
        stack.push_async_callback(served.close, self.host.store)

    async def retention_keep(self, t: Topic, policies: Policies) -> MessageId | None:
        if not policies.retention_keeps_shadow_backlog:
            return None
        return await self._shadow_needs(t.name)

    async def _shadow_needs(self, topic: TopicName) -> MessageId | None:
        """The earliest position the durable subscriptions of `topic`'s shadows still need
        (source/ledger/retention.py): every need under `keys.shadow_needs_prefix` in one
        read, counted for the shadows the source lists now (of a partition: partition i of
        each shadow of its parent). A deleted shadow's need is ignored and removed."""
        store = self.host.store
        snap = await store.get_prefix(keys.shadow_needs_prefix(topic))
        if not snap.items:
            return None
        parent = topic.partitioned_parent
        kv = await store.get(keys.shadows(parent or topic))
        listed = mpb.ShadowList.FromString(kv.value).shadows if kv is not None else ()
        current = {TopicName.parse(s).partition(topic.partition_index) if parent is not None
                   else TopicName.parse(s) for s in listed}
        needs = [(keys.shadow_from_needs_key(topic, item.key), item) for item in snap.items]
        for shadow, item in needs:
            if shadow is not None and shadow not in current:
                try:  # left by a deleted shadow: removed, unless the shadow exists again
                    await store.txn(
                        [Compare(item.key, "mod_revision", "==", item.mod_revision),
                         Compare(keys.topic_info(shadow), "version", "==", 0)],
                        [Delete(item.key)])
                except errors.MetadataUnavailable as exc:
                    log.info("%s: need of deleted shadow %s not removed: %s", topic, shadow,
                             exc)
        return retention.shadow_keep_from(((s, item.value) for s, item in needs), current)

    def topic_stats(self, t: Topic, out: apb.TopicStats) -> None:
        """A source's replicators, each under its shadow's name; a shadow's incoming
        replication under its source's name (not connected: it cannot follow now)."""
        replicators = self._replicators.get(t)
        if replicators is not None:
            for name, d in replicators.stats().items():
                out.shadow_replication[name].CopyFrom(replicator_stats(d))
        if isinstance(t.ledger, ShadowLedger):
            d = self.inbound.stats(str(t.name), t.ledger)
            out.shadow_replication[str(t.ledger.source)].CopyFrom(replicator_stats(d))

    def metrics(self):
        """The replication series of this broker's sources (shadow/metrics.py)."""
        return replication_metrics(self.host.config.cluster, list(self._replicators.values()))

    # ---- deleting --------------------------------------------------------------------------

    def kinds(self) -> set[int]:
        return {SHADOW}

    async def delete_topic(self, topic: TopicName, info: mpb.TopicInfo, force: bool) -> None:
        await self.admin.delete(topic, force)

    async def delete_guard(self, topic: TopicName, info: mpb.TopicInfo) -> list[Compare]:
        """A source with shadows is not deleted; the delete holds only while the shadow
        list is as read (a shadow created meanwhile stops it)."""
        kv = await self.host.store.get(keys.shadows(topic))
        refuse_shadows(topic, kv)
        return [Compare(keys.shadows(topic), "mod_revision", "==",
                        kv.mod_revision if kv is not None else 0)]

    # ---- services --------------------------------------------------------------------------

    def add_services(self, server: grpc.aio.Server) -> list[str]:
        if not self.serving:
            return []
        replication_pb2_grpc.add_ReplicationServicer_to_server(
            ReplicationService(self.host.topics, self.host.config.cluster, self.inbound,
                               self.host.authz),
            server)
        return ["shadowtopic.v1.Replication"]

    def add_admin_rpcs(self, rpcs: AdminRpcs) -> None:
        ShadowRpcs(self.admin).add_to(rpcs)


class ShadowRpcs:
    """The shadow topic RPCs of the Admin service."""

    def __init__(self, admin: ShadowAdmin):
        self.admin = admin

    def add_to(self, rpcs: AdminRpcs) -> None:
        rpcs.add("CreateShadowTopic", self.CreateShadowTopic)
        rpcs.add("DeleteShadowTopic", self.DeleteShadowTopic)
        rpcs.add("GetShadowTopics", self.GetShadowTopics)
        rpcs.add("GetShadowSource", self.GetShadowSource)

    @unary
    async def CreateShadowTopic(self, request, context):
        shadow = TopicName.parse(request.shadow)
        info = await self.admin.create(shadow, TopicName.parse(request.source),
                                       dict(request.properties))
        return topic_metadata(info, namespace=await namespace_policies.read(
            self.admin.store, shadow.namespace_name))

    @unary
    async def DeleteShadowTopic(self, request, context):
        await self.admin.delete(TopicName.parse(request.topic))
        return apb.Empty()

    @unary
    async def GetShadowTopics(self, request, context):
        return apb.ShadowTopicsResponse(
            shadows=await self.admin.shadows(TopicName.parse(request.topic)))

    @unary
    async def GetShadowSource(self, request, context):
        return apb.ShadowSourceResponse(
            source=await self.admin.source_of(TopicName.parse(request.topic)))
