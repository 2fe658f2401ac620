"""Payload compression, as Pulsar's producer `compressionType`: the producer compresses each
message's payload, the broker stores and delivers the message as sent, and every client
decompresses it on receipt, so readers, consumers, shadows, compacted readers and the CLI see
the payload as produced.

The format (proto/shadowtopic/pb/v1/common.proto, `Message`):

    compression        = CompressionType: COMPRESSION_NONE (0), COMPRESSION_LZ4 (1) or
                         COMPRESSION_ZSTD (2)
    uncompressed_size  = the payload's length before compression
    payload            = LZ4: one LZ4 block without a size header (`lz4.block`, the size is
                         `uncompressed_size`); ZSTD: one zstd frame (level 3)

An empty payload (a delete, in a compacted view) is never compressed: it stays empty, so a
tombstone is a tombstone whatever the producer's setting. Entries are stored one message
each, so compression works per payload: a payload that does not get smaller (a short one: a
zstd frame alone is 9 bytes or more; random bytes) is sent as it is, `COMPRESSION_NONE`.

A payload that does not decompress to `uncompressed_size` bytes, names a codec this client
does not know or claims more than `MAX_MESSAGE_SIZE` raises `errors.DataLoss` where it is
received (no client allocates what a hostile producer claims).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import lz4.block
import zstandard

from shadowtopic.core import errors
from shadowtopic.core.policies import MAX_MESSAGE_SIZE
from shadowtopic.pb.v1 import common_pb2

NONE = common_pb2.COMPRESSION_NONE
LZ4 = common_pb2.COMPRESSION_LZ4
ZSTD = common_pb2.COMPRESSION_ZSTD
Codec: TypeAlias = common_pb2.CompressionType
#: the producer's `compression_type` values
CODECS: dict[str, Codec] = {"none": NONE, "lz4": LZ4, "zstd": ZSTD}
ZSTD_LEVEL = 3


def codec(name: str) -> Codec:
    """The codec of a `compression_type` ("none", "lz4", "zstd", any case)."""
    if not isinstance(name, str) or name.lower() not in CODECS:
        raise errors.InvalidArgument(f"compression_type must be one of "
                                     f"{', '.join(CODECS)}, got {name!r}")
    return CODECS[name.lower()]


def compressor(kind: Codec) -> Callable[[bytes], bytes] | None:
    """The producer's compress function for a codec (None: no compression)."""
    if kind == LZ4:
        def lz4_block(data: bytes) -> bytes:
            out: bytes = lz4.block.compress(data, store_size=False)  # (lz4 has no stubs)
            return out
        return lz4_block
    if kind == ZSTD:
        return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress
    return None


_ZSTD = zstandard.ZstdDecompressor()


def decompress(kind: int, data: bytes, size: int) -> bytes:
    """The payload as produced, from a received message's compressed `data`."""
    if size > MAX_MESSAGE_SIZE:
        raise errors.DataLoss(f"a compressed payload claims {size} bytes, more than a "
                              f"message may have ({MAX_MESSAGE_SIZE})")
    out: bytes  # (lz4 has no stubs: its functions return Any)
    try:
        if kind == LZ4:
            out = lz4.block.decompress(data, uncompressed_size=size)
        elif kind == ZSTD:
            out = _ZSTD.decompress(data, max_output_size=size)
        else:
            raise errors.DataLoss(f"a payload compressed with unknown codec {kind}")
    except (lz4.block.LZ4BlockError, zstandard.ZstdError) as exc:
        raise errors.DataLoss(f"a compressed payload does not decompress: {exc}") from None
    if len(out) != size:
        raise errors.DataLoss(f"a compressed payload decompressed to {len(out)} bytes, "
                              f"not the {size} its message names")
    return out


STORED = {"lz4": LZ4, "zstd": ZSTD}  # the `compression` column's names (source/columns.py)
LZ4_MAX_RATIO = 255  # an LZ4 block grows at most this much when decompressed


def decompress_stored(name: str, data: bytes) -> bytes:
    """The payload as produced, from a ledger file's compressed `payload` column (`name`:
    its `compression` column). The file has no `uncompressed_size` column: LZ4 decompresses
    into at most what a block of this size can hold, zstd's frame names its size; neither
    past `MAX_MESSAGE_SIZE`."""
    kind = STORED.get(name)
    if kind is None:
        raise errors.DataLoss(f"a payload compressed with unknown codec {name!r}")
    bound = min(MAX_MESSAGE_SIZE, max(64, len(data) * LZ4_MAX_RATIO))
    out: bytes
    try:
        if kind == LZ4:
            out = lz4.block.decompress(data, uncompressed_size=bound)
        else:
            out = _ZSTD.decompress(data, max_output_size=MAX_MESSAGE_SIZE)
    except (lz4.block.LZ4BlockError, zstandard.ZstdError) as exc:
        raise errors.DataLoss(f"a compressed payload does not decompress: {exc}") from None
    return out
