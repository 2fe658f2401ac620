"""Compaction test helpers: sealed ledgers written with the broker's own writer."""
from __future__ import annotations

import pytest

from shadowtopic.compaction.reference import Row
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger import sealed
from shadowtopic.ledger.storage import Storage
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.pb.v1 import common_pb2

TOPIC = TopicName("t", "ns", "compact-me")


def message(key: str | None, payload: bytes) -> bytes:
    m = common_pb2.Message(payload=payload, properties={"p": payload.decode() or "-"})
    if key is not None:
        m.key = key.encode()
    return m.SerializeToString()


class Ledgers:
    """Sealed ledgers written with the broker's own writer, and their ledger list."""

    def __init__(self, storage: Storage):
        self.storage = storage
        self.list = mpb.LedgerList()
        self.rows: list[Row] = []
        self.next_id = 1

    def seal(self, items: list[tuple[str | None, bytes]]) -> MessageId:
        lid = self.next_id
        self.next_id += 1
        raws = [message(k, p) for k, p in items]
        rel = Storage.sealed_rel(TOPIC, lid)
        res = sealed.write_runs(self.storage.fs, self.storage.full(rel), [(1000 + lid, raws)],
                                len(raws), ledger_id=lid)
        self.list.ledgers.add(ledger_id=lid, state=mpb.LedgerState.SEALED, entries=len(raws),
                              size_bytes=res.raw_bytes, path=rel)
        for e, ((k, p), raw) in enumerate(zip(items, raws)):
            self.rows.append(Row(lid, e, k.encode() if k is not None else None, not p,
                                 1000 + lid, raw))
        return MessageId(lid, len(raws) - 1)



@pytest.fixture
def ledgers():
    """`ledgers(storage)`: a `Ledgers` writing sealed ledgers of TOPIC into `storage`."""
    return Ledgers
