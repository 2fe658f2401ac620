"""What a seek of a reader or a consumer sends, to which partitions, and what it returns
(`SeekResult`, the same type from both)."""
from __future__ import annotations

from typing import NamedTuple, TypeVar

from shadowtopic.client.admin import position_pb
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.pb.v1 import common_pb2


class SeekResult(NamedTuple):
    """Where a `seek` of a reader or a consumer landed, and whether the position asked for
    was clamped to the topic's first or last message."""

    message_id: MessageId
    clamped: bool


P = TypeVar("P")  # a partition of a reader or consumer


def seek_targets(position: MessageId | str | int, by_index: dict[int, P]) -> tuple[
        common_pb2.StartPosition, list[P]]:
    """What a seek sends and to which partitions (`by_index`: partition index -> partition
    of a reader or consumer). A publish time (int ms), "earliest" or "latest" seeks every
    partition; a MessageId ("L:E" text too) with a partition seeks that partition, one
    without seeks every partition (as Pulsar does). `InvalidArgument` for junk."""
    pos = position_pb(position, "seek position")
    mid = None
    if isinstance(position, MessageId):
        mid = position
    elif isinstance(position, str) and pos.HasField("message_id"):
        mid = MessageId.parse(position)
    parts = list(by_index.values())
    if mid is not None and mid.partition >= 0:
        target = by_index.get(mid.partition)
        if target is None:
            if len(parts) == 1 and next(iter(by_index)) < 0:
                target = parts[0]  # a non-partitioned topic: the partition says nothing
            else:
                raise errors.InvalidArgument(f"message id {mid}: partition {mid.partition} "
                                             f"is not one of this topic's")
        parts = [target]
    return pos, parts
