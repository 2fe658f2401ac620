"""The asyncio face is the sync client awaited: every public method of `Client`, `Producer`,
`Consumer`, `Reader`, `TableView` and `Admin` is on its asyncio twin with the same
parameters (and defaults), a coroutine where the sync one waits for the broker; the
differences are listed here, each one a decision."""
from __future__ import annotations

import inspect

import pytest

import shadowtopic
import shadowtopic.client as client
from shadowtopic.client import aio

PAIRS = [(client.Client, aio.AsyncClient), (client.Producer, aio.AsyncProducer),
         (client.Consumer, aio.AsyncConsumer), (client.Reader, aio.AsyncReader),
         (client.TableView, aio.AsyncTableView), (client.Admin, aio.AsyncAdmin)]
#: sync-only hooks the asyncio face is built on (not user calls of the asyncio face)
CORE_HOOKS = {"poll", "poll_batch", "flush_nowait", "full", "queue_message", "receipt_wait_s",
              "settle_batches_with", "wait_for_room",
              # the sync face's non-waiting acks; the asyncio face's `acknowledge` awaits
              "acknowledge_async", "acknowledge_cumulative_async",
              # what a Reader (a non-durable consumer) asks of its core
              "has_buffered", "partitions", "read_positions"}
#: what differs on purpose: name -> why
DIFFERENT = {
    # a callback in the sync face; the asyncio face returns a Future instead
    ("Producer", "send_async"): "future",
    # the sync face's listener gets the core's consumers; the asyncio one may be async
    ("Client", "subscribe_many"): "listener",
    # the asyncio face collects the records (an async iterator would hold a thread)
    ("Admin", "watch_compaction"): "collected",
}
#: calls that wait for the broker: coroutines in the asyncio face
WAITING = {"close", "create_producer", "create_reader", "subscribe", "subscribe_many",
           "table_view", "send", "flush", "receive", "batch_receive", "seek", "unsubscribe",
           "read_next", "has_message_available", "last_message_ids", "refresh", "acknowledge",
           "acknowledge_cumulative", "reconsume_later", "read_table", "read_batch"}


def public(cls: type) -> dict[str, object]:
    return {n: m for n, m in inspect.getmembers(cls) if not n.startswith("_")}


@pytest.mark.parametrize(("sync", "face"), PAIRS, ids=[s.__name__ for s, _ in PAIRS])
def test_every_sync_call_is_on_the_asyncio_face_with_the_same_parameters(sync, face):
    mine, theirs = public(face), public(sync)
    missing = set(theirs) - set(mine) - CORE_HOOKS
    assert not missing, f"{face.__name__} lacks {sorted(missing)}"
    for name, method in theirs.items():
        if name in CORE_HOOKS or not callable(method) or isinstance(method, property):
            continue
        twin = mine[name]
        params = inspect.signature(method).parameters
        twin_params = inspect.signature(twin).parameters
        if (sync.__name__, name) in DIFFERENT:
            # the common parameters agree all the same
            for p in set(params) & set(twin_params):
                assert params[p].default == twin_params[p].default, (name, p)
            continue
        assert list(twin_params) == list(params), f"{face.__name__}.{name}"
        for p in params:
            assert twin_params[p].default == params[p].default, f"{face.__name__}.{name}({p})"
        waits = inspect.iscoroutinefunction(twin)
        if sync is client.Admin or name in WAITING:
            assert waits, f"{face.__name__}.{name} must be a coroutine"
        else:
            assert not waits, f"{face.__name__}.{name} must not be a coroutine"


def test_the_asyncio_face_is_exported_beside_the_sync_one():
    for name in ("AsyncClient", "AsyncProducer", "AsyncConsumer", "AsyncReader",
                 "AsyncTableView", "AsyncAdmin"):
        assert getattr(shadowtopic, name) is getattr(aio, name) is getattr(client, name)
        assert name in shadowtopic.__all__
