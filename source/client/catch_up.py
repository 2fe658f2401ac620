"""A reader's `read_batch` behind the tail: record batches read as columns (the Tables
service's ReadArrow, as `read_table` reads them), not one message at a time.

A reader that is behind (a new shadow's history, a replay from earliest) asks the broker for
Arrow record batches from where it is: rows of sealed and compacted ledgers come from their
files with no Python object per message on either side; the open ledger's entries are
converted on the broker. When a call from the reader's position brings nothing (it reached
the end of what the partition held when that call began), the partition is caught up: the
reader's stream is moved there (a seek) and `read_batch` goes on with what the stream
delivers live, each message once.

Per partition, in the reader's partition order (partition 0 to its end, then 1, ...):
a thread (`_Fetch`) holds one ReadArrow call from the position and queues at most two
answers, so the broker reads ahead while the user works and no more is held. `read_batch`
waits at most its timeout for an answer (an empty batch when none came; the call goes on).
Answers hold up to ANSWER_ROWS rows, handed out `max_messages` at a time.
A failed call raises its typed error from `read_batch`; the next one starts a call again
from the position. Payloads are handed out as produced: the few stored compressed
(`compression` set) are decompressed here and their `compression` is null, as in batches of
live messages.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import grpc

from shadowtopic.client import compression
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.pb.v1 import tables_pb2, tables_pb2_grpc

if TYPE_CHECKING:
    import pyarrow as pa

_END = object()  # the call ended: it read everything the partition held when it began
QUEUED_ANSWERS = 2
#: rows an answer may hold (read_batch hands them out `max_messages` at a time): a file's
#: rows come in one answer (a row group split between two would be decoded twice); the
#: broker caps an answer near 8 MiB of messages (source/columns.py READ_GROUPS)
ANSWER_ROWS = 65536


class _Fetch:
    """One ReadArrow call of a partition from `start`, its answers (pyarrow tables) queued
    by a thread; `_END` after the last, or the call's typed error."""

    def __init__(self, channel: grpc.Channel, topic: str, compacted: bool,
                 start: MessageId | None, rows: int, names: list[str]):
        req = tables_pb2.ReadArrowRequest(topic=topic, compacted=compacted, columns=names,
                                          max_batch_rows=rows)
        if start is not None:
            req.start.CopyFrom(MessageId(start.ledger_id, start.entry_id).to_pb())
        stub = tables_pb2_grpc.TablesStub(channel)  # type: ignore[no-untyped-call]
        self.call = stub.ReadArrow(req)
        self.names = names
        self.rows = 0  # rows this call brought
        self.answers: queue.Queue[object] = queue.Queue(QUEUED_ANSWERS)
        self._closed = False
        threading.Thread(target=self._run, name=f"catch-up {topic}", daemon=True).start()

    def _run(self) -> None:
        from shadowtopic import columns
        try:
            for answer in self.call:
                self._put(columns.from_ipc(answer.ipc))
            self._put(_END)
        except grpc.RpcError as exc:
            if not self._closed:
                self._put(errors.from_rpc_error(exc))
        except Exception as exc:  # noqa: BLE001 - an answer that is not Arrow: say so
            self._put(errors.DataLoss(f"a ReadArrow answer did not decode: {exc}"))

    def _put(self, item: object) -> None:
        while not self._closed:  # (a closed fetch's thread ends instead of waiting)
            try:
                self.answers.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def close(self) -> None:
        self._closed = True
        self.call.cancel()


class _Partition:
    """Where a partition's catch-up is: `position` is the next id to hand out (None: the
    earliest), `moved` whether anything was handed out (the stream is then behind)."""

    def __init__(self, topic: str, index: int, position: MessageId | None):
        self.topic, self.index = topic, index
        self.position = position
        self.moved = False
        self.caught_up = False
        self.fetch: _Fetch | None = None
        self.rest: pa.Table | None = None  # rows of an answer not yet handed out


class CatchUp:
    """`read_batch` for a reader's partitions from their positions until each is caught up
    (`next` returns None); then `seeks` says where each stream must be moved."""

    def __init__(self, channel: grpc.Channel, compacted: bool,
                 parts: Sequence[tuple[str, int, MessageId | None]]):
        self._channel = channel
        self._compacted = compacted
        self._parts = [_Partition(*p) for p in parts]

    def next(self, max_messages: int, timeout: float | None,
             names: list[str]) -> pa.RecordBatch | None:
        """Up to `max_messages` rows (the columns `names`) of the first partition not
        caught up; an empty batch when no answer came within `timeout`; None once every
        partition is caught up."""
        asked = _asked(names)
        for part in self._parts:
            while not part.caught_up:
                table = self._take(part, max_messages, timeout, asked)
                if table is None:  # waited `timeout`: the call goes on
                    return _batch(None, names)
                if table.num_rows:
                    return _batch(table, names)
        return None

    def _take(self, part: _Partition, most: int, timeout: float | None,
              asked: list[str]) -> pa.Table | None:
        """Rows of `part` (at most `most`; an empty table when it just caught up), or None
        when nothing came within `timeout`."""
        while part.rest is None:
            if part.fetch is None or part.fetch.names != asked:
                if part.fetch is not None:
                    part.fetch.close()
                part.fetch = _Fetch(self._channel, part.topic, self._compacted,
                                    part.position, max(most, ANSWER_ROWS), asked)
            try:
                item = part.fetch.answers.get(timeout=timeout)
            except queue.Empty:
                return None
            if item is _END:
                done, part.fetch = part.fetch, None
                done.close()
                if not done.rows:  # a call from the position found nothing there
                    part.caught_up = True
                    return _schema().empty_table()
                continue  # more may have come meanwhile: a call from the position again
            if isinstance(item, BaseException):
                part.fetch.close()
                part.fetch = None  # the next read_batch calls again from the position
                raise item
            rows: pa.Table = item
            part.fetch.rows += rows.num_rows
            if rows.num_rows:
                part.rest = rows
        table, rest = part.rest.slice(0, most), part.rest.slice(most)
        part.rest = rest if rest.num_rows else None
        last = table.num_rows - 1
        part.position = MessageId(table.column("ledger_id")[last].as_py(),
                                  table.column("entry_id")[last].as_py() + 1)
        part.moved = True
        return table

    def has_more(self, last_of: Callable[[str], MessageId | None]) -> bool:
        """Whether a partition has rows here or, by `last_of(topic)` (its last message
        now), past its position."""
        for part in self._parts:
            if part.rest is not None:
                return True
            last = last_of(part.topic)
            if last is not None and (part.position is None or
                                     MessageId(last.ledger_id, last.entry_id) >= part.position):
                return True
        return False

    def seeks(self) -> list[tuple[int, MessageId]]:
        """(partition index, position) of each partition whose stream must be moved: those
        read here (the stream then goes on from the next id after what was handed out)."""
        return [(p.index, p.position) for p in self._parts
                if p.moved and p.position is not None]

    def close(self) -> None:
        for part in self._parts:
            if part.fetch is not None:
                part.fetch.close()
                part.fetch = None


def _schema() -> pa.Schema:
    from shadowtopic import columns
    return columns.READ_SCHEMA


def _asked(names: list[str]) -> list[str]:
    """The columns to ask for: `names`, the ids (the position is kept from them) and, with
    the payload, how it is stored."""
    extra = ["ledger_id", "entry_id", *(["compression"] if "payload" in names else [])]
    return [n for n in _schema().names if n in names or n in extra]


def _batch(table: pa.Table | None, names: list[str]) -> pa.RecordBatch:
    """`table`'s rows (None: none) as one record batch of `names`, the compressed payloads
    decompressed."""
    import pyarrow as pa
    if table is None or not table.num_rows:
        return pa.RecordBatch.from_pylist([], schema=_schema()).select(names)
    if "payload" in names and table.column("compression").null_count < table.num_rows:
        stored = table.column("compression").to_pylist()
        payloads = table.column("payload").to_pylist()
        plain = [p if c is None else compression.decompress_stored(c, p)
                 for c, p in zip(stored, payloads, strict=True)]
        table = table.set_column(table.schema.get_field_index("payload"), "payload",
                                 pa.array(plain, pa.binary()))
        table = table.set_column(table.schema.get_field_index("compression"), "compression",
                                 pa.nulls(table.num_rows, pa.string()))
    return table.select(names).combine_chunks().to_batches()[0]
