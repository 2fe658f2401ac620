"""The Admin RPCs on durable subscriptions: create, delete, list, reset-cursor, skip,
clear-backlog, peek (the admin service delegates here; protobuf turns into domain types at
this edge).

Subscriptions live with their topic's owner: a call is answered by this broker when it owns
the topic (loading it when nobody does), or forwarded to the owner. A partitioned topic's
call applies to every partition (peek needs a partition, as in Pulsar).
"""
from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable
from typing import TypeAlias

from google.protobuf.message import Message

from shadowtopic.broker.consumer_service import start_from_pb
from shadowtopic.broker.topic import Topic
from shadowtopic.broker.topics import TopicManager
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName, check_subscription
from shadowtopic.pb.v1 import admin_pb2 as apb
from shadowtopic.pb.v1 import common_pb2
from shadowtopic.read.positions import LATEST, Start
from shadowtopic.subscriptions import Change, TopicSubscriptions

#: (topic, context, method, request) -> (owned Topic | None, the owner's reply | None)
OwnerAnswer = Callable[..., Awaitable[tuple[Topic | None, Message | None]]]


def change_pb(ch: Change) -> apb.SubscriptionChange:
    return apb.SubscriptionChange(mark_delete_position=str(ch.mark_delete), msg_backlog=ch.backlog,
                                  entries_acked=ch.acked, consumers=ch.consumers,
                                  dry_run=ch.dry_run)


def add_change(total: apb.SubscriptionChange, part: apb.SubscriptionChange) -> None:
    total.mark_delete_position = part.mark_delete_position
    total.msg_backlog += part.msg_backlog
    total.entries_acked += part.entries_acked
    total.consumers += part.consumers
    total.dry_run = part.dry_run


#: the requests that name a subscription (every subscription call but ListSubscriptions)
Named: TypeAlias = (apb.CreateSubscriptionRequest | apb.DeleteSubscriptionRequest
                   | apb.ResetCursorRequest | apb.SkipRequest | apb.ClearBacklogRequest
                   | apb.PeekMessagesRequest)


class SubscriptionAdmin:
    def __init__(self, topics: TopicManager, owner_answer: OwnerAnswer):
        self.topics = topics
        self._owner_answer = owner_answer

    async def _parts(self, topic: TopicName) -> list[TopicName]:
        info = await self.topics.info(topic)
        return [topic.partition(i) for i in range(info.partitions)] if info.partitions \
            else [topic]

    async def _each_named(self, request: Named, context, method: str, act):
        """`_each` for a request that names a subscription: the name is checked first."""
        TopicName.parse(request.topic)  # a bad topic is reported before a bad name
        if not request.subscription:
            raise errors.InvalidArgument("a subscription name is required")
        check_subscription(request.subscription)
        return await self._each(request, context, method, act)

    async def _each(self, request, context, method: str, act):
        """Run `act(TopicSubscriptions)` on every partition (here or at its owner); yields
        each partition's answer (protobuf)."""
        topic = TopicName.parse(request.topic)
        out = []
        for part in await self._parts(topic):
            req = type(request)()
            req.CopyFrom(request)
            req.topic = str(part)
            t, remote = await self._owner_answer(part, context, method, req)
            if remote is None:
                if t is None:
                    t = await self.topics.topic(part, fresh=True)
                if t.subscriptions is None:  # (every topic a broker loads has them)
                    raise errors.Internal(f"{part} was loaded without its subscriptions")
                remote = await act(t.subscriptions)
            out.append(remote)
        return out

    async def create(self, request, context) -> apb.Empty:
        # a message id is where the subscription starts (that message first); `latest` is
        # after the newest message, as Pulsar's MessageId.latest and `consume -p latest`
        start = start_from_pb(request.start, True) if request.HasField("start") \
            else Start(LATEST)
        if start.kind == LATEST:
            start = Start(LATEST)

        async def act(ts: TopicSubscriptions):
            await ts.create(request.subscription, start)
            return apb.Empty()
        await self._each_named(request, context, "CreateSubscription", act)
        return apb.Empty()

    async def delete(self, request, context) -> apb.SubscriptionChange:
        async def act(ts: TopicSubscriptions):
            return change_pb(await ts.delete(request.subscription, request.force,
                                             request.dry_run))
        return self._sum(await self._each_named(request, context, "DeleteSubscription", act))

    async def list(self, request, context) -> list[str]:
        async def act(ts: TopicSubscriptions):
            return apb.ListSubscriptionsResponse(subscriptions=sorted(ts.subs))
        names: set[str] = set()
        for resp in await self._each(request, context, "ListSubscriptions", act):
            names.update(resp.subscriptions)
        return sorted(names)

    async def reset_cursor(self, request, context) -> apb.ResetCursorResponse:
        if not request.HasField("position"):
            raise errors.InvalidArgument("reset-cursor needs a position (message id or time)")
        start = start_from_pb(request.position, True)

        async def act(ts: TopicSubscriptions):
            pos, clamped = await ts.reset_cursor(request.subscription, start, request.dry_run)
            return apb.ResetCursorResponse(position=pos.to_pb(), clamped=clamped)
        answers = await self._each_named(request, context, "ResetCursor", act)
        out = apb.ResetCursorResponse()
        out.CopyFrom(answers[-1])
        out.clamped = any(a.clamped for a in answers)
        return out

    async def skip(self, request, context) -> apb.SubscriptionChange:
        if request.count <= 0:
            raise errors.InvalidArgument("skip needs a count of at least 1")

        async def act(ts: TopicSubscriptions):
            return change_pb(await ts.skip(request.subscription, request.count,
                                           request.dry_run))
        return self._sum(await self._each_named(request, context, "Skip", act))

    async def clear_backlog(self, request, context) -> apb.SubscriptionChange:
        async def act(ts: TopicSubscriptions):
            return change_pb(await ts.clear_backlog(request.subscription, request.dry_run))
        return self._sum(await self._each_named(request, context, "ClearBacklog", act))

    async def peek(self, request, context) -> apb.PeekMessagesResponse:
        """The first unacknowledged entries (their raw bytes are passed on, not decoded)."""
        topic = TopicName.parse(request.topic)
        if len(await self._parts(topic)) > 1:
            raise errors.InvalidArgument(f"{topic} is partitioned: peek one partition "
                                         f"({topic}-partition-<i>)")
        count = request.count or 1
        if count > 1000:
            raise errors.InvalidArgument(f"peek count must be in 1..1000, got {count}")

        async def act(ts: TopicSubscriptions):
            entries = await ts.peek(request.subscription, count)
            return apb.PeekMessagesResponse(entries=[common_pb2.EncodedEntry(
                ledger_id=e.ledger_id, entry_id=e.entry_id, publish_time=e.publish_ms,
                raw=e.raw) for e in entries])
        return (await self._each_named(request, context, "PeekMessages", act))[0]

    @staticmethod
    def _sum(answers: builtins.list[apb.SubscriptionChange]) -> apb.SubscriptionChange:
        out = apb.SubscriptionChange()
        for a in answers:
            add_change(out, a)
        return out

