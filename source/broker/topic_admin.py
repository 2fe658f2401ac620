"""Topic metadata: create, delete, list, set policies, a namespace's policies (the Admin RPCs
of the broker core).

A topic is `TopicInfo` under /topics/<path>/info plus its ledger list. A partitioned topic is
a parent info (partitions = N) and N partition topics `<t>-partition-<i>`, each a topic of
its own; the parent holds the policies every partition follows. Creating writes every info
and ledger list in one etcd transaction that holds only while none of them exists.

Deleting a source topic asks each feature first (`BrokerFeature.delete_guard`: a source with
shadows is refused, `HasShadowTopics`) and deletes the metadata in one transaction that holds
only while what those checks read is unchanged; then the loaded topics close, then the
cursor files and the ledger files go (a crash in between leaves orphan files, never metadata
pointing at missing files). A topic of another kind (a shadow) is deleted by the feature that
handles its kind (`BrokerFeature.delete_topic`).
"""
from __future__ import annotations

import builtins
import logging
import time

from google.protobuf.message import DecodeError

from shadowtopic.broker.feature import BrokerFeature, Topics
from shadowtopic.broker.topic import Topic
from shadowtopic.broker.topics import TopicManager
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import Policies, validate_partitions, validate_properties
from shadowtopic.ledger.storage import Storage
from shadowtopic.metadata import keys, namespace_policies, tenants
from shadowtopic.metadata.base import Compare, Delete, Put
from shadowtopic.metadata.policies_record import from_record, to_record
from shadowtopic.metadata.topic_info import SOURCE
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import admin_pb2 as apb

log = logging.getLogger(__name__)


def topic_metadata(info: mpb.TopicInfo, policies: Policies | None = None,
                   namespace: Policies | None = None) -> apb.TopicMetadata:
    """`info` as the Admin API shows it, with its effective `policies` (when not given: its
    own over its `namespace`'s policies over the defaults)."""
    eff = policies or from_record(info.policies).effective(namespace)
    return apb.TopicMetadata(topic=info.name, kind=api_kind(info.kind),
                             partitions=info.partitions, source=info.source,
                             properties=dict(info.properties), policies=eff.to_pb())


def api_kind(kind: mpb.TopicKind) -> str:
    """A topic's kind (as stored) as the Admin API's TopicKind: the two enums share their
    names and numbers; the name is what both accept."""
    return mpb.TopicKind.Name(kind)


def loaded_for_delete(topics: Topics, topic: TopicName, partitions: int,
                      force: bool) -> tuple[list[TopicName], list[Topic]]:
    """The names a delete of `topic` removes (it and its partitions) and those of them this
    broker has loaded; `NotAllowed` when they have connected consumers and not `force`."""
    names = [topic] + [topic.partition(i) for i in range(partitions)]
    loaded = [t for t in map(topics.loaded, names) if t is not None]
    connected = sum(t.subscriptions.connected() for t in loaded if t.subscriptions is not None)
    if connected and not force:
        raise errors.NotAllowed(f"{topic} has {connected} connected consumers; "
                                "use force to disconnect them and delete")
    return names, loaded


class TopicAdmin:
    def __init__(self, topics: TopicManager, features: list[BrokerFeature],
                 auto_namespaces: bool = True):
        self.topics = topics
        self.store = topics.store
        self.features = features
        #: create a topic's namespace with it (a broker without authorization), else the
        #: namespace must exist (source/metadata/tenants.py)
        self.auto_namespaces = auto_namespaces

    async def create(self, topic: TopicName, partitions: int, policies: Policies,
                     properties: dict[str, str]) -> mpb.TopicInfo:
        topic.check_creatable()
        validate_partitions(partitions)
        validate_properties(properties)
        policies.validate()
        now = int(time.time() * 1000)
        info = mpb.TopicInfo(name=str(topic), kind=SOURCE, properties=properties,
                             policies=to_record(policies), partitions=partitions,
                             partition_index=-1, created_ms=now)
        await tenants.prepare_namespace(self.store, topic.namespace_name, self.auto_namespaces)
        names = [topic] + [topic.partition(i) for i in range(partitions)]
        compares = [Compare(keys.topic_info(t), "version", "==", 0) for t in names]
        compares.append(Compare(keys.namespace_info(topic.namespace_name), "version", ">", 0))
        ops = [Put(keys.topic_info(topic), info.SerializeToString())]
        if partitions == 0:
            ops.append(Put(keys.ledgers(topic), mpb.LedgerList().SerializeToString()))
        for i in range(partitions):
            part = topic.partition(i)
            pinfo = mpb.TopicInfo(name=str(part), kind=SOURCE, partition_of=str(topic),
                                  partition_index=i, created_ms=now)
            ops += [Put(keys.topic_info(part), pinfo.SerializeToString()),
                    Put(keys.ledgers(part), mpb.LedgerList().SerializeToString())]
        res = await self.store.txn(compares, ops)
        if not res.succeeded:
            await tenants.require_namespace(self.store, topic.namespace_name)  # deleted since?
            raise errors.TopicAlreadyExists(f"topic {topic} already exists")
        return info

    async def delete(self, topic: TopicName, force: bool = False) -> None:
        """Delete a topic (every partition of a partitioned one), as the module doc says."""
        info = await self.topics.info(topic)
        if info.partition_of:
            raise errors.NotAllowed(f"{topic} is a partition of {info.partition_of}; "
                                    "delete the partitioned topic")
        if info.kind != SOURCE:
            for f in self.features:
                if info.kind in f.kinds():
                    return await f.delete_topic(topic, info, force)
            raise errors.NotAllowed(f"{topic} is a {mpb.TopicKind.Name(info.kind).lower()} "
                                    "topic, which this broker cannot delete")
        guards = [c for f in self.features for c in await f.delete_guard(topic, info)]
        names, loaded = loaded_for_delete(self.topics, topic, info.partitions, force)
        lists = {name: await self.store.get(keys.ledgers(name)) for name in names}
        gone = errors.TopicNotFound(f"topic {topic} was deleted")
        for t in loaded:  # consumers stop; cursors are not saved again
            if t.subscriptions is not None:
                await t.subscriptions.close(gone, flush=False)
        # metadata first: a loaded ledger's next list write then fails and fences it, and
        # nothing can load the topic again; then close, then files. The first delete holds
        # only while the guards' reads stand (a shadow created meanwhile stops it).
        res = await self.store.txn(guards, [Delete(keys.topic_prefix(topic), prefix=True),
                                            Delete(keys.wal_commits_prefix(topic), prefix=True),
                                            Delete(keys.topic_grants(topic))])
        if not res.succeeded:
            for name in names:  # their consumers were closed above: load afresh when asked
                await self.topics.unload(name)
            for f in self.features:  # the reason, when a guard now refuses
                await f.delete_guard(topic, info)
            raise errors.ServiceUnavailable(f"{topic} changed while it was deleted; try again")
        for name in names[1:]:
            await self.store.delete(keys.topic_prefix(name), prefix=True)
            await self.store.delete(keys.wal_commits_prefix(name), prefix=True)
        storage = self.topics.storage
        for name in names:
            await self.topics.unload(name, gone)
            await self.topics.cursors.purge(name)
            kv = lists[name]
            for led in (mpb.LedgerList.FromString(kv.value).ledgers if kv else ()):
                if led.path:
                    storage.delete(led.path)
                if led.wal_path:
                    storage.delete_wal(led.wal_path)
            # the topic's folders, left empty (or holding files no list named any more)
            storage.delete_dir(Storage.topic_sealed_dir(name))
            storage.delete_wal_dir(Storage.topic_wal_dir(name))
            for f in self.features:
                await f.topic_deleted(name)

    async def list(self, namespace: str | None) -> list[mpb.TopicInfo]:
        snap = await self.store.get_prefix(keys.topics_prefix(namespace))
        out = []
        for kv in snap.items:
            if keys.topic_from_info_key(kv.key) is None:
                continue
            try:
                info = mpb.TopicInfo.FromString(kv.value)
            except DecodeError:  # one bad record does not hide every other topic
                log.warning("%s holds no TopicInfo: left out of the list", kv.key)
                continue
            if not info.partition_of:
                out.append(info)
        return sorted(out, key=lambda i: i.name)

    async def metadata(self, infos: builtins.list[mpb.TopicInfo]
                       ) -> builtins.list[apb.TopicMetadata]:
        """`topic_metadata` of each of `infos` (each namespace's policies read once)."""
        namespaces: dict[str, Policies] = {}
        out = []
        for info in infos:
            ns = TopicName.parse(info.name).namespace_name
            if ns not in namespaces:
                namespaces[ns] = await namespace_policies.read(self.store, ns)
            out.append(topic_metadata(info, namespace=namespaces[ns]))
        return out

    async def get_namespace_policies(self, namespace: str) -> Policies:
        """The policies set on `namespace` ("tenant/namespace", validated): only those."""
        return await namespace_policies.read(self.store, namespace)

    async def set_namespace_policies(self, namespace: str, update: Policies,
                                     remove: builtins.list[str]) -> Policies:
        """Set and unset some policies of `namespace`; its loaded topics here take theirs
        at once (on other brokers: when their watch hears of it)."""
        out = await namespace_policies.update(self.store, namespace, update, remove)
        try:
            await self.topics.namespaces_changed({namespace})
        except Exception as exc:  # noqa: BLE001 - written: the watch applies it too
            log.warning("%s: policies not applied here yet: %s", namespace, exc)
        return out

    async def set_policies(self, topic: TopicName, update: Policies) -> Policies:
        update.validate()
        while True:
            kv = await self.store.get(keys.topic_info(topic))
            if kv is None:
                raise errors.TopicNotFound(f"topic {topic} does not exist")
            info = mpb.TopicInfo.FromString(kv.value)
            if info.partition_of:
                raise errors.NotAllowed(f"{topic} is a partition: set policies on "
                                        f"{info.partition_of}")
            merged = from_record(info.policies).merged(update)
            info.policies.CopyFrom(to_record(merged))
            if await self.store.cas(kv.key, info.SerializeToString(), kv.mod_revision):
                break
        eff = merged.effective(await namespace_policies.read(self.store,
                                                             topic.namespace_name))
        names = [topic] + [topic.partition(i) for i in range(info.partitions)]
        for t in names:
            loaded = self.topics.loaded(t)
            if loaded is not None:
                loaded.set_policies(eff)
        return eff
