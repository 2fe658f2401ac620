"""`TopicBuilder`: the one way a topic opens on a broker, for every kind of topic.

    1. ownership: the topic's ownership key under this broker's lease, with a new epoch
       (source/broker/ownership.py);
    2. the view: a source opens its `ManagedLedger` (recovering and sealing a previous
       owner's open ledgers); a topic of another kind opens through the feature that serves
       that kind (`BrokerFeature.openers`: a shadow's `ShadowLedger`);
    3. the `Topic` and its `TopicSubscriptions` object;
    4. each feature's `open_topic` (the compacted view, ...);
    5. the durable subscriptions and their cursors load;
    6. each feature's `topic_ready` (a source's replicators, a shadow's need, ...);
    7. the topic's info key is followed (`InfoWatch`): deleted through any broker, or
       deleted and created again, the topic is retired here (`on_retired`: the
       `TopicManager` closes it; its consumers hear `TopicNotFound` "was deleted").

A topic opens as one incarnation of its name (its generation: the etcd create revision of
its info key). Every cursor and subscription write of the opened topic is fenced on both its
ownership and its generation, so nothing of an incarnation deleted meanwhile (or deleted
and created again) is ever written into the next one.

A topic whose view closes by itself (fenced: this broker's lease lapsed, or another broker
took the topic) is dropped by the `TopicManager` at once, whatever its kind, and the next
request opens it anew: a shadow fenced during an etcd outage is followed again once etcd is
back, never served from a closed view.

Every step pushes what undoes it onto one `AsyncExitStack`: when a step fails, the steps
before it are undone in reverse order (ownership released last) and the error reaches the
caller; when all succeed the stack moves into the Topic, and `Topic.close` unwinds it the
same way (consumers hear the reason; cursors are flushed once more on a close, not after a
failed open).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Executor
from contextlib import AsyncExitStack

from shadowtopic.broker.feature import BrokerFeature, ViewOpener
from shadowtopic.broker.ownership import BrokerSession
from shadowtopic.broker.topic import Ownership, Topic, ledger_config
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.cursors.snapshot import SnapshotCursorStore
from shadowtopic.cursors.store import Fence
from shadowtopic.ledger.dedup import DEFAULT_IDLE_S as DEDUP_IDLE_S
from shadowtopic.ledger.entry_cache import EntryCache
from shadowtopic.ledger.managed import LedgerConfig, ManagedLedger
from shadowtopic.ledger.object_wal import ObjectWal
from shadowtopic.ledger.storage import Storage
from shadowtopic.ledger.view import ServedView, Trimmed
from shadowtopic.ledger.wal_restore import opener
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import MetadataStore
from shadowtopic.metadata.follow import KeyFollower
from shadowtopic.metadata.topic_info import SOURCE, decode_info, effective_policies
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.read.encodings import EncodingsPool
from shadowtopic.subscriptions import TopicSubscriptions

log = logging.getLogger(__name__)


class ClosedWatch:
    """A `ViewListener` that hears only that its view closed."""

    def __init__(self, on_closed: Callable[[errors.ShadowTopicError], None]):
        self._on_closed = on_closed

    def on_entries(self) -> None:
        pass

    def on_trimmed(self, trimmed: Trimmed) -> None:
        pass

    def on_closed(self, reason: errors.ShadowTopicError) -> None:
        self._on_closed(reason)


class InfoWatch:
    """Follows a loaded topic's info key: once it is gone, or holds another incarnation
    (another `created_ms`: a delete and a create can reach a watch as one batch), `on_gone`
    is called, once."""

    def __init__(self, store: MetadataStore, topic: TopicName, info: mpb.TopicInfo,
                 on_gone: Callable[[], None]):
        self.created_ms = info.created_ms
        self.gone = False
        self._on_gone = on_gone
        self.follower = KeyFollower(store, keys.topic_info(topic), self._on_info)

    def _on_info(self, value: bytes | None, revision: int) -> None:
        if self.gone:
            return
        if value is None or decode_info(value).created_ms != self.created_ms:
            self.gone = True
            self._on_gone()


class TopicBuilder:
    def __init__(self, store: MetadataStore, storage: Storage, session: BrokerSession,
                 executor: Executor, entry_cache: EntryCache, cursors: SnapshotCursorStore,
                 cursor_flush_interval: float, features: list[BrokerFeature],
                 dedup_idle_seconds: float = DEDUP_IDLE_S,
                 encodings: EncodingsPool | None = None,
                 wal_objects: ObjectWal | None = None,
                 ahead_executor: Executor | None = None):
        self.store = store
        self.storage = storage
        self.session = session
        self.executor = executor
        self.ahead_executor = ahead_executor  # open ledgers' seal-ahead steps
        self.entry_cache = entry_cache
        self.cursors = cursors
        self.cursor_flush_interval = cursor_flush_interval
        self.features = features
        self.dedup_idle_seconds = dedup_idle_seconds
        self.encodings = encodings if encodings is not None else EncodingsPool()
        self.wal_objects = wal_objects  # the WAL on object storage, or None (local)
        self.open_object = opener(storage.s3)  # reads WAL objects (a restore)
        self._openers: dict[int, ViewOpener] | None = None
        #: set by the TopicManager: a source's sealed ledger, a fenced writer
        self.on_sealed: Callable[[Topic], None] = lambda t: None
        self.on_fenced: Callable[[Topic], None] = lambda t: None
        self.on_retired: Callable[[Topic], None] = lambda t: None

    @property
    def openers(self) -> dict[int, ViewOpener]:
        """How each kind of topic this broker serves opens (asked of the features once they
        are bound to the broker)."""
        if self._openers is None:
            self._openers = {SOURCE: self._open_source}
            for f in self.features:
                self._openers.update(f.openers())
        return self._openers

    async def refuse(self, topic: TopicName, info: mpb.TopicInfo) -> None:
        """Raise when this broker serves no topic of `info`'s kind: `NotAllowed`, or, for a
        topic a broker of its kind has served (it has an ownership epoch), the retriable
        `ServiceUnavailable`: that broker is away for now (restarting), not missing."""
        if info.kind not in self.openers:
            kind = mpb.TopicKind.Name(info.kind).lower()
            where = (f"topic {topic} is a {kind} of {info.source}: {kind} topics are served "
                     f"by a {kind} broker")
            if await self.store.get(keys.epoch_counter(topic)) is not None:
                raise errors.ServiceUnavailable(f"{where}, and the one serving it is not "
                                                "available now; try again")
            raise errors.NotAllowed(f"{where}, not by this source broker")

    async def build(self, topic: TopicName, info: mpb.TopicInfo, generation: int) -> Topic:
        """Open incarnation `generation` of `topic` (described by `info`) on this broker, as
        the module doc says."""
        await self.refuse(topic, info)
        policies = await effective_policies(self.store, topic)
        opened = False
        async with AsyncExitStack() as stack:
            key, value, epoch = await self.session.acquire(topic)
            stack.push_async_callback(self.session.release, key, value)
            own = Ownership(key, value, epoch)
            view: ServedView = await self.openers[info.kind](topic, info, own)
            stack.push_async_callback(view.close)
            writer = view if isinstance(view, ManagedLedger) else None
            t = Topic(topic, view, policies, own, writer, generation)
            if writer is not None:  # rolls follow the topic's policies from its first append
                writer.config = ledger_config(policies, writer.config)
            fence = Fence(key, value, keys.topic_info(topic), generation)
            subs = t.subscriptions = TopicSubscriptions(
                topic, view, self.store, self.cursors, fence, lambda: t.policies,
                t.counters, self.cursor_flush_interval, self.encodings)
            for f in self.features:
                await f.open_topic(t, info, stack)
            await subs.load(t.compacted_view if t.compacted is not None else None)

            async def close_subscriptions() -> None:
                await subs.close(t.close_reason, flush=opened)
            stack.push_async_callback(close_subscriptions)
            for f in self.features:
                await f.topic_ready(t, info, stack)
            if writer is not None:
                writer.on_sealed = lambda _info: self.on_sealed(t)
            # a view that closes by itself (fenced: the lease was lost, another broker took
            # the topic) drops the topic, whatever its kind: the next request opens it anew
            closed = ClosedWatch(lambda _reason: self.on_fenced(t))
            view.add_listener(closed)
            stack.callback(view.remove_listener, closed)
            watch = InfoWatch(self.store, topic, info, lambda: self.on_retired(t))
            await watch.follower.start()
            stack.push_async_callback(watch.follower.close)
            t.stack = stack.pop_all()
            opened = True
        log.info("loaded %s (epoch %d, %d ledgers)", topic, epoch, len(view.ledgers()),
                 extra={"topic": str(topic), "epoch": epoch})
        return t

    async def _open_source(self, topic: TopicName, info: mpb.TopicInfo,
                           own: Ownership) -> ManagedLedger:
        if self.session.held.refuses(topic):  # given up lately (load shedding)
            other = await self.session.serving(topic, "source")
            if other is not None and other.broker_id != self.session.broker_id:
                raise errors.TopicNotOwned(f"{topic} was moved off this broker (load "
                                           f"shedding); look it up again")
        return await ManagedLedger.open(topic, self.store, self.storage, own.key, own.value,
                                        own.epoch, self.executor,
                                        LedgerConfig(dedup_idle_s=self.dedup_idle_seconds),
                                        lease_ok=self.session.lease_ok,
                                        entry_cache=self.entry_cache,
                                        wal_objects=self.wal_objects,
                                        open_object=self.open_object,
                                        ahead_executor=self.ahead_executor)
