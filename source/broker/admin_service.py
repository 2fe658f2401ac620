"""Admin service of a broker: topics, policies (a topic's, a namespace's), stats, lookup,
ledgers.

Topic metadata is in topic_admin.py, durable subscriptions in subscription_admin.py. The
RPCs of a feature (`FEATURE_RPCS`: shadow topics, shadow/feature.py; compaction,
compaction/feature.py) are answered by the handlers that feature added to this service's
`AdminRpcs` (source/broker/feature.py); on a broker assembled without that feature they
answer UNIMPLEMENTED, naming it. Tenants, namespaces and grants are access_admin.py's;
who may make each call is checked before the handler runs (source/broker/access_rules.py).
"""
from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.message import Message

from shadowtopic.broker import stats
from shadowtopic.broker.access_admin import AccessAdmin
from shadowtopic.broker.feature import AdminRpcs, BrokerFeature
from shadowtopic.broker.ownership import BrokerSession
from shadowtopic.broker.rpc import abort_stream, unary
from shadowtopic.broker.subscription_admin import SubscriptionAdmin
from shadowtopic.broker.topic import Topic
from shadowtopic.broker.topic_admin import TopicAdmin, api_kind, topic_metadata
from shadowtopic.broker.topics import TopicManager, read_only
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName, check_subscription, parse_namespace
from shadowtopic.core.policies import Policies
from shadowtopic.metadata.topic_info import role_of
from shadowtopic.pb.v1 import admin_pb2 as apb
from shadowtopic.pb.v1 import admin_pb2_grpc, common_pb2
from shadowtopic.security.dial import PLAINTEXT, Dial

PAGE_DEFAULT = PAGE_MAX = 1000  # topics per ListTopics page (a page stays far below 64 MiB)

#: the Admin RPCs features serve (admin.proto), with the feature that serves each
FEATURE_RPCS = {
    "CreateShadowTopic": "shadow", "DeleteShadowTopic": "shadow", "GetShadowTopics": "shadow",
    "GetShadowSource": "shadow",
    "Compact": "compaction", "GetCompactionStatus": "compaction", "WatchCompaction": "compaction",
}


def _page(names: list, page: common_pb2.PageRequest, key) -> tuple[list, str]:
    if page.page_size > PAGE_MAX:
        raise errors.InvalidArgument(f"page_size must be in 0..{PAGE_MAX} "
                                     f"(0 = {PAGE_DEFAULT}), got {page.page_size}")
    size = page.page_size or PAGE_DEFAULT
    start = [x for x in names if key(x) > page.page_token] if page.page_token else names
    chunk = start[:size]
    token = key(chunk[-1]) if len(start) > size else ""
    return chunk, token


def _feature_rpc(what: str):
    """A unary Admin RPC a feature serves: answered by the handler it added."""
    @unary
    async def handler(self, request, context):
        return await self.feature_rpcs.handler(what)(request, context)
    handler.__name__ = what
    return handler


def _feature_stream(what: str):
    """A server-streaming Admin RPC a feature serves: streamed by the handler it added."""
    async def handler(self, request, context):
        try:
            stream = self.feature_rpcs.handler(what)
        except errors.ShadowTopicError as exc:
            await abort_stream(context, exc)
        async for item in stream(request, context):
            yield item
    handler.__name__ = what
    return handler


class AdminService(admin_pb2_grpc.AdminServicer):
    def __init__(self, topics: TopicManager, session: BrokerSession,
                 features: Iterable[BrokerFeature] = (), dial: Dial = PLAINTEXT,
                 auto_namespaces: bool = True):
        self.topics = topics
        self.session = session
        self.features = list(features)
        self.owners = stats.OwnerChannels(dial)  # how it dials the other brokers
        self.topic_admin = TopicAdmin(topics, self.features, auto_namespaces)
        self.access = AccessAdmin(topics.store)
        self.subscriptions = SubscriptionAdmin(topics, self._owner_answer)
        self.feature_rpcs = AdminRpcs(FEATURE_RPCS)
        for f in self.features:
            f.add_admin_rpcs(self.feature_rpcs)

    # ---- topics ----------------------------------------------------------------------------

    @unary
    async def CreateTopic(self, request, context):
        topic = TopicName.parse(request.topic)
        info = await self.topic_admin.create(topic, request.partitions,
                                        Policies.from_pb(request.policies),
                                        dict(request.properties))
        return (await self.topic_admin.metadata([info]))[0]

    @unary
    async def DeleteTopic(self, request, context):
        await self.topic_admin.delete(TopicName.parse(request.topic), request.force)
        return apb.Empty()

    @unary
    async def ListTopics(self, request, context):
        ns = parse_namespace(request.namespace) if request.namespace else None
        infos = await self.topic_admin.list(ns)
        chunk, token = _page(infos, request.page, key=lambda i: i.name)
        return apb.ListTopicsResponse(topics=await self.topic_admin.metadata(chunk),
                                      next_page_token=token)

    @unary
    async def GetTopicMetadata(self, request, context):
        topic = TopicName.parse(request.topic)
        return topic_metadata(await self.topics.info(topic), await self.topics.policies(topic))

    @unary
    async def GetPolicies(self, request, context):
        return (await self.topics.policies(TopicName.parse(request.topic))).to_pb()

    @unary
    async def SetPolicies(self, request, context):
        topic = TopicName.parse(request.topic)
        return (await self.topic_admin.set_policies(topic,
                                                    Policies.from_pb(request.policies))).to_pb()

    # ---- namespaces -------------------------------------------------------------------------

    @unary
    async def GetNamespacePolicies(self, request, context):
        ns = parse_namespace(request.namespace)
        policies = await self.topic_admin.get_namespace_policies(ns)
        return apb.NamespacePolicies(namespace=ns, policies=policies.to_pb())

    @unary
    async def SetNamespacePolicies(self, request, context):
        ns = parse_namespace(request.namespace)
        policies = await self.topic_admin.set_namespace_policies(
            ns, Policies.from_pb(request.policies), list(request.remove))
        return apb.NamespacePolicies(namespace=ns, policies=policies.to_pb())

    async def _partitions(self, topic: TopicName) -> list[TopicName]:
        info = await self.topics.info(topic)
        if info.partitions:
            return [topic.partition(i) for i in range(info.partitions)]
        return [topic]

    # ---- stats: from the owner, never loading the topic ------------------------------------

    async def _owner_answer(self, topic: TopicName, context, method: str, request: Message
                            ) -> tuple[Topic | None, Message | None]:
        """Who answers a question about `topic`: (the Topic, None) when this broker owns it;
        (None, the owner's reply to `method`) when another live broker does; (None, None)
        when nobody does, the owner does not answer, or the call was forwarded here already
        (then etcd answers)."""
        t = self.topics.loaded(topic)
        if t is not None and not await self.topics.current(t):  # an incarnation deleted since
            t = None
        if t is not None or stats.forwarded(context):
            return t, None
        owner = await self.topics.owner(topic)
        if owner is None:
            info = await self.topics.info(topic)
            if not self.topics.serves(info):
                # a topic nobody serves yet, of a kind this broker does not open (a shadow
                # asked of a source broker): the broker that will serve it answers
                picked = await self.session.serving(topic, role_of(info))
                if picked is not None and picked.broker_id != self.session.broker_id:
                    return None, await self.owners.forward(picked.url, method, request)
        if owner is None or owner.broker_id == self.session.broker_id:
            return None, None
        return None, await self.owners.forward(owner.broker_url, method, request)

    async def _ledgers(self, topic: TopicName, t: Topic | None) -> stats.Ledgers:
        if t is not None:
            return stats.of_topic(t)
        info = await self.topics.info(topic)
        if info.source:  # nobody serves it: its ledgers are its source's (a shadow)
            topic = TopicName.parse(info.source)
        return await stats.stored(self.topics.store, self.topics.storage, self.topics.executor,
                                  topic)

    async def _partition_stats(self, part: TopicName, context,
                               reads_another: bool) -> apb.TopicStats:
        t, remote = await self._owner_answer(part, context, "GetTopicStats",
                                             apb.TopicRequest(topic=str(part)))
        if isinstance(remote, apb.TopicStats):  # (the owner's answer to GetTopicStats)
            return remote
        # a shadow loads only on a broker that serves shadows (asking never loads it here)
        if t is None and not reads_another and await self.topics.has_subscriptions(part):
            t = await self.topics.topic(part, fresh=True)  # cursors live with an owner: load
        ledgers = await self._ledgers(part, t)
        # a shadow stores nothing of its own (its ledgers are its source's: stats-internal)
        out = apb.TopicStats(storage_size=0 if reads_another else ledgers.size,
                             topic_epoch=ledgers.epoch)
        if t is not None:
            c = t.counters
            (out.msg_rate_in, out.msg_throughput_in, out.msg_rate_out,
             out.msg_throughput_out) = c.rates()
            out.msg_in_counter, out.bytes_in_counter = c.msg_in, c.bytes_in
            out.msg_out_counter, out.bytes_out_counter = c.msg_out, c.bytes_out
            out.owner_broker = self.session.url
            if t.subscriptions is not None:
                for name, d in t.subscriptions.stats().items():
                    out.subscriptions[name].CopyFrom(stats.subscription_stats(d))
            for f in self.features:
                f.topic_stats(t, out)
            for pub in t.producers:
                prin, ptin, _, _ = pub.counters.rates()
                out.publishers.add(producer_name=pub.producer_name, msg_rate_in=prin,
                                   msg_throughput_in=ptin, address=pub.address,
                                   connected_since=pub.connected_since)
        return out

    @unary
    async def GetTopicStats(self, request, context):
        topic = TopicName.parse(request.topic)
        info = await self.topics.info(topic)
        out = apb.TopicStats(topic=str(topic), kind=api_kind(info.kind), source=info.source)
        for part in await self._partitions(topic):
            stats.add_up(out, await self._partition_stats(part, context, bool(info.source)))
        if out.msg_in_counter:
            out.average_msg_size = out.bytes_in_counter / out.msg_in_counter
        return out

    @unary
    async def GetInternalStats(self, request, context):
        topic = TopicName.parse(request.topic)
        info = await self.topics.info(topic)
        t, remote = await self._owner_answer(topic, context, "GetInternalStats", request)
        if remote is not None:
            return remote
        ledgers = await self._ledgers(topic, t)
        last = ledgers.last()
        entries, size = ledgers.current()
        cursors = {}
        if t is not None and t.subscriptions is not None:
            ts = t.subscriptions
            for name, sub in ts.subs.items():
                cursors[name] = apb.CursorStats(
                    mark_delete_position=str(sub.cursor.mark_delete),
                    read_position=str(sub.position), messages_consumed_counter=sub.msg_out,
                    individually_deleted_messages=sub.ranges_text(),
                    cursor_flushes=ts.flusher.flushes, cursors_unsaved=ts.flusher.unsaved,
                    cohort_size=len(sub.cohort.members) if sub.cohort is not None else 1)
        out = apb.InternalStats(
            cursors=cursors, entry_cache=apb.EntryCacheStats(**self.topics.entry_cache.stats()),
            entries_added_counter=ledgers.entries + ledgers.entries_deleted,
            number_of_entries=ledgers.entries, total_size=ledgers.size,
            current_ledger_entries=entries, current_ledger_size=size,
            last_confirmed_entry=str(last) if last else "-1:-1",
            state="LedgerOpened" if t is not None else "Unloaded",
            ledgers=[stats.ledger_stats(i) for i in ledgers.infos])
        for f in self.features:
            await f.internal_stats(topic, info, out)
        return out

    @unary
    async def Lookup(self, request, context):
        topic = TopicName.parse(request.topic)
        info = await self.topics.info(topic)
        role = role_of(info)
        redirect = role not in self.session.roles
        owner = await self.session.owner_of(topic)
        if owner is None:  # nobody serves it yet: a broker of the topic's role will
            picked = await self.session.serving(topic, role)
            if picked is None:
                raise errors.ServiceUnavailable(f"no broker with the {role} role is "
                                                f"registered to serve {topic}")
            return apb.LookupResponse(broker_url=picked.url, broker_id=picked.broker_id,
                                      redirect=redirect or
                                      picked.broker_id != self.session.broker_id)
        if owner.broker_id == self.session.broker_id:  # ours (perhaps a dead incarnation's)
            return apb.LookupResponse(broker_url=self.session.url,
                                      broker_id=self.session.broker_id, epoch=owner.epoch)
        return apb.LookupResponse(broker_url=owner.broker_url, broker_id=owner.broker_id,
                                  epoch=owner.epoch, redirect=redirect)

    @unary
    async def RollLedger(self, request, context):
        t = await self.topics.writable(TopicName.parse(request.topic))
        info = await t.write_ledger().roll()
        return stats.ledger_stats(info) if info is not None else apb.LedgerStats()

    @unary
    async def Truncate(self, request, context):
        topic = TopicName.parse(request.topic)
        info = await self.topics.info(topic)
        if info.source:  # named as asked (a partitioned shadow's partitions are too)
            raise read_only(topic, info.source)
        resp = apb.TruncateResponse()
        for part in [topic.partition(i) for i in range(info.partitions)] or [topic]:
            t = await self.topics.writable(part)
            n, entries = await t.write_ledger().truncate()
            resp.ledgers_deleted += n
            resp.entries_deleted += entries
        return resp

    @unary
    async def GetLastMessageId(self, request, context):
        """The newest message's id (`0:0` when there is none). With `read_compacted`, as the
        compacted view sees it (K9: the last surviving message when the newest ones were
        compacted away): the same id until the topic has a compacted ledger; `DataLoss` when
        that ledger is unreadable and the answer would come from it (K17)."""
        topic = TopicName.parse(request.topic)
        if request.subscription:
            check_subscription(request.subscription)
        await self.topics.info(topic)
        t, remote = await self._owner_answer(topic, context, "GetLastMessageId", request)
        if remote is not None:
            return remote
        if request.read_compacted:  # as a compacted reader sees it (loads the topic here)
            last = (await self.topics.compacted_view(topic)).last_readable()
        else:
            last = t.ledger.last_confirmed() if t is not None else \
                (await self._ledgers(topic, None)).last()
        if last is None:
            return common_pb2.MessageIdData(ledger_id=0, entry_id=0)
        return last.with_partition(topic.partition_index).to_pb()

    # ---- subscriptions (subscription_admin.py) ---------------------------------------------

    @unary
    async def CreateSubscription(self, request, context):
        return await self.subscriptions.create(request, context)

    @unary
    async def DeleteSubscription(self, request, context):
        return await self.subscriptions.delete(request, context)

    @unary
    async def ListSubscriptions(self, request, context):
        names = await self.subscriptions.list(request, context)
        chunk, token = _page(names, request.page, key=lambda n: n)
        return apb.ListSubscriptionsResponse(subscriptions=chunk, next_page_token=token)

    @unary
    async def ResetCursor(self, request, context):
        return await self.subscriptions.reset_cursor(request, context)

    @unary
    async def Skip(self, request, context):
        return await self.subscriptions.skip(request, context)

    @unary
    async def ClearBacklog(self, request, context):
        return await self.subscriptions.clear_backlog(request, context)

    @unary
    async def PeekMessages(self, request, context):
        return await self.subscriptions.peek(request, context)

    # ---- features' RPCs (answered by the handlers the features added: FEATURE_RPCS) -------

    CreateShadowTopic = _feature_rpc("CreateShadowTopic")
    DeleteShadowTopic = _feature_rpc("DeleteShadowTopic")
    GetShadowTopics = _feature_rpc("GetShadowTopics")
    GetShadowSource = _feature_rpc("GetShadowSource")
    Compact = _feature_rpc("Compact")
    GetCompactionStatus = _feature_rpc("GetCompactionStatus")
    WatchCompaction = _feature_stream("WatchCompaction")

    # ---- permissions, tenants, namespaces (access_admin.py) --------------------------------

    @unary
    async def GrantPermission(self, request, context):
        await self.access.grant(request)
        return apb.Empty()

    @unary
    async def RevokePermission(self, request, context):
        await self.access.revoke(request)
        return apb.Empty()

    @unary
    async def GetPermissions(self, request, context):
        return await self.access.permissions(request)

    @unary
    async def CreateTenant(self, request, context):
        await self.access.create_tenant(request)
        return apb.Empty()

    @unary
    async def DeleteTenant(self, request, context):
        await self.access.delete_tenant(request)
        return apb.Empty()

    @unary
    async def ListTenants(self, request, context):
        return await self.access.list_tenants()

    @unary
    async def CreateNamespace(self, request, context):
        await self.access.create_namespace(request)
        return apb.Empty()

    @unary
    async def DeleteNamespace(self, request, context):
        await self.access.delete_namespace(request)
        return apb.Empty()

    @unary
    async def ListNamespaces(self, request, context):
        return await self.access.list_namespaces(request)

