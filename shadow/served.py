"""What a loaded shadow topic has on a shadow broker besides its view: its published need
(shadow/needs.py).

A shadow deleted through another broker is retired here by the broker core, as any topic
(the `InfoWatch` of source/broker/builder.py); its need stops as it closes, and the need's
key is removed then (or, if etcd is away then, by its source's next retention).
"""
from __future__ import annotations

import logging
from typing import Protocol

from shadowtopic.broker.topic import Topic
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.view import Trimmed
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import Compare, Delete, MetadataStore
from shadowtopic.shadow.needs import NeedsPublisher, ShadowNeed

log = logging.getLogger(__name__)


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

    async def close(self, store: MetadataStore) -> None:
        """The topic closes: stop the need; a deleted shadow's (it was retired: its info
        key is gone) is removed too, while the shadow does not exist (a need write checks
        that the shadow exists, so none lands after this)."""
        self.stop_need()
        if isinstance(self.topic.close_reason, errors.TopicNotFound):
            try:
                await store.txn([Compare(keys.topic_info(self.shadow), "version", "==", 0)],
                                [Delete(keys.shadow_needs(self.source, self.shadow))])
            except errors.MetadataUnavailable as exc:  # the source's retention removes it
                log.info("%s: need of the deleted shadow not removed: %s", self.shadow, exc)

    # ---- ViewListener ----------------------------------------------------------------------

    def on_entries(self) -> None:
        pass

    def on_trimmed(self, trimmed: Trimmed) -> None:
        pass

    def on_closed(self, reason: errors.ShadowTopicError) -> None:
        self.stop_need()
