"""Durable subscriptions over a `LedgerView`: cursors, the four types, acks, redelivery."""
from source.subscriptions.consumer import ActiveChanged, CursorMoved, SubConsumer
from source.subscriptions.dispatcher import EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED, TYPES
from source.subscriptions.subscription import Subscription
from source.subscriptions.topic import Change, TopicSubscriptions

__all__ = ["EXCLUSIVE", "FAILOVER", "KEY_SHARED", "SHARED", "TYPES", "ActiveChanged", "Change",
           "CursorMoved", "SubConsumer", "Subscription", "TopicSubscriptions"]
