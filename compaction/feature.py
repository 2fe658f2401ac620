"""The compaction feature: everything about compaction a broker does, in one place (the jobs
themselves run in the compaction worker, compaction/worker.py, which meets the brokers only
through etcd and the storage root).

- the Admin RPCs `Compact`, `GetCompactionStatus`, `WatchCompaction` (compaction/admin.py:
  the owner seals the open ledger and files a request and a job record in one etcd txn);
- `read_compacted` reads: each topic gets, on its first compacted read, a `CompactedView`
  (compaction/view.py) that follows the compaction pointer of the topic whose ledgers it
  reads (a shadow follows its source's, K10) and serves the compacted ledger
  (compaction/ledger.py) up to the horizon, then the raw entries; the views of one source
  on a broker open its compacted ledger once (`OpenedLedgers`, compaction/opened.py);
- retention keeps what compaction has not read yet (`retention_keep`), as Pulsar's
  compaction cursor does, and the threshold trigger runs after each retention pass;
- the compacted ledger a topic is read by, in its internal stats.

The compacted-ledger reader and the view live here, not in the broker core, although both
brokers (source and shadow) serve compacted reads: a broker serves them because it is
assembled with this feature, and the core reaches the view only through the `CompactedReads`
seam (source/ledger/view.py). The ledger format module is shared with the worker, which
writes what this feature reads.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

import grpc

from shadowtopic.broker.feature import AdminRpcs, BrokerFeature, BrokerHost
from shadowtopic.broker.rpc import abort_stream, unary
from shadowtopic.broker.topic import Topic
from shadowtopic.compaction.admin import CompactionAdmin, job_pb
from shadowtopic.compaction.opened import OpenedLedgers
from shadowtopic.compaction.view import CompactedView, CompactionFollower, open_ledger
from shadowtopic.core import errors
from shadowtopic.core.errors import MetadataUnavailable, typed
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import Policies
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys
from shadowtopic.metadata.migrate import migrate
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import admin_pb2 as apb

log = logging.getLogger(__name__)


def _cancelling() -> bool:
    """True when the running task itself has been asked to cancel."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class LazyCompactedView:
    """A topic's compacted view, opened on its first compacted read (the follower starts
    then) and shared by every later one; a failed start is tried again by the next read."""

    def __init__(self, host: BrokerHost, t: Topic, ledgers: OpenedLedgers):
        self.host = host
        self.topic = t
        self.ledgers = ledgers  # the broker's, shared with its other topics' views
        self._started: asyncio.Task | None = None  # -> CompactionFollower

    async def __call__(self) -> CompactedView:
        """The view, on the newest compaction pointer: a compacted read opened after a job
        is DONE reads that job's ledger (read your writes), whatever the watch has told."""
        started = self._started
        fresh = started is None  # the follower's start reads the pointer itself
        if started is None:
            topics = self.host.topics
            follower = CompactionFollower(self.host.store, self.host.storage, topics.executor,
                                          self.topic.ledger.ledgers_of, self.topic.ledger,
                                          name=self.topic.name, ledgers=self.ledgers)

            async def start() -> CompactionFollower:
                await follower.start()
                return follower
            started = self._started = asyncio.get_running_loop().create_task(start())
        try:
            follower = await asyncio.shield(started)
            if not fresh:
                await follower.refresh()
            return follower.view
        except asyncio.CancelledError:
            if started.cancelled() and not _cancelling():  # the topic closed meanwhile
                raise errors.TopicNotOwned(f"{self.topic.name} is closing on this broker") \
                    from None
            raise
        except BaseException:
            if started.done() and self._started is started:
                self._started = None  # the next reader tries again
            raise

    async def close(self) -> None:
        task, self._started = self._started, None
        if task is not None:
            if not task.done():
                task.cancel()
            follower = (await asyncio.gather(task, return_exceptions=True))[0]
            if isinstance(follower, CompactionFollower):
                await follower.close()


class CompactionFeature(BrokerFeature):
    name = "compaction"

    def __init__(self) -> None:
        self._host: BrokerHost | None = None
        self._admin: CompactionAdmin | None = None
        self._ledgers: OpenedLedgers | None = None
        self._migration: asyncio.Task | None = None

    def bind(self, host: BrokerHost) -> None:
        self._host = host
        self._admin = CompactionAdmin(host.topics, host.session.cluster)
        self._ledgers = OpenedLedgers(host.storage, host.topics.executor, open_ledger)

    @property
    def host(self) -> BrokerHost:
        """The broker this feature serves (`bind` runs before any other hook)."""
        if self._host is None:
            raise errors.Internal(f"the {self.name} feature is used before it is bound")
        return self._host

    @property
    def ledgers(self) -> OpenedLedgers:
        """The compacted ledgers open on this broker (made by `bind`)."""
        if self._ledgers is None:
            raise errors.Internal(f"the {self.name} feature is used before it is bound")
        return self._ledgers

    @property
    def admin(self) -> CompactionAdmin:
        """The broker's side of compaction requests and status (made by `bind`)."""
        if self._admin is None:
            raise errors.Internal(f"the {self.name} feature is used before it is bound")
        return self._admin

    async def start(self) -> None:
        self._migration = asyncio.get_running_loop().create_task(self._migrate())

    async def close(self) -> None:
        if self._migration is not None:
            self._migration.cancel()
            await asyncio.gather(self._migration, return_exceptions=True)

    async def ready(self, timeout: float = 5.0) -> None:
        """Wait for the job records' migration (a compaction RPC reads or writes them)."""
        if self._migration is None or self._migration.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._migration), timeout)
        except TimeoutError:
            raise MetadataUnavailable("compaction job records are being migrated to their "
                                      "new keys; try again") from None

    async def _migrate(self, retry_delay: float = 1.0) -> None:
        """Move job records of an older key layout (source/metadata/migrate.py), retried
        while etcd is unavailable (the broker serves meanwhile)."""
        while True:
            try:
                moved = await migrate(self.host.store)
                if moved:
                    log.info("moved %d compaction job records to their new keys", moved)
                return
            except MetadataUnavailable as exc:
                log.info("compaction job records not migrated yet: %s", exc)
                await asyncio.sleep(retry_delay)

    async def open_topic(self, t: Topic, info: mpb.TopicInfo, stack: AsyncExitStack) -> None:
        view = LazyCompactedView(self.host, t, self.ledgers)
        t.compacted = view
        stack.push_async_callback(view.close)

    async def retention_keep(self, t: Topic, policies: Policies) -> MessageId | None:
        """What compaction has not read yet (as Pulsar's compaction cursor holds it): the
        messages after the compaction horizon, of a topic that is compacted (it has a
        pointer) or is about to be (a request waits, or a threshold policy); else None."""
        store = self.host.store
        kv = await store.get(keys.compaction(t.name))
        if kv is None:
            if policies.compaction_threshold_bytes or t.name in self.admin.filing:
                return MessageId(0, 0)
            requested = await store.get(keys.compaction_request(self.admin.cluster, t.name))
            return MessageId(0, 0) if requested else None
        h = mpb.CompactionPointer.FromString(kv.value).horizon
        return MessageId(h.ledger_id, h.entry_id + 1)

    async def after_retention(self, t: Topic) -> None:
        await self.admin.check_threshold(t.name, t)

    async def topic_deleted(self, topic: TopicName) -> None:
        """The deleted topic's compacted ledgers go with it (no reader is left: its readers
        were closed and a source with shadows is not deleted). A job that was running
        writes its output after this; the worker collects that once the job fails."""
        self.host.storage.delete_dir(Storage.topic_compacted_dir(topic))

    async def internal_stats(self, topic: TopicName, info: mpb.TopicInfo,
                             out: apb.InternalStats) -> None:
        """The compacted ledger `topic` is read by (a shadow's: its source's)."""
        of = TopicName.parse(info.source) if info.source else topic
        kv = await self.host.store.get(keys.compaction(of))
        if kv is not None:
            pointer = mpb.CompactionPointer.FromString(kv.value)
            out.compacted_ledger = pointer.manifest_path or pointer.job_id

    def add_admin_rpcs(self, rpcs: AdminRpcs) -> None:
        CompactionRpcs(self.admin, self.ready).add_to(rpcs)


class CompactionRpcs:
    """The compaction RPCs of the Admin service."""

    def __init__(self, admin: CompactionAdmin, ready: Callable[[], Awaitable[None]]):
        self.admin = admin
        self.ready = ready  # the job records are where these RPCs read them

    def add_to(self, rpcs: AdminRpcs) -> None:
        rpcs.add("Compact", self.Compact)
        rpcs.add("GetCompactionStatus", self.GetCompactionStatus)
        rpcs.add("WatchCompaction", self.WatchCompaction)

    @unary
    async def Compact(self, request, context):
        await self.ready()
        return apb.CompactResponse(job_id=await self.admin.compact(TopicName.parse(request.topic)))

    @unary
    async def GetCompactionStatus(self, request, context):
        await self.ready()
        return job_pb(await self.admin.status(TopicName.parse(request.topic)))

    async def WatchCompaction(self, request, context):
        try:
            await self.ready()
            async for job in self.admin.watch(TopicName.parse(request.topic)):
                yield job_pb(job)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - the server keeps serving others
            await abort_stream(context, typed(exc, "WatchCompaction"))
