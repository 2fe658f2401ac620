"""TopicManager: the topics this broker owns, loaded on first use and dropped on close.

A topic is `TopicInfo` under /topics/<path>/info plus its ledger list (metadata CRUD:
source/broker/topic_admin.py). Topics load lazily: the first produce or read of a topic takes
its ownership and opens it through the `TopicBuilder` (source/broker/builder.py) into a
`Topic` (source/broker/topic.py). Asking about a topic (stats, last id) never loads it.

A topic that reads another's ledgers (a shadow: `TopicInfo.source` is set) is read-only:
writes (`writable`: produce, roll, truncate) are refused before anything of it loads. It
opens only on a broker with a feature that serves its kind (shadow/feature.py on a shadow
broker); elsewhere loading it is refused.

Namespace policies (source/metadata/namespace_policies.py): one follower per broker
(`start`); when a namespace's policies change, every loaded topic of it takes its effective
policies anew, a topic that was opening meanwhile included.

Loads run in a task of their own, shared by every caller asking for the same topic; an
unload waits for its close to finish before the topic can load again. A fenced topic (lease
lost, ownership taken) is dropped and closed; the next request loads it afresh.

Incarnations: a topic deleted and created again under the same name is a new incarnation
(its generation: the info key's etcd create revision). A load checks the generation once
more after the topic opened; every open of a producer, consumer or reader (and the admin
calls on subscriptions) checks that a loaded topic is still the current incarnation
(`fresh`: one etcd read, shared by the opens that arrive before it starts), and one that
is not is retired (its consumers hear `TopicNotFound` "was deleted") before the current one
loads. So once a delete or create returns, no broker serves the old incarnation to a new
client, even before its watch hears of the delete.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from shadowtopic.broker.builder import TopicBuilder
from shadowtopic.broker.feature import BrokerFeature
from shadowtopic.broker.ownership import BrokerSession
from shadowtopic.broker.rates import TopicCounters
from shadowtopic.broker.topic import Topic
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import Policies
from shadowtopic.cursors.snapshot import SnapshotCursorStore
from shadowtopic.ledger.dedup import DEFAULT_IDLE_S as DEDUP_IDLE_S
from shadowtopic.ledger.entry_cache import DEFAULT_BYTES, EntryCache
from shadowtopic.ledger.object_wal import ObjectWal
from shadowtopic.ledger.storage import Storage
from shadowtopic.ledger.view import CompactedReads, LedgerView
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import MetadataStore
from shadowtopic.metadata.namespace_policies import NamespaceFollower
from shadowtopic.metadata.topic_info import (
    effective_policies,
    generation_of,
    read_incarnation,
    read_info,
)
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.read.encodings import EncodingsPool

log = logging.getLogger(__name__)

POLICY_READS = 32  # topics whose policies are read at once after a namespace's changed


def read_only(topic: TopicName | str, source: str) -> errors.ShadowTopicError:
    """What a write to a shadow (produce, roll, truncate) gets."""
    return errors.NotAllowed(f"topic {topic} is a read-only shadow of {source}")


class GenerationReads:
    """Reads of topics' generations in etcd, shared: every open that arrives before a read of
    its topic has started waits for that read, so a burst of opens (100,000 subscribes of
    one topic) costs a few etcd reads, not one each; an open never takes the answer of a
    read that started before it arrived (it would miss a create that returned meanwhile)."""

    def __init__(self, store: MetadataStore):
        self.store = store
        self._next: dict[TopicName, asyncio.Future] = {}  # reads not started yet
        self._tasks: set[asyncio.Task] = set()

    async def read(self, topic: TopicName) -> int:
        fut = self._next.get(topic)
        if fut is None:
            fut = self._next[topic] = asyncio.get_running_loop().create_future()
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved
            task = asyncio.get_running_loop().create_task(self._run(topic, fut))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(fut)

    async def _run(self, topic: TopicName, fut: asyncio.Future) -> None:
        await asyncio.sleep(0)  # the opens of this turn of the loop join
        if self._next.get(topic) is fut:
            del self._next[topic]  # the read starts now: later opens wait for another
        try:
            fut.set_result(await generation_of(self.store, topic))
        except Exception as exc:  # noqa: BLE001 - every waiter gets it
            fut.set_exception(exc)


class TopicManager:
    def __init__(self, store: MetadataStore, storage: Storage, session: BrokerSession,
                 cursor_flush_interval: float = 1.0, entry_cache_bytes: int = DEFAULT_BYTES,
                 features: list[BrokerFeature] | None = None,
                 dedup_idle_seconds: float = DEDUP_IDLE_S,
                 wal_objects: ObjectWal | None = None):
        self.store = store
        self.storage = storage
        self.session = session
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ledger-io")
        # the open ledgers' seal-ahead steps (source/ledger/seal_ahead.py): threads of their
        # own, so steps of busy topics never queue the WAL's fsyncs behind them
        self.ahead_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="seal-ahead")
        self.cursors = SnapshotCursorStore(store, storage, self.executor)
        self.cursor_flush_interval = cursor_flush_interval
        # one memory budget for the entries of every topic (source/ledger/entry_cache.py)
        self.entry_cache = EntryCache(entry_cache_bytes)
        # the entries' encodings, shared by every view of the same ledgers (a source's
        # shadows here too: source/read/encodings.py)
        self.encodings = EncodingsPool()
        self.features = list(features or ())
        self.builder = TopicBuilder(store, storage, session, self.executor, self.entry_cache,
                                    self.cursors, cursor_flush_interval, self.features,
                                    dedup_idle_seconds, self.encodings, wal_objects,
                                    self.ahead_executor)
        self.builder.on_fenced = self._on_fenced
        self.builder.on_retired = self._on_retired
        self._retiring: set[asyncio.Task] = set()
        self._generations = GenerationReads(store)
        self._loaded: dict[TopicName, Topic] = {}
        self._loading: dict[TopicName, asyncio.Future] = {}
        self._closing: dict[TopicName, asyncio.Task] = {}
        # namespace policies: a change reaches every loaded topic of the namespace
        self.namespaces = NamespaceFollower(store, self.namespaces_changed)
        self._following: asyncio.Task | None = None

    def start(self) -> None:
        """Follow the namespaces' policies (until `close`), retrying while etcd is away."""
        self._following = asyncio.get_running_loop().create_task(
            self.namespaces.start_retrying())

    async def namespaces_changed(self, namespaces: set[str] | None) -> None:
        """The policies of `namespaces` (None: any) changed: each loaded topic of them takes
        its effective policies anew (a topic deleted meanwhile keeps the ones it has)."""
        todo = [t for t in self._loaded.values()
                if namespaces is None or t.name.namespace_name in namespaces]

        async def refresh(t: Topic) -> None:
            try:
                t.set_policies(await effective_policies(self.store, t.name))
            except errors.TopicNotFound:
                pass
        for i in range(0, len(todo), POLICY_READS):  # a few etcd reads at a time
            results = await asyncio.gather(*map(refresh, todo[i:i + POLICY_READS]),
                                           return_exceptions=True)
            failed = next((r for r in results if isinstance(r, BaseException)), None)
            if failed is not None:
                raise failed  # the follower offers the change again

    # ---- metadata (never loads a topic) ----------------------------------------------------

    async def info(self, topic: TopicName) -> mpb.TopicInfo:
        return await read_info(self.store, topic)

    async def policies(self, topic: TopicName) -> Policies:
        """Effective policies (a partition follows its parent; every topic its namespace)."""
        return await effective_policies(self.store, topic)

    async def has_subscriptions(self, topic: TopicName) -> bool:
        snap = await self.store.get_prefix(keys.subscriptions_prefix(topic))
        return bool(snap.items)

    async def owner(self, topic: TopicName) -> mpb.Ownership | None:
        """Who owns `topic` now (from etcd), or None."""
        return await self.session.owner_of(topic)

    # ---- owned topics ----------------------------------------------------------------------

    async def topic(self, topic: TopicName, fresh: bool = False) -> Topic:
        """The owned topic, taking ownership and opening it on first use. `fresh` (every
        open of a producer, consumer or reader, and the admin calls on subscriptions): check
        with etcd first that a loaded topic is still the name's incarnation; one that was
        deleted, or deleted and created again, is retired and the current one loads."""
        t = self._loaded.get(topic)
        if t is not None and (not fresh or await self.current(t)):
            return t
        while topic in self._closing:  # a close of this topic is finishing: wait for it
            await asyncio.gather(self._closing[topic], return_exceptions=True)
            t = self._loaded.get(topic)
            if t is not None:
                return t
        task = self._loading.get(topic)
        if task is None:
            # the load runs in a task of its own: a caller that is cancelled while waiting
            # (its stream ended) neither stops it nor hands its cancellation to the others
            task = asyncio.get_running_loop().create_task(self._load(topic))
            self._loading[topic] = task
            task.add_done_callback(functools.partial(self._load_done, topic))
        return await asyncio.shield(task)

    async def writable(self, topic: TopicName, fresh: bool = False) -> Topic:
        """The owned topic for a write (produce, roll, truncate): a shadow is refused
        (`NotAllowed`, read-only) before anything of it loads. `fresh` as for `topic`."""
        t = self._loaded.get(topic)
        if t is not None and fresh and not await self.current(t):
            t = None
        if t is None:
            info = await self.info(topic)
            if info.source:
                raise read_only(topic, info.source)
            t = await self.topic(topic)
        if t.writer is None:
            raise read_only(topic, str(t.ledger.ledgers_of))
        return t

    async def _load(self, topic: TopicName) -> Topic:
        info, generation = await read_incarnation(self.store, topic)
        if info.partitions:
            raise errors.InvalidArgument(
                f"{topic} is partitioned ({info.partitions} partitions): use "
                f"{topic}-partition-<i>")
        seen = self.namespaces.changes(topic.namespace_name)
        t = await self.builder.build(topic, info, generation)
        self._loaded[topic] = t
        if self.namespaces.changes(topic.namespace_name) != seen:  # changed while it opened
            try:
                t.set_policies(await effective_policies(self.store, topic))
            except errors.TopicNotFound:
                pass  # deleted meanwhile: `current` retires it below
        if not await self.current(t):  # deleted (or created again) while it opened
            raise errors.ServiceUnavailable(f"{topic} was deleted or created again while it "
                                            "loaded; try again")
        return t

    # ---- incarnations ----------------------------------------------------------------------

    async def current(self, t: Topic) -> bool:
        """Whether loaded `t` is still its name's incarnation in etcd; if not, retire it."""
        if await self._generations.read(t.name) == t.generation:
            return True
        await self.retire(t)
        return False

    def _on_retired(self, t: Topic) -> None:
        """`t`'s info key is gone or holds another incarnation (its watch says so)."""
        task = asyncio.get_running_loop().create_task(self.retire(t))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def retire(self, t: Topic) -> None:
        """`t`'s incarnation was deleted: its consumers hear so, its cursors are not saved
        again and their files go (while this broker still owns the name), and it closes,
        giving up ownership. A load of the name meanwhile waits for that to finish."""
        if self._loaded.get(t.name) is t:
            del self._loaded[t.name]
            log.info("%s: incarnation %d was deleted: retiring it", t.name, t.generation)
            gone = errors.TopicNotFound(f"topic {t.name} was deleted")

            async def close() -> None:
                try:
                    if t.subscriptions is not None:
                        await t.subscriptions.close(gone, flush=False)
                    await self.cursors.purge(t.name)
                    await t.close(gone)
                finally:
                    self._closing.pop(t.name, None)
            self._closing[t.name] = asyncio.get_running_loop().create_task(close())
        task = self._closing.get(t.name)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    def _load_done(self, topic: TopicName, task: asyncio.Task) -> None:
        self._loading.pop(topic, None)
        if not task.cancelled():
            task.exception()  # retrieved here: every waiter gets it through its shield

    async def view(self, topic: TopicName) -> LedgerView:
        """The topic's `LedgerView` (what the read engine resolves a topic to)."""
        return (await self.topic(topic)).ledger

    async def compacted_view(self, topic: TopicName) -> CompactedReads:
        """The topic's view for `read_compacted` readers (the compaction feature's)."""
        return await (await self.topic(topic)).compacted_view()

    def serves(self, info: mpb.TopicInfo) -> bool:
        """Whether this broker opens topics of `info`'s kind (a shadow: only a broker with
        the shadow role and feature)."""
        return info.kind in self.builder.openers

    def loaded(self, topic: TopicName) -> Topic | None:
        return self._loaded.get(topic)

    def loaded_topics(self) -> list[Topic]:
        return list(self._loaded.values())

    def counters_for(self, topic: TopicName) -> TopicCounters:
        """The delivery counters of an owned topic (a throwaway set once it is unloaded)."""
        t = self._loaded.get(topic)
        return t.counters if t is not None else TopicCounters()

    def on_sealed(self, callback: Callable[[Topic], None]) -> None:
        """Call `callback` after each seal of an owned source topic (retention runs then)."""
        self.builder.on_sealed = callback

    async def unload(self, topic: TopicName, reason: errors.ShadowTopicError | None = None
                     ) -> None:
        """Close this broker's `topic` and give up ownership (its consumers hear `reason`).
        A load of the same topic meanwhile waits for the close to finish."""
        t = self._loaded.pop(topic, None)
        if t is not None:
            self._start_close(t, reason)
        task = self._closing.get(topic)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    def _start_close(self, t: Topic, reason: errors.ShadowTopicError | None = None) -> None:
        async def close() -> None:
            try:
                await t.close(reason)
            finally:
                self._closing.pop(t.name, None)
        self._closing[t.name] = asyncio.get_running_loop().create_task(close())

    def _on_fenced(self, t: Topic) -> None:
        """A fenced topic (lease lost, ownership taken) is dropped; the next request for it
        loads it afresh (taking ownership again if it can)."""
        if self._loaded.get(t.name) is t:
            del self._loaded[t.name]
            self._start_close(t)

    def fence_all(self) -> None:
        """The broker lease is gone: nothing may be acknowledged any more."""
        for name, t in list(self._loaded.items()):
            t.ledger.fence(errors.Fenced(f"{name}: broker lease lost"))

    async def close(self) -> None:
        await self.namespaces.close()
        if self._following is not None:
            self._following.cancel()
            await asyncio.gather(self._following, return_exceptions=True)
        for topic in list(self._loaded):
            await self.unload(topic)
        self.executor.shutdown(wait=True)
        self.ahead_executor.shutdown(wait=True)
        log.info("entry cache: %s", self.entry_cache.describe())
