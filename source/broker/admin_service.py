"""Admin service of the source broker: topics, policies, stats, lookup, ledgers.

Shadow topics, durable subscriptions, compaction and permissions are part of the contract
(proto/source/pb/v1/admin.proto) and answer UNIMPLEMENTED until their issues land.
"""
from __future__ import annotations

from source.broker.ownership import BrokerSession
from source.broker.rpc import abort_stream, unary
from source.broker.topics import TopicManager
from source.core import errors
from source.core.names import TopicName, parse_namespace
from source.core.policies import Policies
from source.pb.storage.v1 import metadata_pb2 as mpb
from source.pb.v1 import admin_pb2 as apb
from source.pb.v1 import admin_pb2_grpc, common_pb2

PAGE_DEFAULT = PAGE_MAX = 1000  # topics per ListTopics page (a page stays far below 64 MiB)


def topic_metadata(info: mpb.TopicInfo, policies: Policies | None = None) -> apb.TopicMetadata:
    eff = policies or Policies.from_pb(info.policies).effective()
    return apb.TopicMetadata(topic=info.name, kind=int(info.kind), partitions=info.partitions,
                             source=info.source, properties=dict(info.properties),
                             policies=eff.to_pb())


def ledger_stats(info: mpb.LedgerInfo) -> apb.LedgerStats:
    return apb.LedgerStats(ledger_id=info.ledger_id, entries=info.entries, size=info.size_bytes,
                           state=mpb.LedgerState.Name(info.state),
                           path=info.path or info.wal_path, created_time=info.created_ms,
                           sealed_time=info.sealed_ms)


def _page(names: list, page: common_pb2.PageRequest, key) -> tuple[list, str]:
    if page.page_size > PAGE_MAX:
        raise errors.InvalidArgument(f"page_size must be in 0..{PAGE_MAX} "
                                     f"(0 = {PAGE_DEFAULT}), got {page.page_size}")
    size = page.page_size or PAGE_DEFAULT
    start = [x for x in names if key(x) > page.page_token] if page.page_token else names
    chunk = start[:size]
    token = key(chunk[-1]) if len(start) > size else ""
    return chunk, token


def _not_yet(what: str):
    @unary
    async def handler(self, request, context):
        raise errors.Unimplemented(f"{what} is not implemented yet")
    handler.__name__ = what
    return handler


class AdminService(admin_pb2_grpc.AdminServicer):
    def __init__(self, topics: TopicManager, session: BrokerSession):
        self.topics = topics
        self.session = session

    # ---- topics ----------------------------------------------------------------------------

    @unary
    async def CreateTopic(self, request, context):
        topic = TopicName.parse(request.topic)
        info = await self.topics.create(topic, request.partitions,
                                        Policies.from_pb(request.policies),
                                        dict(request.properties))
        return topic_metadata(info)

    @unary
    async def DeleteTopic(self, request, context):
        await self.topics.delete(TopicName.parse(request.topic), request.force)
        return apb.Empty()

    @unary
    async def ListTopics(self, request, context):
        ns = parse_namespace(request.namespace) if request.namespace else None
        infos = await self.topics.list(ns)
        chunk, token = _page(infos, request.page, key=lambda i: i.name)
        return apb.ListTopicsResponse(topics=[topic_metadata(i) for i in chunk],
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
        return (await self.topics.set_policies(topic, Policies.from_pb(request.policies))).to_pb()

    async def _partitions(self, topic: TopicName) -> list[TopicName]:
        info = await self.topics.info(topic)
        if info.partitions:
            return [topic.partition(i) for i in range(info.partitions)]
        return [topic]

    @unary
    async def GetTopicStats(self, request, context):
        topic = TopicName.parse(request.topic)
        info = await self.topics.info(topic)
        stats = apb.TopicStats(topic=str(topic), kind=int(info.kind), source=info.source)
        for part in await self._partitions(topic):
            ml = await self.topics.ledger(part)
            c = self.topics.counters_for(part)
            rin, tin, rout, tout = c.rates()
            stats.msg_rate_in += rin
            stats.msg_throughput_in += tin
            stats.msg_rate_out += rout
            stats.msg_throughput_out += tout
            stats.msg_in_counter += c.msg_in
            stats.bytes_in_counter += c.bytes_in
            stats.msg_out_counter += c.msg_out
            stats.bytes_out_counter += c.bytes_out
            stats.storage_size += ml.storage_size()
            stats.topic_epoch = max(stats.topic_epoch, ml.epoch)
            for pub in self.topics.publishers.get(part, ()):
                prin, ptin, _, _ = pub.counters.rates()
                stats.publishers.add(producer_name=pub.producer_name, msg_rate_in=prin,
                                     msg_throughput_in=ptin, address=pub.address,
                                     connected_since=pub.connected_since)
        stats.owner_broker = self.session.url
        if stats.msg_in_counter:
            stats.average_msg_size = stats.bytes_in_counter / stats.msg_in_counter
        return stats

    @unary
    async def GetInternalStats(self, request, context):
        topic = TopicName.parse(request.topic)
        ml = await self.topics.ledger(topic)
        ledgers = ml.ledgers()
        last = ml.last_confirmed()
        lid, entries, size = ml.current_ledger
        number = ml.number_of_entries()
        return apb.InternalStats(
            entries_added_counter=number + ml.entries_deleted, number_of_entries=number,
            total_size=ml.storage_size(), current_ledger_entries=entries,
            current_ledger_size=size, last_confirmed_entry=str(last) if last else "-1:-1",
            state="LedgerOpened", ledgers=[ledger_stats(i) for i in ledgers])

    @unary
    async def Lookup(self, request, context):
        topic = TopicName.parse(request.topic)
        await self.topics.info(topic)
        owner = await self.session.owner_of(topic)
        if owner is None:
            return apb.LookupResponse(broker_url=self.session.url,
                                      broker_id=self.session.broker_id)
        return apb.LookupResponse(broker_url=owner.broker_url, broker_id=owner.broker_id,
                                  epoch=owner.epoch)

    @unary
    async def RollLedger(self, request, context):
        ml = await self.topics.ledger(TopicName.parse(request.topic))
        info = await ml.roll()
        return ledger_stats(info) if info is not None else apb.LedgerStats()

    @unary
    async def Truncate(self, request, context):
        resp = apb.TruncateResponse()
        for part in await self._partitions(TopicName.parse(request.topic)):
            ml = await self.topics.ledger(part)
            n, entries = await ml.truncate()
            resp.ledgers_deleted += n
            resp.entries_deleted += entries
        return resp

    @unary
    async def GetLastMessageId(self, request, context):
        topic = TopicName.parse(request.topic)
        ml = await self.topics.ledger(topic)
        last = ml.last_confirmed()
        if last is None:
            return common_pb2.MessageIdData(ledger_id=0, entry_id=0, partition=-1)
        return last.with_partition(topic.partition_index).to_pb()

    # ---- later issues ----------------------------------------------------------------------

    CreateShadowTopic = _not_yet("CreateShadowTopic")
    DeleteShadowTopic = _not_yet("DeleteShadowTopic")
    GetShadowTopics = _not_yet("GetShadowTopics")
    GetShadowSource = _not_yet("GetShadowSource")
    CreateSubscription = _not_yet("CreateSubscription")
    DeleteSubscription = _not_yet("DeleteSubscription")
    ListSubscriptions = _not_yet("ListSubscriptions")
    ResetCursor = _not_yet("ResetCursor")
    Skip = _not_yet("Skip")
    ClearBacklog = _not_yet("ClearBacklog")
    PeekMessages = _not_yet("PeekMessages")
    Compact = _not_yet("Compact")
    GetCompactionStatus = _not_yet("GetCompactionStatus")
    GrantPermission = _not_yet("GrantPermission")
    RevokePermission = _not_yet("RevokePermission")
    GetPermissions = _not_yet("GetPermissions")

    async def WatchCompaction(self, request, context):
        await abort_stream(context, errors.Unimplemented("WatchCompaction is not implemented yet"))
