"""Tables of sealed-ledger rows (format 2, every column) built directly, for tests of the
compaction's task code."""
from __future__ import annotations

import pyarrow as pa

from shadowtopic.columns import SCHEMA


def ledger_table(n: int) -> pa.Table:
    """`n` rows of ledger 7; every 13th keyless; key k<i % 50>."""
    cols = {name: pa.nulls(n, SCHEMA.field(name).type) for name in SCHEMA.names}
    cols.update(ledger_id=pa.array([7] * n, pa.int64()), entry_id=pa.array(range(n), pa.int64()),
                key=pa.array([None if i % 13 == 0 else f"k{i % 50}".encode() for i in range(n)],
                             pa.binary()),
                is_tombstone=pa.array([False] * n), publish_time=pa.array([1] * n, pa.int64()),
                payload=pa.array([f"v{i}".encode() for i in range(n)], pa.binary()))
    return pa.table(cols, schema=SCHEMA)
