"""MessageId = (ledger_id, entry_id[, partition]); text form `L:E` or `L:E:P`.

Ids order by (ledger_id, entry_id, partition). Ledger ids start at 1, so `EARLIEST` (0:0)
sorts before every stored entry and `LATEST` after every one. `serialize()` gives the bytes
of a `MessageIdData` protobuf, stable across versions.

A MessageId is a NamedTuple (cheap: producers make one per acknowledged message); ids that
come from outside (text, bytes, user arguments) go through `parse` / `deserialize` /
`checked`, which reject junk with `InvalidMessageId`.
"""
from __future__ import annotations

from typing import NamedTuple

from shadowtopic.core.errors import InvalidMessageId
from shadowtopic.pb.v1 import common_pb2

_MAX = (1 << 63) - 1
#: the most entries one acknowledged range (`Ack.ranges`, consumer.proto) may cover: the
#: client splits longer runs, the broker refuses longer ranges (InvalidMessageId)
MAX_ACK_RANGE = 1 << 20


class MessageId(NamedTuple):
    ledger_id: int
    entry_id: int
    partition: int = -1

    @classmethod
    def checked(cls, ledger_id: int, entry_id: int, partition: int = -1) -> MessageId:
        for v in (ledger_id, entry_id, partition):
            if not isinstance(v, int) or isinstance(v, bool):
                raise InvalidMessageId(f"message id parts must be integers, got {v!r}")
        if not (0 <= ledger_id <= _MAX and 0 <= entry_id <= _MAX):
            raise InvalidMessageId(f"message id out of range: {ledger_id}:{entry_id}")
        if partition < -1:
            raise InvalidMessageId(f"invalid partition {partition}")
        return cls(ledger_id, entry_id, partition)

    def __str__(self) -> str:
        base = f"{self.ledger_id}:{self.entry_id}"
        return base if self.partition < 0 else f"{base}:{self.partition}"

    @classmethod
    def parse(cls, text: str) -> MessageId:
        parts = text.strip().split(":") if isinstance(text, str) else []
        if len(parts) not in (2, 3):
            raise InvalidMessageId(f"'{text}' is not a message id (expected L:E or L:E:P)")
        try:
            nums = [int(p) for p in parts]
        except ValueError:
            raise InvalidMessageId(f"'{text}' is not a message id (expected integers)") from None
        return cls.checked(*nums)

    def serialize(self) -> bytes:
        return self.to_pb().SerializeToString()

    @classmethod
    def deserialize(cls, data: bytes) -> MessageId:
        try:
            pb = common_pb2.MessageIdData.FromString(bytes(data))
        except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError and friends
            raise InvalidMessageId(f"cannot decode message id bytes: {exc}") from None
        return cls.from_pb(pb)

    @classmethod
    def from_pb(cls, pb: common_pb2.MessageIdData) -> MessageId:
        partition = pb.partition if pb.HasField("partition") and pb.partition >= 0 else -1
        return cls.checked(pb.ledger_id, pb.entry_id, partition)

    def to_pb(self) -> common_pb2.MessageIdData:
        """The wire form; an id without a partition leaves `partition` unset."""
        pb = common_pb2.MessageIdData(ledger_id=self.ledger_id, entry_id=self.entry_id)
        if self.partition >= 0:
            pb.partition = self.partition
        return pb

    def with_partition(self, partition: int) -> MessageId:
        return MessageId(self.ledger_id, self.entry_id, partition)


EARLIEST = MessageId(0, 0)
LATEST = MessageId(_MAX, _MAX)
