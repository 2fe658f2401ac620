"""What a loaded shadow topic has on a shadow broker besides its view: its published need
(shadow/needs.py).

A shadow deleted through another broker is retired here by the broker core, as any topic
(the `InfoWatch` of source/broker/builder.py); its need stops when its view closes, and the
need's key is removed by its source's next retention (shadow/feature.py).
"""
from __future__ import annotations

from typing import Protocol

from source.broker.topic import Topic
from source.core import errors
from source.core.names import TopicName
from source.ledger.view import Trimmed

from shadow.needs import NeedsPublisher, ShadowNeed


class Feature(Protocol):
    """What a served shadow asks of the shadow feature (shadow/feature.py)."""

    def needs(self) -> NeedsPublisher: ...


class Served:
    """What a loaded shadow topic has on a shadow broker besides its Topic: its published
    need. A `ViewListener` of the topic's view: the need stops when the view closes
    (unload, fencing, retirement)."""

    def __init__(self, feature: Feature, shadow: TopicName, source: TopicName, t: Topic):
        self.feature = feature
        self.shadow = shadow
        self.source = source
        self.topic = t
        self.need: ShadowNeed | None = None

    def start_need(self) -> None:
        if self.topic.subscriptions is not None:
            own = self.topic.ownership
            self.need = self.feature.needs().track(self.shadow, self.source,
                                                   (own.key, own.value),
                                                   self.topic.subscriptions)

    def stop_need(self) -> None:
        if self.need is not None:
            self.feature.needs().untrack(self.need)
        self.need = None

    # ---- ViewListener ----------------------------------------------------------------------

    def on_entries(self) -> None:
        pass

    def on_trimmed(self, trimmed: Trimmed) -> None:
        pass

    def on_closed(self, reason: errors.ShadowTopicError) -> None:
        self.stop_need()
