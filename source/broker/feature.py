"""The broker's feature seam: what a feature (shadow topics, compaction) adds to a broker.

The broker core (this package) serves source topics: produce, reads, durable subscriptions,
retention, topic metadata, stats, lookup. A `BrokerFeature` adds the rest, each in one home
of its own (shadow/feature.py, compaction/feature.py), and is passed in where a broker
process is assembled: `python -m shadowtopic.broker` and `python -m shadowtopic.shadow.broker` build
the features named by `--features` (default: every one installed, found through the
`shadowtopic.broker_features` entry points in pyproject.toml), so `source` imports no
feature. A feature may add, each optional (the base class does nothing):

- topics of a kind of its own (`openers`): how a topic of that kind opens as a
  `ServedView` (a shadow: a `ShadowLedger` over its source's ledgers);
- to every topic as it opens: objects that live and die with the topic, before its
  durable subscriptions load (`open_topic`: the compacted view they may read) or after
  (`topic_ready`: a source's replicators, a shadow's published need); each pushes its own
  close onto the topic's `AsyncExitStack`, so a failed open unwinds what was made and an
  unload closes it, in reverse order;
- gRPC services (`add_services`) and the Admin RPCs it serves (`add_admin_rpcs`: each
  handler added by name to the broker's `AdminRpcs`, which the admin service consults);
- what retention must keep for it (`retention_keep`) and what it does after a retention
  pass (`after_retention`);
- a guard on deleting a topic (`delete_guard`: refuse, and the etcd compares the delete
  holds under) and the deletion of the topics of its kinds (`delete_topic`);
- its part of a topic's stats (`topic_stats`, `internal_stats`) and of the broker's
  Prometheus series (`metrics`, read at scrape time: source/broker/metrics.py).

A feature gets the broker's parts through `BrokerHost` (`bind`), before anything starts.

Every broker of a cluster runs the same features: a broker without the shadow feature
neither refuses to delete a source that has shadows nor keeps, in retention, what the
shadows' subscriptions still need; one without compaction does not keep what compaction has
not read. `--features` is for a cluster that does not use a feature at all.
"""
from __future__ import annotations

import importlib.metadata
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Executor
from contextlib import AsyncExitStack
from typing import Any, Protocol

import grpc

from shadowtopic.broker.authorize import Authorizer
from shadowtopic.broker.config import BrokerConfig
from shadowtopic.broker.ownership import BrokerSession
from shadowtopic.broker.topic import Ownership, Topic
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import Policies
from shadowtopic.cursors.snapshot import SnapshotCursorStore
from shadowtopic.ledger.entry_cache import EntryCache
from shadowtopic.ledger.storage import Storage
from shadowtopic.ledger.view import ServedView
from shadowtopic.metadata.base import Compare, MetadataStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import admin_pb2 as apb

ENTRY_POINTS = "shadowtopic.broker_features"

#: (topic, its TopicInfo, its ownership) -> the view the topic is served through
ViewOpener = Callable[[TopicName, mpb.TopicInfo, Ownership], Awaitable[ServedView]]

#: an Admin RPC: (request, grpc context) -> response (or an async iterator, for a stream)
AdminHandler = Callable[[Any, grpc.aio.ServicerContext], Any]


class AdminRpcs:
    """The Admin RPCs (admin.proto) that features serve, with the handler each feature added.

    The admin service (source/broker/admin_service.py) asks it for the handler of such an RPC
    at each call; an RPC no feature added is `Unimplemented`, naming the feature that serves
    it. Only the RPCs it was made with can be added, each once."""

    def __init__(self, served_by: Mapping[str, str]):
        self._served_by = dict(served_by)  # RPC name -> the feature that serves it
        self._handlers: dict[str, AdminHandler] = {}

    def add(self, rpc: str, handler: AdminHandler) -> None:
        """`handler` answers the Admin RPC `rpc` on this broker."""
        if rpc not in self._served_by:
            raise ValueError(f"{rpc} is not an Admin RPC a feature serves (those are "
                             f"{', '.join(sorted(self._served_by))})")
        if rpc in self._handlers:
            raise ValueError(f"the Admin RPC {rpc} is added twice")
        self._handlers[rpc] = handler

    def handler(self, rpc: str) -> AdminHandler:
        """What answers `rpc`; `Unimplemented` with the reason when no feature added it."""
        found = self._handlers.get(rpc)
        if found is None:
            raise errors.Unimplemented(
                f"{rpc} is not served by this broker (it runs without the "
                f"{self._served_by.get(rpc, 'feature that serves it')} feature)")
        return found


class Topics(Protocol):
    """What a feature may ask of the broker's loaded topics (source/broker/topics.py); the
    properties are read only (the manager's attributes)."""

    @property
    def store(self) -> MetadataStore: ...

    @property
    def storage(self) -> Storage: ...

    @property
    def executor(self) -> Executor: ...

    @property
    def entry_cache(self) -> EntryCache: ...

    @property
    def cursors(self) -> SnapshotCursorStore: ...

    @property
    def cursor_flush_interval(self) -> float: ...

    async def info(self, topic: TopicName) -> mpb.TopicInfo: ...

    async def policies(self, topic: TopicName) -> Policies: ...

    async def topic(self, topic: TopicName) -> Topic: ...

    async def writable(self, topic: TopicName) -> Topic: ...

    def loaded(self, topic: TopicName) -> Topic | None: ...

    def loaded_topics(self) -> list[Topic]: ...

    async def unload(self, topic: TopicName,
                     reason: errors.ShadowTopicError | None = None) -> None: ...


class BrokerHost(Protocol):
    """The broker as its features see it (source/broker/server.py's `Broker`), read only."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def store(self) -> MetadataStore: ...

    @property
    def storage(self) -> Storage: ...

    @property
    def session(self) -> BrokerSession: ...

    @property
    def topics(self) -> Topics: ...

    @property
    def authz(self) -> Authorizer: ...


class BrokerFeature:
    """Base of the broker's features: every hook is optional and does nothing here."""

    name = "feature"

    def bind(self, host: BrokerHost) -> None:
        """Called once, before the broker starts: keep what the feature needs of it."""

    async def start(self) -> None:
        """The broker is serving (after its session and topics started)."""

    async def close(self) -> None:
        """The broker stops (its topics are unloaded already)."""

    def openers(self) -> dict[int, ViewOpener]:
        """The topic kinds (`mpb.TopicKind`) this feature serves on this broker, with how
        each opens."""
        return {}

    async def open_topic(self, t: Topic, info: mpb.TopicInfo, stack: AsyncExitStack) -> None:
        """Add to `t` as it opens (its view and subscriptions object exist, the
        subscriptions are not loaded yet). Push every close onto `stack`."""

    async def topic_ready(self, t: Topic, info: mpb.TopicInfo, stack: AsyncExitStack) -> None:
        """`t` is loaded (its durable subscriptions too) and about to be served."""

    def add_services(self, server: grpc.aio.Server) -> list[str]:
        """Register gRPC services; return their full names (health and reflection list
        them)."""
        return []

    def add_admin_rpcs(self, rpcs: AdminRpcs) -> None:
        """Add the handlers of the Admin RPCs this feature serves (`rpcs.add(name, handler)`,
        the method name in admin.proto)."""

    async def retention_keep(self, t: Topic, policies: Policies) -> MessageId | None:
        """The oldest entry of the source topic `t` retention must keep for this feature
        (None: nothing)."""
        return None

    async def after_retention(self, t: Topic) -> None:
        """A retention pass of the owned source topic `t` finished."""

    async def delete_guard(self, topic: TopicName, info: mpb.TopicInfo) -> list[Compare]:
        """Before the source `topic` is deleted: raise to refuse; return the compares the
        delete's etcd transaction holds under (what this check read)."""
        return []

    async def delete_topic(self, topic: TopicName, info: mpb.TopicInfo, force: bool) -> None:
        """Delete `topic`, of a kind this feature serves (`openers`, or `kinds`)."""
        raise errors.NotAllowed(f"{topic} cannot be deleted here")

    async def topic_deleted(self, topic: TopicName) -> None:
        """The source `topic` (or one partition of it) was deleted and its ledgers removed:
        remove what this feature keeps of it (files under the storage root)."""

    def kinds(self) -> set[int]:
        """The topic kinds whose deletion this feature handles (even where it does not
        serve them)."""
        return set()

    def topic_stats(self, t: Topic, out: apb.TopicStats) -> None:
        """Add this feature's part to the stats of the owned topic `t`."""

    async def internal_stats(self, topic: TopicName, info: mpb.TopicInfo,
                             out: apb.InternalStats) -> None:
        """Add this feature's part to the internal stats of `topic`."""

    def metrics(self) -> Iterable[Any]:
        """Prometheus metric families (prometheus_client.core.*MetricFamily) this feature
        adds to the broker's `/metrics`, read from its live state at each scrape."""
        return ()


def installed() -> dict[str, Callable[[], Callable[[], BrokerFeature]]]:
    """The features installed with the package (entry points), by name: each loads its
    factory (what the entry point names), which makes the feature."""
    return {ep.name: ep.load for ep in importlib.metadata.entry_points(group=ENTRY_POINTS)}


def load(names: list[str] | None = None) -> list[BrokerFeature]:
    """The features named, once each (None: every installed one, by name), each made anew.
    None with nothing installed is an error (the package's entry points are missing: it was
    not installed); an empty list is the broker core alone."""
    found = installed()
    if names is None and not found:
        raise ValueError(f"no broker feature is installed (no {ENTRY_POINTS} entry points: "
                         "install the package, e.g. make install); pass --features '' to run "
                         "the broker core alone")
    wanted = sorted(found) if names is None else list(dict.fromkeys(names))
    missing = [n for n in wanted if n not in found]
    if missing:
        raise ValueError(f"unknown broker feature(s) {', '.join(missing)}; installed: "
                         f"{', '.join(sorted(found)) or 'none'}")
    return [found[n]()() for n in wanted]
