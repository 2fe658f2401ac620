"""Every Admin RPC that names a subscription checks the name before it reads anything
(source/broker/subscription_admin.py): a missing or bad name is InvalidArgument, whatever the
topic, and no topic is looked up for it."""
from __future__ import annotations

import asyncio

import pytest

from shadowtopic.broker.subscription_admin import SubscriptionAdmin
from shadowtopic.core import errors
from shadowtopic.pb.v1 import admin_pb2 as apb
from shadowtopic.pb.v1 import common_pb2

TOPIC = "persistent://t/ns/names"


class NoTopics:
    """Fails the test if anything is looked up."""

    async def info(self, topic):
        raise AssertionError(f"{topic} was looked up before the subscription name was checked")


def calls(admin: SubscriptionAdmin, name: str):
    latest = common_pb2.StartPosition(latest=True)
    return {
        "create": admin.create(apb.CreateSubscriptionRequest(topic=TOPIC, subscription=name), None),
        "delete": admin.delete(apb.DeleteSubscriptionRequest(topic=TOPIC, subscription=name), None),
        "reset_cursor": admin.reset_cursor(apb.ResetCursorRequest(
            topic=TOPIC, subscription=name, position=latest), None),
        "skip": admin.skip(apb.SkipRequest(topic=TOPIC, subscription=name, count=1), None),
        "clear_backlog": admin.clear_backlog(apb.ClearBacklogRequest(
            topic=TOPIC, subscription=name), None),
    }


@pytest.mark.parametrize("name,message", [("", "a subscription name is required"),
                                          ("a/b", "subscription name")])
def test_a_call_naming_a_subscription_checks_the_name_first(name, message):
    admin = SubscriptionAdmin(NoTopics(), owner_answer=None)
    for _rpc, call in calls(admin, name).items():
        with pytest.raises(errors.InvalidArgument, match=message):
            asyncio.run(call)


def test_listing_subscriptions_names_none_and_looks_the_topic_up():
    admin = SubscriptionAdmin(NoTopics(), owner_answer=None)
    with pytest.raises(AssertionError, match="was looked up"):
        asyncio.run(admin.list(apb.ListSubscriptionsRequest(topic=TOPIC), None))
