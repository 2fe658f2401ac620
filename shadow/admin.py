"""Shadow topics (PIP-180) on the source side: create, delete, list them, the source of one.

A shadow is metadata only. Its `TopicInfo` (kind SHADOW, `source` = the source's canonical
name, immutable) and its name in the source's `ShadowList` (keys.shadows) are written and
removed together in etcd transactions; a shadow owns no ledger list and no ledger file (it
reads the source's). A shadow of a partitioned source is a partitioned parent with the same
count; partition i has `source` = the source's partition i. The ShadowList lives on the
source's parent only: `shadow_topics` derives a source partition's shadows from it.

Transactions (each within TXN_OPS compares and TXN_OPS ops, below etcd's default
--max-txn-ops of 128):

- create: compare the source's info unchanged (it still exists, its kind and partition
  count as read), its ShadowList unchanged, the shadow's info and every partition's absent;
  put the infos and the new ShadowList. With more partitions than fit, the partitions go
  first in chunks (each comparing them absent and the source unchanged) and the parent info
  with the ShadowList last: until then nothing lists, reads or loads the half-made shadow,
  and a failed chunk or final step takes the written partitions back.
- delete: compare the shadow's info unchanged and the source's ShadowList unchanged; delete
  the shadow's key prefix (info, subscriptions, cursor pointer) and every partition's, the
  replicators' positions on the source side (keys.replicator), and put the ShadowList
  without it. In chunks, the partitions go first and the parent last, so a half-deleted
  shadow is still there to delete again. Then the cursor files go. Never a ledger file:
  those are the source's.

A transaction refused because something changed meanwhile (another shadow of the same
source created, the source's policies set) is re-read, re-checked and retried.
"""
from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from shadowtopic.broker.feature import Topics
from shadowtopic.broker.topic_admin import loaded_for_delete
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import validate_properties
from shadowtopic.metadata import keys, tenants
from shadowtopic.metadata.base import Compare, Delete, MetadataStore, Put
from shadowtopic.metadata.topic_info import decode_info
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

SHADOW = mpb.TopicKind.SHADOW
TXN_OPS = 100    # compares and ops per transaction (etcd's default --max-txn-ops is 128)
ATTEMPTS = 100   # rounds when transactions are refused because something changed meanwhile


async def _backoff(attempt: int) -> None:
    """A short random pause before the next round (each refusal means another writer of
    the same keys got through: rivals spread out instead of meeting again)."""
    if attempt:
        await asyncio.sleep(random.uniform(0, min(0.05, 0.002 * attempt)))


# ---- checks and plans (pure) -----------------------------------------------------------------

def check_names(shadow: TopicName, source: TopicName) -> None:
    """Refuse what the names alone rule out (both already parsed: persistent:// only)."""
    shadow.check_creatable()  # a partition name (`x-partition-3`) is no shadow of its own
    if shadow == source:
        raise errors.InvalidArgument(f"topic {shadow} cannot be a shadow of itself")
    if source.partition_index >= 0:
        raise errors.InvalidArgument(
            f"{source} is a partition: create the shadow of {source.partitioned_parent} "
            "(its shadow gets the same partitions)")


def check_source(source: TopicName, info: mpb.TopicInfo) -> None:
    if info.kind == SHADOW:
        raise errors.NotAllowed(f"{source} is itself a shadow of {info.source}: the source "
                                "of a shadow must be a source topic")
    if info.partition_of:
        raise errors.InvalidArgument(f"{source} is a partition of {info.partition_of}: "
                                     f"create the shadow of {info.partition_of}")


def already_exists(shadow: TopicName, info: mpb.TopicInfo) -> errors.ShadowTopicError:
    """The `TopicAlreadyExists` for creating `shadow` where `info`'s topic stands."""
    if info.kind == SHADOW and not info.partition_of:
        return errors.TopicAlreadyExists(
            f"topic {shadow} already exists as a shadow of {info.source} (the source of a "
            "shadow cannot change)")
    what = f" (a partition of {info.partition_of})" if info.partition_of else ""
    return errors.TopicAlreadyExists(f"topic {shadow} already exists{what}")


def shadow_infos(shadow: TopicName, source: TopicName, source_info: mpb.TopicInfo,
                 properties: dict[str, str], now_ms: int) -> list[mpb.TopicInfo]:
    """The shadow's parent info, then its partitions' (as many as the source has)."""
    n = source_info.partitions
    out = [mpb.TopicInfo(name=str(shadow), kind=SHADOW, source=str(source),
                         properties=properties, partitions=n, partition_index=-1,
                         created_ms=now_ms)]
    out += [mpb.TopicInfo(name=str(shadow.partition(i)), kind=SHADOW,
                          source=str(source.partition(i)), partition_of=str(shadow),
                          partition_index=i, created_ms=now_ms) for i in range(n)]
    return out


@dataclass
class Txn:
    compares: list[Compare] = field(default_factory=list)
    ops: list[Put | Delete] = field(default_factory=list)

    def fits(self, compares: int, ops: int, limit: int) -> bool:
        return len(self.compares) + compares <= limit and len(self.ops) + ops <= limit


def _pack(parts: Sequence[tuple[Sequence[Compare], Sequence[Put | Delete]]], last: Txn,
          guard: Compare, limit: int) -> list[Txn]:
    """One transaction when everything fits, else chunks of `parts`, each also comparing
    `guard`, then `last`."""
    whole = Txn()
    for compares, ops in parts:
        whole.compares += compares
        whole.ops += ops
    whole.compares += last.compares
    whole.ops += last.ops
    if len(whole.compares) <= limit and len(whole.ops) <= limit:
        return [whole]
    out: list[Txn] = []
    for compares, ops in parts:
        if not out or not out[-1].fits(len(compares), len(ops), limit):
            out.append(Txn([guard]))
        out[-1].compares += compares
        out[-1].ops += ops
    return out + [last]


def shadow_list_op(source: TopicName, shadows: list[str]) -> Put | Delete:
    if not shadows:
        return Delete(keys.shadows(source))
    return Put(keys.shadows(source), mpb.ShadowList(shadows=shadows).SerializeToString())


def create_plan(infos: list[mpb.TopicInfo], source: TopicName, source_rev: int,
                list_rev: int, shadows: list[str], limit: int = TXN_OPS) -> list[Txn]:
    """The transactions that create the shadow `infos[0]` (parent last when chunked)."""
    source_same = Compare(keys.topic_info(source), "mod_revision", "==", source_rev)
    parts: list[tuple[list[Compare], list[Put]]] = []
    for info in infos[1:]:
        key = keys.topic_info(TopicName.parse(info.name))
        parts.append(([Compare(key, "version", "==", 0)], [Put(key, info.SerializeToString())]))
    parent = TopicName.parse(infos[0].name)
    last = Txn([source_same, Compare(keys.shadows(source), "mod_revision", "==", list_rev),
                Compare(keys.topic_info(parent), "version", "==", 0)],
               [Put(keys.topic_info(parent), infos[0].SerializeToString()),
                shadow_list_op(source, shadows + [str(parent)])])
    # a chunk of partitions is written only while the source stands as read
    return _pack(parts, last, source_same, limit)


def delete_plan(shadow: TopicName, partitions: int, shadow_rev: int, source: TopicName,
                list_rev: int, shadows: list[str], limit: int = TXN_OPS) -> list[Txn]:
    """The transactions that delete `shadow` and its replicators' positions (partitions
    first, parent last when chunked)."""
    same = Compare(keys.topic_info(shadow), "mod_revision", "==", shadow_rev)
    parts: list[tuple[list[Compare], list[Delete]]] = [
        ([], [Delete(keys.topic_prefix(shadow.partition(i)), prefix=True),
              Delete(keys.replicator(source.partition(i), shadow.partition(i)))])
        for i in range(partitions)]
    last = Txn([same, Compare(keys.shadows(source), "mod_revision", "==", list_rev)],
               [Delete(keys.topic_prefix(shadow), prefix=True),
                Delete(keys.replicator(source, shadow)), Delete(keys.topic_grants(shadow)),
                shadow_list_op(source, [s for s in shadows if s != str(shadow)])])
    return _pack(parts, last, same, limit)


# ---- against the store -----------------------------------------------------------------------

async def shadow_topics(store: MetadataStore, topic: TopicName,
                        info: mpb.TopicInfo) -> list[TopicName]:
    """The shadows of `topic` (`info` is its info): of a source partition, the matching
    partition of each shadow of its parent."""
    if info.partition_of:
        parent = TopicName.parse(info.partition_of)
        return [s.partition(info.partition_index)
                for s in await shadow_topics(store, parent, mpb.TopicInfo())]
    kv = await store.get(keys.shadows(topic))
    names = mpb.ShadowList.FromString(kv.value).shadows if kv is not None else ()
    return [TopicName.parse(s) for s in names]


class ShadowAdmin:
    """The shadow RPCs (the admin service and `topics delete` of a shadow delegate here)."""

    def __init__(self, topics: Topics, auto_namespaces: bool = True):
        self.topics = topics
        self.store = topics.store
        self.txn_ops = TXN_OPS
        #: create the shadow's namespace with it (no authorization), else it must exist
        self.auto_namespaces = auto_namespaces

    async def create(self, shadow: TopicName, source: TopicName,
                     properties: dict[str, str]) -> mpb.TopicInfo:
        check_names(shadow, source)
        validate_properties(properties)
        await tenants.prepare_namespace(self.store, shadow.namespace_name, self.auto_namespaces)
        refused = False
        for attempt in range(ATTEMPTS):
            await _backoff(attempt)
            src_kv, kv, list_kv = await asyncio.gather(
                self.store.get(keys.topic_info(source)), self.store.get(keys.topic_info(shadow)),
                self.store.get(keys.shadows(source)))
            if src_kv is None:
                raise errors.TopicNotFound(f"source topic {source} does not exist")
            src = decode_info(src_kv.value)
            check_source(source, src)
            if kv is not None:
                raise already_exists(shadow, decode_info(kv.value))
            infos = shadow_infos(shadow, source, src, properties, int(time.time() * 1000))
            if refused:
                await self._partition_taken(infos[1:])
            shadows = list(mpb.ShadowList.FromString(list_kv.value).shadows) if list_kv else []
            txns = create_plan(infos, source, src_kv.mod_revision,
                               list_kv.mod_revision if list_kv else 0, shadows, self.txn_ops)
            written: list[tuple[int, Txn]] = []
            for txn in txns:
                res = await self.store.txn(txn.compares, txn.ops)
                if not res.succeeded:
                    break
                written.append((res.revision, txn))
            else:
                return infos[0]
            await self._take_back(written)
            refused = True
        raise errors.ServiceUnavailable(f"the metadata of {source} kept changing while "
                                        f"{shadow} was created; try again")

    async def _take_back(self, written: list[tuple[int, Txn]]) -> None:
        """Delete the partition infos of a creation that failed half way (each only while it
        is still what that creation wrote)."""
        for revision, txn in written:
            keys_ = [op.key for op in txn.ops if isinstance(op, Put)]
            await self.store.txn([Compare(k, "mod_revision", "==", revision) for k in keys_],
                                 [Delete(k) for k in keys_])

    async def _partition_taken(self, partitions: list[mpb.TopicInfo]) -> None:
        """After a refused creation: a shadow partition's name that another topic holds is
        the reason (the other reasons show in the checks every round makes)."""
        names = [TopicName.parse(i.name) for i in partitions]
        kvs = await asyncio.gather(*(self.store.get(keys.topic_info(n)) for n in names))
        for name, kv in zip(names, kvs, strict=True):
            if kv is not None:
                raise already_exists(name, decode_info(kv.value))

    async def delete(self, shadow: TopicName, force: bool = False) -> None:
        for attempt in range(ATTEMPTS):
            await _backoff(attempt)
            kv = await self.store.get(keys.topic_info(shadow))
            if kv is None:
                raise errors.TopicNotFound(f"topic {shadow} does not exist")
            info = decode_info(kv.value)
            if info.kind != SHADOW:
                raise errors.NotAllowed(f"{shadow} is not a shadow topic (topics delete "
                                        "deletes a source topic)")
            if info.partition_of:
                raise errors.NotAllowed(f"{shadow} is a partition of {info.partition_of}; "
                                        "delete the partitioned shadow")
            names, loaded = loaded_for_delete(self.topics, shadow, info.partitions, force)
            source = TopicName.parse(info.source)
            list_kv = await self.store.get(keys.shadows(source))
            shadows = list(mpb.ShadowList.FromString(list_kv.value).shadows) if list_kv else []
            txns = delete_plan(shadow, info.partitions, kv.mod_revision, source,
                               list_kv.mod_revision if list_kv else 0, shadows, self.txn_ops)
            gone = errors.TopicNotFound(f"topic {shadow} was deleted")
            for t in loaded:  # consumers stop; cursors are not saved again
                if t.subscriptions is not None:
                    await t.subscriptions.close(gone, flush=False)
            for txn in txns:
                if not (await self.store.txn(txn.compares, txn.ops)).succeeded:
                    break
            else:
                for name in names:
                    await self.topics.unload(name, gone)
                    await self.topics.cursors.purge(name)  # the shadow's own cursor files
                return
            for t in loaded:  # closed above: load them afresh on the next request
                await self.topics.unload(t.name, gone)
        raise errors.ServiceUnavailable(f"the metadata of {shadow} kept changing while it "
                                        "was deleted; try again")

    async def shadows(self, topic: TopicName) -> list[str]:
        info = await self.topics.info(topic)
        return [str(s) for s in await shadow_topics(self.store, topic, info)]

    async def source_of(self, shadow: TopicName) -> str:
        info = await self.topics.info(shadow)
        if info.kind != SHADOW:
            raise errors.NotAllowed(f"{shadow} is not a shadow topic")
        return info.source
