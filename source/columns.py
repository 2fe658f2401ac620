"""The columns of a ledger file: one row per entry, in sealed ledgers (source/ledger/sealed.py)
and compacted ones (compaction/), in a form SQL engines read (docs/FORMAT.md); the same
columns are what Arrow reads hand out (the Tables service, the client's `read_table`).

Format 2 (the footer's key-value metadata says `shadowtopic_format = 2`):

    ledger_id     int64    the same in every row of a file (a directory reads as one dataset)
    entry_id      int64    signed: Spark reads an unsigned 64-bit column as a decimal
    key           binary   the message key; null for keyless
    is_tombstone  bool     a keyed message with an empty payload (a delete)
    publish_time  int64    ms since epoch, assigned by the broker
    payload       binary   the payload as stored: compressed when `compression` says so
    properties    map<string, string>
    event_time    int64    ms since epoch; null when the producer set none
    producer_name string   null when unset
    sequence_id   int64    the producer's sequence id; null when unset
    compression   string   "lz4" or "zstd" when the payload is compressed, else null
    head, tail    binary   the rest of the serialized Message: the message exactly as the
                           producer sent it is `head || payload || tail`

A consumer gets each entry's bytes as they were sent, so a reader rebuilds them by one
concatenation per row (`raws`, vectorized) and never re-encodes a message. A stored entry
that is not a Message (opaque bytes) is all `head`, with the parsed columns null.

Format 1 (files sealed before format 2: no `shadowtopic_format` key) has the first five
columns and `raw` (the serialized Message). Both read the same (`raws`); compaction reads a
mix and writes format 2 (`upgrade`).
"""
from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shadowtopic.pb.v1 import common_pb2
from shadowtopic.wire import WireError, read_varint, varint

Buffer = bytes | memoryview

FORMAT_KEY = b"shadowtopic_format"
FORMAT = 2
PROPERTIES = pa.map_(pa.string(), pa.string())
#: the columns of every format (row selection and compaction use them)
KEY_COLUMNS = ["ledger_id", "entry_id", "key", "is_tombstone", "publish_time"]
#: what a reader of messages needs in each format
RAW_COLUMNS = {1: ["raw"], 2: ["head", "payload", "tail"]}
SCHEMA = pa.schema([
    ("ledger_id", pa.int64()),
    ("entry_id", pa.int64()),
    ("key", pa.binary()),
    ("is_tombstone", pa.bool_()),
    ("publish_time", pa.int64()),
    ("payload", pa.binary()),
    ("properties", PROPERTIES),
    ("event_time", pa.int64()),
    ("producer_name", pa.string()),
    ("sequence_id", pa.int64()),
    ("compression", pa.string()),
    ("head", pa.binary()),
    ("tail", pa.binary()),
], metadata={FORMAT_KEY: str(FORMAT).encode()})
#: format 1, read only (files sealed before format 2)
SCHEMA_V1 = pa.schema([*(SCHEMA.field(n) for n in KEY_COLUMNS), ("raw", pa.binary())])
_COMPRESSION = {common_pb2.COMPRESSION_LZ4: "lz4", common_pb2.COMPRESSION_ZSTD: "zstd"}
_KEY_TAG = 0x0A      # field 1, length-delimited
_PAYLOAD_TAG = 0x12  # field 2, length-delimited
ZERO_COPY_BYTES = 4 << 10
_OFFSETS = struct.Struct("<ii")


def version(schema: pa.Schema) -> int:
    """The format of a file with this (Arrow) schema."""
    meta = schema.metadata or {}
    if FORMAT_KEY in meta:
        return int(meta[FORMAT_KEY])
    return 1 if "raw" in schema.names else FORMAT


def _split(raw: Buffer) -> tuple[slice | None, int, int] | None:
    """(the key's bytes or None, payload start, payload end) of a Message serialized in
    field order (every client's: the key field, then the payload field), or None when `raw`
    does not start that way. Read off the wire: the payload is not copied."""
    at, key, n = 0, None, len(raw)
    try:
        if n and raw[0] == _KEY_TAG:
            size, at = read_varint(raw, 1, n)
            if at + size > n:
                return None
            key, at = slice(at, at + size), at + size
        if at < n and raw[at] == _PAYLOAD_TAG:
            size, start = read_varint(raw, at + 1, n)
            if start + size > n:
                return None
            return key, start, start + size
    except WireError:
        return None
    return key, at, at  # no payload field (an empty payload)


class Rows:
    """The format-2 columns of entries, filled a run of raws at a time (a seal streams).
    A payload of `ZERO_COPY_BYTES` or more becomes an Arrow array of its own over the bytes
    it already is (a view of a mapped WAL): a row group of large entries copies nothing."""

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.tombs: list[bool] = []
        self.properties: list[list[tuple[str, str]] | None] = []
        self.event_times: list[int | None] = []
        self.producers: list[str | None] = []
        self.sequences: list[int | None] = []
        self.compressions: list[str | None] = []
        self.heads: list[Buffer] = []
        self.tails: list[Buffer] = []
        self._chunks: list[pa.Array] = []   # payloads, in order
        self._small: list[Buffer | None] = []

    def __len__(self) -> int:
        return len(self.keys)

    def extend(self, raws: Sequence[Buffer]) -> None:
        parse = common_pb2.Message.FromString
        for raw in raws:
            cut = _split(raw)
            rest = None
            if cut is not None:
                key, start, end = cut
                try:  # the fields after the payload (properties, event time, producer ...)
                    rest = parse(bytes(raw[end:]))
                except Exception:  # noqa: BLE001 - not a Message after all
                    rest = None
                if rest is not None and (rest.HasField("key") or rest.payload):
                    rest = None  # a key or payload again after the payload: not field order
            if rest is None:
                self._whole(raw)
                continue
            self._add(None if key is None else bytes(raw[key]), raw[start:end], rest,
                      raw[:start], raw[end:])

    def _whole(self, raw: Buffer) -> None:
        """A raw not in field order: parsed whole (its payload copied), else opaque."""
        try:
            m = common_pb2.Message.FromString(raw)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - opaque bytes: keyless data, all head
            m = None
        at = -1
        if m is not None and not m.payload:
            at = len(raw)  # nothing to cut out: all head
        elif m is not None:
            hdr = bytes((_PAYLOAD_TAG,)) + varint(len(m.payload))
            found = bytes(raw).find(hdr + m.payload)
            at = found + len(hdr) if found >= 0 else -1
        if m is None or at < 0:
            self._opaque(raw)
            return
        self._add(m.key if m.HasField("key") else None, raw[at:at + len(m.payload)], m,
                  raw[:at], raw[at + len(m.payload):])

    def _add(self, key: bytes | None, payload: Buffer, m: common_pb2.Message, head: Buffer,
             tail: Buffer) -> None:
        self.keys.append(key)
        self.tombs.append(not len(payload))
        self._payload(payload)
        self.properties.append(list(m.properties.items()) if m.properties else None)
        self.event_times.append(m.event_time or None)
        self.producers.append(m.producer_name or None)
        self.sequences.append(m.sequence_id or None)
        self.compressions.append(_COMPRESSION.get(m.compression))
        self.heads.append(head)
        self.tails.append(tail)

    def _opaque(self, raw: Buffer) -> None:
        self.keys.append(None)
        self.tombs.append(False)
        self._small.append(None)
        for column in (self.properties, self.event_times, self.producers, self.sequences,
                       self.compressions):
            column.append(None)
        self.heads.append(raw)
        self.tails.append(b"")

    def _payload(self, payload: Buffer) -> None:
        if len(payload) < ZERO_COPY_BYTES:
            self._small.append(payload)
            return
        self._flush_small()
        self._chunks.append(pa.Array.from_buffers(  # the payload's bytes, not a copy
            pa.binary(), 1, [None, pa.py_buffer(_OFFSETS.pack(0, len(payload))),
                             pa.py_buffer(payload)]))

    def _flush_small(self) -> None:
        if self._small:
            self._chunks.append(pa.array(self._small, pa.binary()))
            self._small = []

    def arrays(self) -> dict[str, pa.Array | pa.ChunkedArray]:
        """The columns after the ids and publish times."""
        self._flush_small()
        return {
            "key": pa.array(self.keys, pa.binary()),
            "is_tombstone": pa.array(self.tombs, pa.bool_()),
            "payload": pa.chunked_array(self._chunks, pa.binary()),
            "properties": pa.array(self.properties, PROPERTIES),
            "event_time": pa.array(self.event_times, pa.int64()),
            "producer_name": pa.array(self.producers, pa.string()),
            "sequence_id": pa.array(self.sequences, pa.int64()),
            "compression": pa.array(self.compressions, pa.string()),
            "head": pa.array(self.heads, pa.binary()),
            "tail": pa.array(self.tails, pa.binary()),
        }


def raws(table: pa.Table) -> pa.ChunkedArray:
    """Each row's message as it was sent, from a table of either format."""
    if "raw" in table.column_names:
        return table.column("raw")
    payload = pc.fill_null(table.column("payload"), b"")
    return pc.binary_join_element_wise(table.column("head"), payload, table.column("tail"),
                                       b"")


def upgrade(table: pa.Table) -> pa.Table:
    """A table of format-1 rows (every column) as format 2; a format-2 table as it is."""
    if "raw" not in table.column_names:
        return table
    rows = Rows()
    rows.extend(table.column("raw").to_pylist())
    arrays = rows.arrays()
    return pa.table({"ledger_id": table.column("ledger_id"),
                     "entry_id": table.column("entry_id"),
                     "key": table.column("key"),
                     "is_tombstone": table.column("is_tombstone"),
                     "publish_time": table.column("publish_time"),
                     **{n: arrays[n] for n in SCHEMA.names[5:]}}, schema=SCHEMA)


#: what Arrow reads hand out (the Tables service, `Client.read_table`, `Reader.read_batch`):
#: the parsed columns and `partition` (-1: a non-partitioned topic), not `head` and `tail`
READ_SCHEMA = pa.schema([*(f for f in SCHEMA if f.name not in ("head", "tail")),
                         ("partition", pa.int32())])


def read_columns(names: Sequence[str]) -> list[str]:
    """The columns an Arrow read asked for, in its order (all of them for none);
    `ValueError` naming an unknown one."""
    unknown = [n for n in names if n not in READ_SCHEMA.names]
    if unknown:
        raise ValueError(f"no column {unknown[0]!r}: the columns are "
                         f"{', '.join(READ_SCHEMA.names)}")
    return list(names) or list(READ_SCHEMA.names)


def entries_table(ledger_ids: Sequence[int], entry_ids: Sequence[int],
                  publish_times: Sequence[int], raw: Sequence[Buffer], partition: int,
                  names: Sequence[str] = ()) -> pa.Table:
    """Entries as an Arrow read hands them out (READ_SCHEMA, only `names` when given)."""
    rows = Rows()
    rows.extend(raw)
    arrays = rows.arrays()
    table = pa.table({
        "ledger_id": pa.array(ledger_ids, pa.int64()),
        "entry_id": pa.array(entry_ids, pa.int64()),
        "publish_time": pa.array(publish_times, pa.int64()),
        **{n: arrays[n] for n in READ_SCHEMA.names if n in arrays},
        "partition": pa.array([partition] * len(raw), pa.int32()),
    }).select(READ_SCHEMA.names).cast(READ_SCHEMA)
    return table.select(read_columns(names))


def ipc(table: pa.Table) -> bytes:
    """`table` as one Arrow IPC stream (its schema, then its batches)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


READ_GROUPS = 8  # row groups an Arrow read of a file takes at a time
#: the stored columns an Arrow read takes from a file of each format
_STORED = {1: [*KEY_COLUMNS, "raw"],
           2: [n for n in READ_SCHEMA.names if n != "partition"]}


def read_rows(pf: pq.ParquetFile, fmt: int, first: int, count: int,
              starts: Sequence[int]) -> pa.Table:
    """Rows `first .. first+count-1` of a ledger file (`starts`: each row group's first
    row), or fewer (at most READ_GROUPS row groups are read), as READ_SCHEMA without
    `partition`: only the row groups holding them are read, and a format-1 file's rows are
    converted (`upgrade`)."""
    lo = bisect.bisect_right(starts, first) - 1
    hi = min(bisect.bisect_right(starts, first + count - 1) - 1, lo + READ_GROUPS - 1)
    if hi + 1 < len(starts):  # at most READ_GROUPS row groups (about a MiB each) at a time
        count = min(count, starts[hi + 1] - first)
    table = pf.read_row_groups(list(range(lo, hi + 1)), columns=_STORED[fmt],
                               use_threads=False)
    table = table.slice(first - starts[lo], count)
    if fmt == 1:
        table = upgrade(table)
    return table.select(_STORED[2])


def with_partition(table: pa.Table, partition: int, names: Sequence[str]) -> pa.Table:
    """`table` (READ_SCHEMA without partition) with its `partition` column, only `names`."""
    table = table.append_column("partition", pa.repeat(pa.scalar(partition, pa.int32()),
                                                       table.num_rows))
    return table.cast(READ_SCHEMA).select(read_columns(names))
