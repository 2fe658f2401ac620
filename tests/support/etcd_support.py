"""The session's etcd as a test reads and writes it: `on_etcd(server, op)` runs `op(store)`
on a fresh EtcdStore and closes it; `etcd_get`, `etcd_put` and `etcd_prefix` are the usual
ops (tried again when the store could not connect)."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from shadowtopic.core.errors import MetadataUnavailable
from shadowtopic.metadata import EtcdStore, KeyValue

T = TypeVar("T")


def on_etcd(etcd_server, op: Callable[[EtcdStore], Awaitable[T]]) -> T:
    async def run() -> T:
        store = EtcdStore(etcd_server.endpoint)
        try:
            return await op(store)
        finally:
            await store.close()
    return asyncio.run(run())


def _again(etcd_server, op: Callable[[EtcdStore], Awaitable[T]], tries: int = 3) -> T:
    """`on_etcd` of an op that may run twice (a read, a plain put), tried again when the
    connection failed: a fresh channel's first connect has timed out on a loaded machine."""
    for attempt in range(tries):
        try:
            return on_etcd(etcd_server, op)
        except MetadataUnavailable:
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def etcd_get(etcd_server, key: str) -> KeyValue | None:
    return _again(etcd_server, lambda store: store.get(key))


def etcd_put(etcd_server, key: str, value: bytes) -> None:
    _again(etcd_server, lambda store: store.put(key, value))


def etcd_prefix(etcd_server, prefix: str) -> dict[str, KeyValue]:
    """key -> KeyValue of every key under `prefix`."""
    snap = _again(etcd_server, lambda store: store.get_prefix(prefix))
    return {kv.key: kv for kv in snap.items}
