"""What a loaded shadow topic has on a shadow broker besides its view: its published need
(shadow/needs.py) and the follower of its info key.

The info key is followed (list-then-watch, source/metadata/follow.py): a shadow deleted
through another broker (`topics delete-shadow-topic` removes its keys in one txn) is
unloaded here too. Its consumers get `TopicNotFound`; its subscriptions close without a
cursor flush, its cursor files go and its ownership is released; then one txn, only while
the info key is still absent, removes what a cursor flush or subscribe in flight may have
written under the shadow's prefix after the delete, and its need.
"""
from __future__ import annotations

import logging
from typing import Coroutine, Protocol

from source.broker.feature import Topics
from source.broker.topic import Topic
from source.core import errors
from source.core.names import TopicName
from source.ledger.view import Trimmed
from source.metadata import keys
from source.metadata.base import Compare, Delete, MetadataStore

from source.metadata.follow import KeyFollower
from shadow.needs import NeedsPublisher, ShadowNeed

log = logging.getLogger(__name__)


class Feature(Protocol):
    """What a served shadow asks of the shadow feature (shadow/feature.py)."""

    def spawn(self, coro: Coroutine, name: str) -> None: ...

    def needs(self) -> NeedsPublisher: ...


class Served:
    """What a loaded shadow topic has on a shadow broker besides its Topic: its published
    need and the follower of its info key. A `ViewListener` of the topic's view: both stop
    when the view closes (unload, fencing)."""

    def __init__(self, feature: Feature, topics: Topics, store: MetadataStore,
                 shadow: TopicName, source: TopicName, t: Topic):
        self.feature = feature
        self.topics = topics
        self.store = store
        self.shadow = shadow
        self.source = source
        self.topic = t
        self.seen = False       # the info key was there when the follower listed it
        self.deleted = False
        self.need: ShadowNeed | None = None
        self.follower = KeyFollower(store, keys.topic_info(shadow), self._on_info)

    # ---- the info key ----------------------------------------------------------------------

    def _on_info(self, value: bytes | None, revision: int) -> None:
        if value is not None:
            self.seen = True
        elif not self.deleted:
            self.deleted = True
            self.feature.spawn(self.unload_deleted(), f"unload deleted {self.shadow}")

    async def unload_deleted(self) -> None:
        """The shadow was deleted (its info key is gone): unload it here."""
        t = self.topic
        here = self.topics.loaded(self.shadow) is t  # else: unloaded meanwhile (a delete
        gone = errors.TopicNotFound(f"topic {self.shadow} was deleted")  # handled here)
        self.stop_need()
        if here:
            log.info("%s was deleted: unloading it", self.shadow)
            try:
                if t.subscriptions is not None:  # consumers stop; cursors are not saved again
                    await t.subscriptions.close(gone, flush=False)
                await self.topics.cursors.purge(self.shadow)  # still owned: nobody else's
            except Exception as exc:  # noqa: BLE001 - the unload goes on
                log.warning("%s: closing after its deletion: %s", self.shadow, exc)
            await self.topics.unload(self.shadow, gone)  # releases the ownership
        try:
            # keys under the prefix of a topic without info are leftovers (what a cursor
            # flush or a subscribe in flight wrote after the delete; after the release no
            # fenced write of this broker can land), and so is its need
            await self.store.txn(
                [Compare(keys.topic_info(self.shadow), "version", "==", 0)],
                [Delete(keys.topic_prefix(self.shadow), prefix=True),
                 Delete(keys.shadow_needs(self.source, self.shadow))])
        except Exception as exc:  # noqa: BLE001 - best effort
            log.warning("%s: cleaning up after its deletion failed: %s", self.shadow, exc)

    # ---- the need --------------------------------------------------------------------------

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
        self.feature.spawn(self.follower.close(), f"stop following {self.shadow}")
