"""Arrow reads (docs/CLIENT.md, "Arrow reads"): a topic's messages as pyarrow tables and
record batches, with the columns of the ledger files (source/columns.py, READ_SCHEMA:
ids, key, is_tombstone, publish_time, payload, properties, event_time, producer_name,
sequence_id, compression, partition).

- `read_table`: the broker streams Arrow IPC record batches (the Tables service); the client
  concatenates them, so no Python object is made per message here. The read goes on while
  batches come; `Timeout` when none came for the timeout. A partitioned topic is
  read partition after partition (rows of partition 0 first). Payloads are as stored: a
  compressed one stays compressed (`compression` says how).
- `record_batch`: the messages a reader received, as one record batch (`Reader.read_batch`
  once caught up: what it follows live is already decoded, so payloads are decompressed;
  behind the tail it reads columns, source/client/catch_up.py).

pyarrow is the `arrow` extra (`pip install shadowtopic[arrow]`), imported only here and only
when an Arrow read runs: without it these raise `NotAllowed` naming the extra.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

import grpc

from shadowtopic.client.message import Message
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.pb.v1 import tables_pb2, tables_pb2_grpc

if TYPE_CHECKING:
    import pyarrow as pa


def _columns() -> ModuleType:
    """shadowtopic.columns (and so pyarrow), or `NotAllowed` naming the extra."""
    try:
        from shadowtopic import columns
    except ImportError:  # pyarrow is not installed
        raise errors.NotAllowed("Arrow reads need pyarrow: pip install 'shadowtopic[arrow]'"
                                ) from None
    return columns


def read_table(channel: grpc.Channel, topic: str, partitions: int, compacted: bool,
               start: MessageId | None, end: MessageId | None, columns: Sequence[str],
               timeout: float) -> pa.Table:
    """Every message of `topic` (each partition of a partitioned one) from `start` up to
    `end` as one table; see `Client.read_table`."""
    cols = _columns()
    try:
        names = cols.read_columns(list(columns))
    except ValueError as exc:
        raise errors.InvalidArgument(str(exc)) from None
    parts = [TopicName.parse(topic).partition(i) for i in range(partitions)] or \
        [TopicName.parse(topic)]
    if partitions and (start is not None and start.partition < 0 or
                       end is not None and end.partition < 0):
        raise errors.InvalidArgument(f"{topic} is partitioned: give start and end with their "
                                     f"partition, or read a partition by its name")
    stub = tables_pb2_grpc.TablesStub(channel)  # type: ignore[no-untyped-call]
    tables = []
    for part in parts:
        index = part.partition_index
        if partitions and start is not None and start.partition != index:
            continue
        req = tables_pb2.ReadArrowRequest(topic=str(part), compacted=compacted, columns=names)
        if start is not None:
            req.start.CopyFrom(MessageId(start.ledger_id, start.entry_id).to_pb())
        if end is not None and (not partitions or end.partition == index):
            req.end.CopyFrom(MessageId(end.ledger_id, end.entry_id).to_pb())
        call = stub.ReadArrow(req)
        idle = _Idle(call, timeout)
        try:
            for batch in call:
                idle.progress()
                tables.append(cols.from_ipc(batch.ipc))
        except grpc.RpcError as exc:
            if idle.timed_out:
                raise errors.Timeout(f"{part}: no batch came for {timeout:g} s") from None
            raise errors.from_rpc_error(exc) from None
        finally:
            idle.stop()
    schema = cols.READ_SCHEMA
    if not tables:
        return schema.empty_table().select(names)
    import pyarrow as pa
    return pa.concat_tables(tables)


class _Cancellable(Protocol):
    def cancel(self) -> bool: ...


class _Idle:
    """Cancels a streaming call that brings nothing for `timeout` seconds (a long read goes
    on for as long as batches come)."""

    def __init__(self, call: _Cancellable, timeout: float):
        self.call = call
        self.timeout = timeout
        self.timed_out = False
        self._timer: threading.Timer | None = None
        self.progress()

    def _expire(self) -> None:
        self.timed_out = True
        self.call.cancel()

    def progress(self) -> None:
        self.stop()
        self._timer = threading.Timer(self.timeout, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def column_names(columns: Sequence[str]) -> list[str]:
    """The columns asked for, in the schema's order (all when none), checked: a name that
    is not a column raises `InvalidArgument`; no pyarrow raises `NotAllowed`."""
    cols = _columns()
    try:
        names: list[str] = cols.read_columns(list(columns))
    except ValueError as exc:
        raise errors.InvalidArgument(str(exc)) from None
    return names


def record_batch(messages: list[Message], names: list[str]) -> pa.RecordBatch:
    """`messages` (received: payloads decompressed) as one record batch of the columns
    `names` (`column_names`)."""
    cols = _columns()
    import pyarrow as pa
    ids = [m.message_id for m in messages]
    data = {
        "ledger_id": [i.ledger_id for i in ids], "entry_id": [i.entry_id for i in ids],
        "key": [m.key for m in messages], "is_tombstone": [m.is_tombstone for m in messages],
        "publish_time": [m.publish_time for m in messages],
        "payload": [m.payload for m in messages],
        "properties": [list(m.properties.items()) or None for m in messages],
        "event_time": [m.event_time or None for m in messages],
        "producer_name": [m.producer_name or None for m in messages],
        "sequence_id": [m.sequence_id or None for m in messages],
        "compression": [None] * len(messages),
        "partition": [i.partition for i in ids],
    }
    schema = cols.READ_SCHEMA
    batch = pa.RecordBatch.from_pydict(data, schema=schema)
    return batch.select(names)
