"""Durable subscriptions over a `LedgerView`: cursors, the four types, acks, redelivery."""
from source.subscriptions.subscription import (EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED, TYPES,
                                               ActiveChanged, CursorMoved, SubConsumer,
                                               Subscription)
from source.subscriptions.topic import Change, TopicSubscriptions

__all__ = ["EXCLUSIVE", "FAILOVER", "KEY_SHARED", "SHARED", "TYPES", "ActiveChanged", "Change",
           "CursorMoved", "SubConsumer", "Subscription", "TopicSubscriptions"]
