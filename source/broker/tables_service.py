"""Tables.ReadArrow: a topic's messages as Arrow record batches (proto tables.proto; the
columns are source/columns.py's READ_SCHEMA).

One call reads one topic (a partition, or a non-partitioned topic; a client reads each
partition of a partitioned one) through the view a reader of it would use: the topic's
ledgers (sealed, open, and a shadow's: its source's), or with `compacted` the compacted view
(the latest message of each key up to the horizon, then every message after it). It reads
from `start` (inclusive; the earliest when unset) up to `end` (exclusive; when unset, the
next position when the call began: messages produced meanwhile are not waited for), in
id order, at most `max_batch_rows` entries and about BATCH_BYTES of messages per answer
(from a file: at most `columns.READ_GROUPS` row groups of about a MiB).
Entries stored as columns (a sealed ledger's file, the compacted ledger's: `read_columns` of
the view) are sent from their files, a slice of row groups with no object per entry; the
open ledger's entries are turned into columns (source/columns.py `entries_table`). Both in a
worker thread: the loop never holds a batch's conversion. A topic that is not there, an
unknown column or a bad position ends the call with its typed error; `consume` on the
topic is needed (source/broker/access_rules.py).
"""
from __future__ import annotations

import asyncio

import pyarrow as pa
import pyarrow.compute as pc

from shadowtopic import columns
from shadowtopic.broker.memory import STREAM_BYTES, ClientMemory
from shadowtopic.broker.rpc import abort_stream
from shadowtopic.broker.topics import TopicManager
from shadowtopic.core import errors
from shadowtopic.core.errors import typed
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.view import LedgerView, ReadEntry
from shadowtopic.pb.v1 import tables_pb2, tables_pb2_grpc

DEFAULT_BATCH_ROWS = 65536
MAX_BATCH_ROWS = 1 << 20
BATCH_BYTES = 8 << 20  # messages per answer (an answer stays far below gRPC's 64 MiB)


def _batch(entries: list[ReadEntry], partition: int, names: list[str]) -> bytes:
    return columns.ipc(columns.entries_table(
        [e.ledger_id for e in entries], [e.entry_id for e in entries],
        [e.publish_ms for e in entries], [e.raw for e in entries], partition, names))


def _columns(stored: pa.Table, end: MessageId, partition: int, names: list[str]
             ) -> tuple[bytes | None, tuple[int, int]]:
    """Rows read from a file, those before `end`, as one answer (None: none before it), and
    the id of the last row read."""
    ledgers, entries = stored.column("ledger_id"), stored.column("entry_id")
    last = (ledgers[-1].as_py(), entries[-1].as_py())
    keep = pc.or_(pc.less(ledgers, end.ledger_id),
                  pc.and_(pc.equal(ledgers, end.ledger_id), pc.less(entries, end.entry_id)))
    if not pc.all(keep).as_py():
        stored = stored.filter(keep)
        if not stored.num_rows:
            return None, last
    return columns.ipc(columns.with_partition(stored, partition, names)), last


class TablesService(tables_pb2_grpc.TablesServicer):
    def __init__(self, topics: TopicManager, memory: ClientMemory):
        self.topics = topics
        self.memory = memory

    async def ReadArrow(self, request: tables_pb2.ReadArrowRequest, context):
        try:
            self.memory.admit(STREAM_BYTES, "ReadArrow")
        except errors.ShadowTopicError as exc:
            await abort_stream(context, exc)
        try:
            async for data in self._read(request):
                yield tables_pb2.ArrowBatch(ipc=data)
        except errors.ShadowTopicError as exc:
            await abort_stream(context, exc)
        except ValueError as exc:
            await abort_stream(context, errors.InvalidArgument(str(exc)))
        except Exception as exc:  # noqa: BLE001 - the server keeps serving others
            await abort_stream(context, typed(exc, "ReadArrow"))
        finally:
            self.memory.release(STREAM_BYTES)

    async def _read(self, request: tables_pb2.ReadArrowRequest):
        topic = TopicName.parse(request.topic)
        names = columns.read_columns(list(request.columns))
        rows = request.max_batch_rows or DEFAULT_BATCH_ROWS
        if rows > MAX_BATCH_ROWS:
            raise errors.InvalidArgument(f"max_batch_rows must be at most {MAX_BATCH_ROWS}")
        info = await self.topics.info(topic)
        if info.partitions:
            raise errors.InvalidArgument(f"{topic} is partitioned: read each of its "
                                         f"{info.partitions} partitions")
        t = await self.topics.topic(topic, fresh=True)
        view: LedgerView = await self.topics.compacted_view(topic) if request.compacted \
            else t.ledger
        pos = MessageId.from_pb(request.start) if request.HasField("start") \
            else MessageId(0, 0)
        end = MessageId.from_pb(request.end) if request.HasField("end") \
            else view.next_position()
        partition = topic.partition_index
        ahead: asyncio.Task[pa.Table | None] | None = None  # the next file's rows, read ahead
        try:
            while True:
                pos = view.valid_position(pos)
                if pos >= end or pos >= view.next_position():
                    return
                if ahead is None:
                    ahead = asyncio.ensure_future(view.read_columns(pos, rows))
                stored = await ahead
                ahead = None
                if stored is not None and stored.num_rows:  # a sealed or compacted file
                    data, last = await asyncio.to_thread(_columns, stored, end, partition, names)
                    if data is None:
                        return
                    pos = MessageId(last[0], last[1] + 1)
                    # the next rows are read (an object store's file fetched) while these go
                    ahead = asyncio.ensure_future(view.read_columns(view.valid_position(pos),
                                                                    rows))
                    yield data
                    continue
                entries = [e for e in await view.read(pos, rows, BATCH_BYTES)
                           if MessageId(e.ledger_id, e.entry_id) < end]
                if not entries:
                    return
                yield await asyncio.to_thread(_batch, entries, partition, names)
                pos = MessageId(entries[-1].ledger_id, entries[-1].entry_id + 1)
        finally:
            if ahead is not None:
                ahead.cancel()


def add_tables_service(server, topics: TopicManager, memory: ClientMemory) -> list[str]:
    """Serve `Tables` on `server`; its service name."""
    tables_pb2_grpc.add_TablesServicer_to_server(TablesService(topics, memory), server)
    return ["shadowtopic.v1.Tables"]
