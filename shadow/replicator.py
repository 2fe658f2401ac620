"""ShadowReplicator: carries a source topic's message ids to one shadow's owning broker.

One replicator per (source topic, shadow topic) pair runs on the broker that owns the source
(a partition of a partitioned source replicates to the same partition of the shadow). The
data itself is never copied: the shadow reads the shared ledgers. What the shadow needs from
the source is *how far* the open ledger is confirmed (the ledger list in etcd changes only
at rollover) and, while it has readers at the tail, the entries' bytes for its cache.

    position  the first id not yet acknowledged by the shadow; durable in etcd under
              `keys.replicator(source, shadow)` as "L:E" text (written at most once a
              `SAVE_INTERVAL_S`, compared with the source's ownership value: a deposed
              owner cannot move it)
    batch     the source's newest confirmed id as the batch's one entry: it stands for
              every id from `position` up to it (the shadow reads the entries from the
              shared ledgers, so the source reads nothing per shadow and its cost per
              shadow is per batch, not per message); when the shadow's last ack said
              `want_raw`, up to BATCH_ENTRIES entries from `position` with their `raw`.
              With the source owner's fencing epoch and the source's last confirmed id;
              one batch in flight, the next one sent when it is acknowledged
    heartbeat a batch without entries every HEARTBEAT_S while nothing else went: the shadow
              learns the last confirmed id even when a batch was lost with a connection (R9)

At-least-once: after a reconnect (the shadow's broker restarted, the connection dropped) the
replicator starts again from its durable position; the shadow ignores ids it has (R5, R6).
`replicator_auto_reset_backlog_entries` (a source policy, 0 = never): when more entries than
that wait, the position jumps to the source's tail; shadow subscriptions still read the
skipped range from the shared ledgers (R7). Where the shadow's broker is: the owner in
etcd, else a registered broker with the "shadow" role, chosen by the shadow's name (the
receiving broker takes the topic).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.view import LedgerView, Trimmed
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import Compare, MetadataStore, Put
from shadowtopic.metadata.placement import RecentPicks, pick_broker
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import replication_pb2

log = logging.getLogger(__name__)

BATCH_ENTRIES = 500
BATCH_BYTES = 2 << 20
HEARTBEAT_S = 0.5
SAVE_INTERVAL_S = 1.0
RETRY_S = (0.05, 2.0)        # reconnect backoff: first, max
ACK_TIMEOUT_S = 30.0
REPLICATE = "/shadowtopic.v1.Replication/Replicate"
SHADOW_ROLE = "shadow"


def parse_position(text: str) -> MessageId | None:
    try:
        return MessageId.parse(text)
    except Exception:  # noqa: BLE001 - a damaged record: start from the tail
        return None


class ShadowReplicator:
    def __init__(self, source: TopicName, shadow: TopicName, view: LedgerView,
                 store: MetadataStore, cluster: str,
                 ownership: Callable[[], tuple[str, bytes, int]],
                 auto_reset: Callable[[], int], channel: Callable[[str], grpc.aio.Channel],
                 picks: RecentPicks | None = None):
        self.source = source
        self.shadow = shadow
        self.view = view
        self.store = store
        self.cluster = cluster
        self._ownership = ownership          # () -> (key, value, epoch) of the source's owner
        self._auto_reset = auto_reset        # () -> the policy's threshold (0: never)
        self._channel = channel              # url -> a (shared) grpc.aio channel
        self._picks = picks                  # this broker's placements not owned yet
        self.position: MessageId | None = None
        self.acked: MessageId | None = None  # last id the shadow acknowledged
        self.connected = False
        self.last_error: errors.ShadowTopicError | None = None
        self.msg_out = 0
        self.auto_resets = 0
        self.want_raw = False
        self._saved: MessageId | None = None
        self._saved_at = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closed = False
        self._rate = (time.monotonic(), 0)
        self._behind_since: float | None = None  # since when entries wait unacknowledged

    # ---- ViewListener (the source's view) --------------------------------------------------

    def on_entries(self) -> None:
        if self._behind_since is None:
            self._behind_since = time.monotonic()
        self._wake.set()

    def on_trimmed(self, trimmed: Trimmed) -> None:
        self._wake.set()  # the position moves past deleted ledgers at the next batch

    def on_closed(self, reason: errors.ShadowTopicError) -> None:
        self._closed = True
        self._wake.set()

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> ShadowReplicator:
        self.view.add_listener(self)
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"replicator {self.source} -> {self.shadow}")
        return self

    async def stop(self) -> None:
        self._closed = True
        self._wake.set()
        self.view.remove_listener(self)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            await self._save(force=True)
        except Exception:  # noqa: BLE001 - best effort: the next owner resends from older
            pass

    # ---- the durable position --------------------------------------------------------------

    async def _load(self) -> MessageId:
        kv = await self.store.get(keys.replicator(self.source, self.shadow))
        pos = parse_position(kv.value.decode()) if kv is not None else None
        if pos is None:
            # a new shadow reads the history from the shared ledgers; what it needs from
            # here on is how far the tail goes (every batch carries the last confirmed id)
            pos = self.view.next_position()
        self._saved = pos
        return self.view.valid_position(pos)

    async def _save(self, force: bool = False) -> None:
        pos = self.position
        if pos is None or pos == self._saved:
            return
        if not force and time.monotonic() - self._saved_at < SAVE_INTERVAL_S:
            return
        own_key, own_value, _ = self._ownership()
        res = await self.store.txn(
            [Compare(own_key, "value", "==", own_value)],
            [Put(keys.replicator(self.source, self.shadow), str(pos).encode())])
        if not res.succeeded:
            raise errors.Fenced(f"{self.source} is no longer owned here")
        self._saved, self._saved_at = pos, time.monotonic()

    # ---- where the shadow is served --------------------------------------------------------

    async def target(self) -> str:
        kv = await self.store.get(keys.ownership(self.cluster, self.shadow))
        if kv is not None:
            return mpb.Ownership.FromString(kv.value).broker_url
        picked = await pick_broker(self.store, self.cluster, SHADOW_ROLE, self.shadow,
                                   self._picks)
        if picked is None:
            raise errors.ServiceUnavailable(f"no broker with the shadow role is registered "
                                            f"to serve {self.shadow}")
        return picked.url

    # ---- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = RETRY_S[0]
        while not self._closed:
            try:
                if self.position is None:
                    self.position = await self._load()
                url = await self.target()
                await self._stream(url)
                backoff = RETRY_S[0]
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - report it, retry with backoff
                err = exc if isinstance(exc, errors.ShadowTopicError) else (
                    errors.from_rpc_error(exc) if isinstance(exc, grpc.RpcError)
                    else errors.ServiceUnavailable(f"{type(exc).__name__}: {exc}"))
                if self.last_error is None or str(err) != str(self.last_error):
                    log.warning("replication %s -> %s failed: %s (retrying)", self.source,
                                self.shadow, err, extra={"topic": str(self.source),
                                                         "shadow": str(self.shadow),
                                                         "error": str(err)})
                self.last_error = err
            self.connected = False
            if self._closed:
                return
            try:
                await asyncio.wait_for(self._wake.wait(), backoff)
            except TimeoutError:
                pass
            self._wake.clear()
            backoff = min(RETRY_S[1], backoff * 2)

    async def _stream(self, url: str) -> None:
        out: asyncio.Queue = asyncio.Queue()

        async def requests():
            while (batch := await out.get()) is not None:
                yield batch

        stub = self._channel(url).stream_stream(
            REPLICATE, request_serializer=replication_pb2.ReplicateBatch.SerializeToString,
            response_deserializer=replication_pb2.ReplicateAck.FromString)
        call = stub(requests())
        acks = call.__aiter__()
        batch_id = 0
        try:
            while not self._closed:
                # a stream's first batch goes at once, heartbeat or not: the shadow learns
                # the source's last confirmed id now (a new shadow starts at the tail, with
                # nothing to send: it waited a heartbeat interval to serve the history)
                batch = await self._next_batch(at_once=batch_id == 0)
                if batch is None:
                    continue  # woken with nothing to send and no heartbeat due
                batch_id += 1
                batch.batch_id = batch_id
                out.put_nowait(batch)
                ack = await asyncio.wait_for(acks.__anext__(), ACK_TIMEOUT_S)
                if ack.HasField("error"):
                    raise errors.from_reason(ack.error.reason, ack.error.message,
                                             ack.error.code)
                self._acked(batch, ack)
                await self._save()
        finally:
            out.put_nowait(None)
            call.cancel()

    async def _next_batch(self, at_once: bool = False) -> replication_pb2.ReplicateBatch | None:
        """The next batch from `position`; when nothing waits, a heartbeat once HEARTBEAT_S
        passed (`at_once`: now), or None when woken earlier (the caller asks again)."""
        view, pos = self.view, self.position
        if pos is None:  # `_run` loads it before it streams
            raise errors.Internal(f"replicator {self.source} -> {self.shadow}: no position")
        self._wake.clear()  # before looking: an append from here on wakes the wait below
        pos = self.position = view.valid_position(pos)
        limit = self._auto_reset()
        if limit > 0 and view.entries_between(pos, view.next_position()) > limit:
            self.position = pos = view.next_position()
            self.auto_resets += 1
            log.warning("replicator %s -> %s: backlog above %d entries: reset to %s",
                        self.source, self.shadow, limit, pos,
                        extra={"topic": str(self.source), "shadow": str(self.shadow)})
        _, _, epoch = self._ownership()
        last = view.last_confirmed()
        batch = replication_pb2.ReplicateBatch(
            shadow=str(self.shadow), source=str(self.source), source_epoch=epoch,
            last_confirmed=last.to_pb() if last is not None else None)
        if pos < view.next_position():
            if not self.want_raw:  # one id for the whole range up to the newest
                if last is not None and last >= pos:
                    batch.entries.add(ledger_id=last.ledger_id, entry_id=last.entry_id)
                    return batch
            else:
                entries = await view.read(pos, BATCH_ENTRIES, BATCH_BYTES)
                for e in entries:
                    batch.entries.add(ledger_id=e.ledger_id, entry_id=e.entry_id,
                                      publish_time=e.publish_ms, raw=e.raw)
                if entries:
                    return batch
        if at_once:
            return batch
        try:
            await asyncio.wait_for(self._wake.wait(), HEARTBEAT_S)
            return None
        except TimeoutError:
            return batch  # a heartbeat: the last confirmed id, no entries

    def _acked(self, batch: replication_pb2.ReplicateBatch, ack: replication_pb2.ReplicateAck
               ) -> None:
        self.connected = True
        self.last_error = None
        self.want_raw = ack.want_raw
        if batch.entries:
            last = batch.entries[-1]
            after = MessageId(last.ledger_id, last.entry_id + 1)
            self.msg_out += self.view.entries_between(self.position, after) \
                if self.position is not None else len(batch.entries)
            self.acked = MessageId(last.ledger_id, last.entry_id)
            self.position = after
            caught_up = self.view.valid_position(self.position) >= self.view.next_position()
            self._behind_since = None if caught_up else time.monotonic()

    # ---- stats -----------------------------------------------------------------------------

    def backlog(self, now: float) -> tuple[int, float]:
        """(entries the shadow has not been sent yet, seconds it has been behind)."""
        view = self.view
        pos = view.valid_position(self.position) if self.position is not None \
            else view.next_position()
        backlog = view.entries_between(pos, view.next_position())
        return backlog, now - self._behind_since if backlog and self._behind_since else 0.0

    def stats(self) -> dict:
        now = time.monotonic()
        t0, n0 = self._rate
        self._rate = (now, self.msg_out)
        backlog, delay = self.backlog(now)
        return dict(msg_rate_out=(self.msg_out - n0) / (now - t0) if now > t0 else 0.0,
                    replication_backlog=backlog, replication_delay_in_seconds=delay,
                    connected=self.connected,
                    last_error=self.last_error,
                    replicated_position=str(self.acked) if self.acked is not None else "",
                    msg_out_counter=self.msg_out, auto_resets=self.auto_resets)
