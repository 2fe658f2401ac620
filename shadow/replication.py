"""The Replication service of a shadow broker: the receiving end of a source's
`ShadowReplicator` (shadow/replicator.py, on the source's broker).

Each `ReplicateBatch` names a shadow and its source. The batch is refused (an `error` in
the ack, then the stream ends) when the shadow is not a shadow of that source, or when the
sender is not the source's current owner: its `source_epoch` is not the source's ownership
epoch in etcd (read when a stream starts and again whenever a batch claims a newer epoch;
below it: `Fenced`, a deposed owner; above it: `InvalidArgument`, no owner had it). An id in
a ledger the source's ledger list does not hold (read again when the list followed here
does not: the watch may be behind) is not applied: a shadow never counts entries its source
never listed. An
accepted batch loads the shadow here if it is not loaded (this broker takes ownership),
then tells the shadow's `ShadowLedger` the newest id the source confirmed (the last entry
of the batch, or the batch's `last_confirmed`): ids only move forward, so a resent batch
changes nothing (R5). The source's owner url (its ownership record, read with the epoch)
is given to the `ShadowLedger` too: a shadow broker that does not share the source's WAL
reads the unsealed tail from there (shadow/tail.py). The ack carries the shadow's last
confirmed id and `want_raw`: whether the stream is to carry the entries' bytes, which one
stream per source does while its shadows read the unsealed tail from the source's owner (no
shared WAL; `Carriers`, shadow/carriers.py: the others send ids only, applied once the
carrier's bytes are here); the bytes go to the broker's one `TailCache` (shadow/tail.py),
shared by every shadow of the source, where the shadows' reads of the tail find them before
asking the owner.

`Inbound` keeps what a shadow's stats say of its incoming replication (a shadow that cannot
follow says so): whether a stream from its source carries it now, since when it does not,
the last refusal, and the newest id applied. A shadow topic's stats show it under
`shadow_replication[<source>]` (shadow/feature.py).
"""
from __future__ import annotations

import logging
import time

from shadowtopic.broker.authorize import OPEN, Authorizer
from shadowtopic.broker.feature import Topics
from shadowtopic.core import errors
from shadowtopic.core.errors import error_status, typed
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.core.permissions import Action
from shadowtopic.ledger.view import ReadEntry
from shadowtopic.metadata import keys
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import replication_pb2, replication_pb2_grpc
from shadowtopic.shadow.carriers import Carriers
from shadowtopic.shadow.ledger import ShadowLedger
from shadowtopic.shadow.tail import TailCache

log = logging.getLogger(__name__)


_STARTED = time.monotonic()


class Inbound:
    """Each shadow's incoming replication on this broker, for its stats."""

    def __init__(self) -> None:
        self._streams: dict[str, int] = {}       # shadow -> streams carrying it now
        self._since: dict[str, float] = {}       # shadow -> when its last stream ended
        self._errors: dict[str, errors.ShadowTopicError] = {}

    def attach(self, shadow: str) -> None:
        self._streams[shadow] = self._streams.get(shadow, 0) + 1
        self._errors.pop(shadow, None)

    def detach(self, shadow: str) -> None:
        left = self._streams.get(shadow, 0) - 1
        if left > 0:
            self._streams[shadow] = left
        else:
            self._streams.pop(shadow, None)
            self._since[shadow] = time.monotonic()

    def refused(self, shadow: str, err: errors.ShadowTopicError) -> None:
        self._errors[shadow] = err

    def stats(self, shadow: str, view: ShadowLedger) -> dict:
        """The shadow's side, in the shape of a replicator's stats (shadow/replicator.py):
        `connected` while a stream of its source carries it; `replication_delay_in_seconds`
        how long it has not (since this broker started, when it never did)."""
        connected = shadow in self._streams
        since = self._since.get(shadow, _STARTED)
        last = view.last_confirmed()
        return dict(connected=connected, last_error=self._errors.get(shadow),
                    replication_delay_in_seconds=0.0 if connected else time.monotonic() - since,
                    replicated_position=str(last) if last is not None else "")


class ReplicationService(replication_pb2_grpc.ReplicationServicer):
    def __init__(self, topics: Topics, cluster: str, inbound: Inbound | None = None,
                 authz: Authorizer = OPEN):
        self.topics = topics
        self.cluster = cluster
        self.authz = authz  # each batch's shadow needs `replicate` (a revoke ends the stream)
        self.inbound = inbound or Inbound()
        self.tail_cache = TailCache()  # replicated bytes, for shadows reading remotely
        self.carriers = Carriers()     # which shadow of each source brings them

    async def _source_owner(self, source: TopicName) -> tuple[int, str]:
        """(epoch, broker url) of the source's ownership in etcd ((0, ''): no owner)."""
        kv = await self.topics.store.get(keys.ownership(self.cluster, source))
        if kv is None:
            return 0, ""
        owner = mpb.Ownership.FromString(kv.value)
        return owner.epoch, owner.broker_url

    async def Replicate(self, request_iterator, context):
        epochs: dict[str, tuple[int, str]] = {}  # source -> (epoch, owner url)
        carried: set[str] = set()  # the shadows this stream carries (for their stats)
        try:
            async for batch in request_iterator:
                try:
                    view, carrying = await self._accept(batch, epochs)
                except Exception as exc:  # noqa: BLE001 - the sender hears why; the stream ends
                    err = typed(exc, "Replicate")
                    log.warning("replication %s -> %s refused: %s", batch.source, batch.shadow,
                                err, extra={"topic": batch.source, "shadow": batch.shadow,
                                            "error": str(err)})
                    self.inbound.refused(batch.shadow, err)
                    yield replication_pb2.ReplicateAck(batch_id=batch.batch_id,
                                                       error=error_status(err))
                    return
                if batch.shadow not in carried:
                    carried.add(batch.shadow)
                    self.inbound.attach(batch.shadow)
                last = view.last_confirmed()
                yield replication_pb2.ReplicateAck(
                    batch_id=batch.batch_id, last_persisted=last.to_pb() if last else None,
                    want_raw=carrying)
        finally:
            for shadow in carried:
                self.inbound.detach(shadow)
                self.carriers.forget(shadow)

    async def _accept(self, batch: replication_pb2.ReplicateBatch,
                      epochs: dict[str, tuple[int, str]]) -> tuple[ShadowLedger, bool]:
        """The shadow's view once the batch is applied (or waits for its carrier), and
        whether this stream is to carry the source's bytes (the ack's `want_raw`)."""
        shadow = TopicName.parse(batch.shadow)
        source = TopicName.parse(batch.source)
        self.authz.require(Action.REPLICATE, shadow)
        known, url = epochs.get(batch.source, (None, ""))
        if known is None or batch.source_epoch > known:
            known, url = epochs[batch.source] = await self._source_owner(source)
        if batch.source_epoch < known:
            raise errors.Fenced(
                f"replication of {source} at epoch {batch.source_epoch} refused: the source's "
                f"owner is at epoch {known}")
        if batch.source_epoch > known:  # read again just now: no owner ever had it
            raise errors.InvalidArgument(
                f"replication of {source} at epoch {batch.source_epoch} refused: the source's "
                f"owner is at epoch {known}")
        t = await self.topics.topic(shadow)
        view = t.ledger
        if not isinstance(view, ShadowLedger) or view.source != source:
            raise errors.InvalidArgument(f"{shadow} is not a shadow of {source}")
        if url:
            view.source_url = url  # where its unsealed tail is read when no WAL is shared
        view.remote_tail.cache = self.tail_cache
        key = str(source)
        carrying = view.remote and self.carriers.carries(key, str(shadow))
        newest = None
        if batch.entries:
            e = batch.entries[-1]
            newest = MessageId(e.ledger_id, e.entry_id)
        if batch.HasField("last_confirmed"):
            lc = MessageId(batch.last_confirmed.ledger_id, batch.last_confirmed.entry_id)
            newest = lc if newest is None or lc > newest else newest
        if newest is not None:
            if await view.lists_ledger(newest.ledger_id):
                # the source's other shadows here may have brought them already
                held = self.tail_cache.holds
                raws = [ReadEntry(e.ledger_id, e.entry_id, e.publish_time, e.raw)
                        for e in batch.entries
                        if e.HasField("raw") and not held(key, e.ledger_id, e.entry_id)]
                if raws:  # before the id: a read it wakes finds them
                    self.tail_cache.add(key, raws)
                    self.carriers.carried(key, (raws[-1].ledger_id, raws[-1].entry_id))
                if view.remote and not carrying:  # once the carrier brought the bytes
                    self.carriers.when_carried(key, str(shadow),
                                               (newest.ledger_id, newest.entry_id),
                                               lambda: view.on_replicated(newest))
                else:
                    view.on_replicated(newest)
            else:  # not (or no more) a ledger of the source: nothing to apply
                log.debug("replication of %s -> %s: ledger %d is not in the source's list; "
                         "id %s not applied", source, shadow, newest.ledger_id, newest)
        return view, carrying
