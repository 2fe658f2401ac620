"""Durable subscriptions over a `LedgerView`: cursors, the four types, acks, redelivery."""
from shadowtopic.subscriptions.consumer import ActiveChanged, CursorMoved, SubConsumer
from shadowtopic.subscriptions.dispatcher import EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED, TYPES
from shadowtopic.subscriptions.subscription import Subscription
from shadowtopic.subscriptions.topic import Change, TopicSubscriptions

__all__ = ["EXCLUSIVE", "FAILOVER", "KEY_SHARED", "SHARED", "TYPES", "ActiveChanged", "Change",
           "CursorMoved", "SubConsumer", "Subscription", "TopicSubscriptions"]
