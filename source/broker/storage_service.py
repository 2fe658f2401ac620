"""The Storage service: `ReadEntries`, a ledger's entries read from the broker that owns
its topic (proto/shadowtopic/pb/v1/storage.proto).

What it is for: a broker that cannot open another broker's WAL (each broker on its own
machine, its own `--wal-dir`) reads the unsealed range of a ledger from the one broker that
holds it: a shadow broker reads its source's live tail this way (shadow/tail.py).

    ReadEntries(topic, ledger_id, from_entry, max_entries, max_bytes)
        -> stream ReadEntriesResponse{entries: [EncodedEntry...]}

- Only a source topic this broker has loaded (it owns it) is served; nothing is loaded by
  this call. Any other topic is refused with a status and reason (source/core/errors.py):
  a malformed name `InvalidTopicName`; a topic that does not exist `TopicNotFound`; a shadow
  `NotAllowed` (its entries are its source's); a source another broker (or no broker)
  owns `TopicNotOwned` (retriable), naming the owner and its url when there is one; a ledger
  that is not in the topic's list `LedgerNotFound`.
- Entries come from the topic's `ManagedLedger` (memory, its WAL, or the sealed Parquet
  file: the same bytes from each), in id order, from `from_entry` to the end of what the
  ledger holds now (its confirmed entries: acknowledged after their fsync), never past the
  ledger. A `from_entry` at or past that end gives an empty stream (no response).
- Bounds: at most `max_entries` entries and `max_bytes` bytes of `raw` (the entry that
  passes `max_bytes` is the last one sent: a read always moves on by at least one entry);
  0, or more than the hard caps MAX_ENTRIES / MAX_BYTES, means the cap.
- Frames: each response holds whole entries, about FRAME_BYTES of them at most (an entry
  larger than that goes alone); entries are encoded as for consumers (`source/wire.py`:
  `raw` is never decoded), so a response is the bytes of `ReadEntriesResponse`.
- Memory (source/broker/memory.py): an open call counts STREAM_BYTES, and each response
  IN_FLIGHT_FACTOR times its size while gRPC writes it; a call that does not fit under
  `--client-memory-bytes` is refused with `BrokerMemoryFull` (retriable).
"""
from __future__ import annotations

import grpc

from shadowtopic import wire
from shadowtopic.broker.memory import IN_FLIGHT_FACTOR, STREAM_BYTES, ClientMemory
from shadowtopic.broker.rpc import abort_stream
from shadowtopic.broker.topics import TopicManager
from shadowtopic.core import errors
from shadowtopic.core.errors import typed
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.pb.v1 import storage_pb2

SERVICE = "shadowtopic.v1.Storage"
MAX_ENTRIES = 10_000       # entries per call, at most
MAX_BYTES = 16 << 20       # bytes of raw per call, at most
FRAME_BYTES = 1 << 20      # bytes of raw per response, about
READ_ENTRIES = 1_000       # entries per read of the ledger view


class StorageService:
    def __init__(self, topics: TopicManager, memory: ClientMemory):
        self.topics = topics
        self.memory = memory

    async def ReadEntries(self, request: storage_pb2.ReadEntriesRequest, context):
        held = 0
        try:
            self.memory.admit(STREAM_BYTES, "ReadEntries")
            held = STREAM_BYTES
            view, count = await self._ledger(request)
            left = min(request.max_entries or MAX_ENTRIES, MAX_ENTRIES,
                       max(0, count - request.from_entry))
            budget = min(request.max_bytes or MAX_BYTES, MAX_BYTES)
            pos = request.from_entry
            lid = request.ledger_id
            while left > 0 and budget > 0:
                got = await view.read(MessageId(lid, pos), min(left, READ_ENTRIES), budget)
                got = [e for e in got if e.ledger_id == lid and e.entry_id >= pos]
                if not got:
                    break
                for frame, n, size in _frames(got):
                    message = wire.entries_field(frame, field=1)
                    cost = IN_FLIGHT_FACTOR * len(message)
                    self.memory.admit(cost, "ReadEntries")
                    try:
                        yield message
                    finally:
                        self.memory.release(cost)
                    left -= n
                    budget -= size
                pos = got[-1].entry_id + 1
        except Exception as exc:  # noqa: BLE001 - the caller hears a typed status
            if isinstance(exc, grpc.aio.AbortError):
                raise
            await abort_stream(context, typed(exc, "ReadEntries"))
        finally:
            if held:
                self.memory.release(held)

    async def _ledger(self, request: storage_pb2.ReadEntriesRequest):
        """(the topic's view, the ledger's readable entries), or the error why not."""
        topic = TopicName.parse(request.topic)
        t = self.topics.loaded(topic)
        if t is None or t.writer is None or t.ledger.closed is not None:
            info = await self.topics.info(topic)  # TopicNotFound when it does not exist
            if info.source:
                raise errors.NotAllowed(f"{topic} is a shadow of {info.source}: read the "
                                        "entries of its source")
            if info.partitions:
                raise errors.InvalidArgument(f"{topic} is partitioned: name a partition")
            owner = await self.topics.owner(topic)
            if owner is None:
                raise errors.TopicNotOwned(f"{topic} is not served by any broker now")
            raise errors.TopicNotOwned(f"{topic} is not served by this broker: its owner "
                                       f"is broker {owner.broker_id} at {owner.broker_url}")
        for r in t.ledger.ranges():
            if r.ledger_id == request.ledger_id:
                return t.ledger, r.entries
        raise errors.LedgerNotFound(f"{topic} has no ledger {request.ledger_id}")


def _frames(entries):
    """The entries encoded, cut into responses of about FRAME_BYTES: (encoded, n, bytes)."""
    frame: list[bytes] = []
    size = 0
    last = wire.LastPublish()
    for e in entries:
        if frame and size + len(e.raw) > FRAME_BYTES:
            yield frame, len(frame), size
            frame, size = [], 0
        frame.append(wire.encode_entry(e.ledger_id, e.entry_id, e.publish_ms, e.raw, 0, last))
        size += len(e.raw)
    if frame:
        yield frame, len(frame), size


def add_storage_service(server: grpc.aio.Server, topics: TopicManager,
                        memory: ClientMemory) -> list[str]:
    """Serve `Storage` on `server` (responses are pre-encoded bytes); its service name."""
    service = StorageService(topics, memory)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "ReadEntries": grpc.unary_stream_rpc_method_handler(
            service.ReadEntries,
            request_deserializer=storage_pb2.ReadEntriesRequest.FromString,
            response_serializer=None)}),))
    return [SERVICE]
