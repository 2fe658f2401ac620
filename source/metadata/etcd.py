"""`EtcdStore`: the metadata store over a real etcd through the (sync) `etcd3` module.

Unary calls run in a thread pool (`run_in_executor`). Watches do not use etcd3's shared
`Watcher` (in python3-etcd3 0.13 its stream thread dies with a NameError on `six` when the
stream breaks, so callbacks never learn that etcd went away): each `watch_prefix` opens its
own gRPC Watch stream on the client's channel, read by a daemon thread that hands responses
to the loop with `call_soon_threadsafe`.

Several endpoints (`host:port,host:port,...`: the members of one etcd cluster) make a client
that fails over (etcd3's `MultiEndpointEtcd3Client`): an endpoint whose call failed
UNAVAILABLE or DEADLINE_EXCEEDED is set aside for a second and the next call goes to
another. etcd3 does not retry the call itself, so a store call does, once per other
endpoint, when the failed one refused the connection (the request never reached etcd:
safe for writes too) or, for reads, plain puts and lease keep-alives (the same state when
applied twice; never a transaction, whose compares would then fail), on any UNAVAILABLE
(a killed member's open connection fails with "Stream removed"): a client whose member was
killed goes on without a failed call (tests/test_integration/test_etcd_cluster.py).
"""
from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import etcd3
import grpc
from etcd3 import etcdrpc
from etcd3 import exceptions as etcd_exc
from etcd3 import transactions as etcd_txn
from etcd3 import utils as etcd_utils

from shadowtopic import failpoints

from .base import (
    Compare,
    Delete,
    KeyValue,
    LeaseNotFound,
    MetadataError,
    MetadataStore,
    MetadataUnavailable,
    Put,
    RevisionCompacted,
    Snapshot,
    TxnResult,
    WatchEvent,
)

T = TypeVar("T")
#: an object of the etcd3 module (its protobuf messages, stubs, calls): it has no type stubs
EtcdObject = Any
#: what a watch's reader thread hands the loop: events, the error that ended it, or None at
#: the end of a closed store's watch
_WatchItem = list[WatchEvent] | BaseException | None

# Reconnect quickly after etcd comes back (gRPC's default backoff grows to 2 minutes) and
# notice a hung (not closed) connection on long-lived watch streams. etcd refuses pings
# more often than every 5 s (--grpc-keepalive-min-time), so stay above that.
#: keys a range read asks for at once (`get_prefix` reads a prefix page by page)
PAGE_KEYS = 5_000
_GRPC_OPTIONS = [
    # a page of large values, or a watch response of many events (a transaction's): etcd's
    # own request limit is 10 MiB here (etcd_server.py), gRPC's default receive limit 4 MiB
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
]
_UNAVAILABLE_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                      grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
                      grpc.StatusCode.INTERNAL, grpc.StatusCode.RESOURCE_EXHAUSTED}
_COMPARE_TARGETS = {"version": etcd_txn.Version, "create_revision": etcd_txn.Create,
                    "mod_revision": etcd_txn.Mod, "value": etcd_txn.Value}


def _parse_endpoints(endpoints: str) -> list[tuple[str, int]]:
    out = []
    for item in endpoints.split(","):
        item = item.strip().removeprefix("http://")
        if item:
            host, _, port = item.rpartition(":")
            out.append((host or "127.0.0.1", int(port or 2379)))
    if not out:
        raise ValueError(f"no etcd endpoint in {endpoints!r}")
    return out


def make_client(endpoints: str, timeout: float) -> etcd3.MultiEndpointEtcd3Client:
    """An etcd3 client that does not blacklist its endpoint after one failure (etcd3's
    default `time_retry=300` makes a single-endpoint client raise ValueError for 5 min)."""
    parsed = _parse_endpoints(endpoints)
    multi = len(parsed) > 1
    eps = [etcd3.Endpoint(host, port, secure=False, time_retry=1.0 if multi else 0.0,
                          opts=_GRPC_OPTIONS) for host, port in parsed]
    return etcd3.MultiEndpointEtcd3Client(endpoints=eps, timeout=timeout, failover=multi)


def _range_end(prefix: str) -> tuple[bytes, bytes]:
    key = prefix.encode()
    if not key:
        return b"\0", b"\0"  # the whole keyspace
    return key, etcd_utils.prefix_range_end(key)


def _kv(kv: EtcdObject) -> KeyValue:
    return KeyValue(kv.key.decode(), kv.value, kv.create_revision, kv.mod_revision,
                    kv.version, kv.lease)


def _map_error(exc: BaseException) -> BaseException:
    """Translate etcd3/grpc exceptions into the MetadataError hierarchy."""
    if isinstance(exc, MetadataError):
        return exc
    rpc = exc if isinstance(exc, grpc.RpcError) else exc.__context__
    if isinstance(rpc, grpc.RpcError) and hasattr(rpc, "code"):
        code, details = rpc.code(), (rpc.details() or "")
        if code == grpc.StatusCode.NOT_FOUND and "lease" in details:
            return LeaseNotFound(details)
        if code in _UNAVAILABLE_CODES:
            return MetadataUnavailable(f"metadata store unavailable: etcd: {code.name} {details}")
        if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE):
            return ValueError(f"etcd: {details}")
        return MetadataError(f"etcd: {code.name} {details}")
    if isinstance(exc, (etcd_exc.Etcd3Exception, grpc.RpcError)):
        return MetadataUnavailable(f"metadata store unavailable: etcd: {exc!r}")
    if isinstance(exc, ValueError) and ("failed node" in str(exc) or "closed channel" in str(exc)):
        return MetadataUnavailable(f"metadata store unavailable: etcd: {exc}")
    return exc


def _idempotent(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` marked safe to send again to another member after any UNAVAILABLE (a read)."""
    def run(*args: object) -> T:
        return fn(*args)
    run.idempotent = True  # type: ignore[attr-defined]
    return run


def _endpoint_failed(exc: BaseException, idempotent: bool) -> bool:
    """The call failed at its endpoint in a way another member may not: the connection was
    refused (the request never left), or any UNAVAILABLE for an idempotent call."""
    rpc = exc if isinstance(exc, grpc.RpcError) else exc.__context__
    if not isinstance(rpc, grpc.RpcError) or not hasattr(rpc, "code"):
        return False
    if rpc.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = (rpc.details() or "").lower()
    return idempotent or "failed to connect" in details or "connection refused" in details


def _compare(c: Compare) -> EtcdObject:
    if c.target not in _COMPARE_TARGETS or c.op not in ("==", "!=", "<", ">"):
        raise ValueError(f"bad compare {c}")
    if c.target == "value" and c.operand is None:
        # "value is None" = the key is missing; etcd cannot compare a missing value.
        if c.op not in ("==", "!="):
            raise ValueError(f"value compare with None supports only == and !=: {c}")
        cmp = etcd_txn.Version(c.key)
        return (cmp == 0) if c.op == "==" else (cmp > 0)
    if c.target == "value":
        if not isinstance(c.operand, bytes):
            raise ValueError(f"value compare needs bytes or None: {c}")
    elif not isinstance(c.operand, int) or isinstance(c.operand, bool):
        raise ValueError(f"{c.target} compare needs an int: {c}")
    cmp = _COMPARE_TARGETS[c.target](c.key)
    return {"==": cmp.__eq__, "!=": cmp.__ne__, "<": cmp.__lt__, ">": cmp.__gt__}[c.op](c.operand)


def _op(op: Put | Delete) -> EtcdObject:
    if isinstance(op, Put):
        return etcd_txn.Put(op.key, op.value, lease=op.lease or None)
    if isinstance(op, Delete):
        if op.prefix:
            key, end = _range_end(op.key)
            return etcd_txn.Delete(key, range_end=end)
        return etcd_txn.Delete(op.key)
    raise TypeError(f"not a txn op: {op!r}")


class EtcdStore(MetadataStore):
    def __init__(self, endpoints: str = "127.0.0.1:2379", timeout: float = 5.0,
                 max_workers: int = 16):
        self.endpoints = endpoints
        self.timeout = timeout
        self._client = make_client(endpoints, timeout)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="etcd")
        self._closed = False
        self._watch_calls: set[tuple[EtcdObject, queue.Queue[EtcdObject | None]]] = set()
        self._lock = threading.Lock()

    def _raw(self, fn: Callable[[], T]) -> T:
        """Run a raw stub call; let etcd3 see its errors (endpoint failover bookkeeping)."""
        try:
            return fn()
        except grpc.RpcError as exc:
            # etcd3's failover bookkeeping has no public form; it always raises
            self._client._manage_grpc_errors(exc)  # noqa: SLF001
            raise

    def _failing_over(self, fn: Callable[..., T], idempotent: bool) -> Callable[..., T]:
        """`fn`, called again on the next endpoint when the endpoint it went to failed
        (see the module doc); once per endpoint at most."""
        tries = len(self._client.endpoints) if self._client.failover else 1
        if tries == 1:
            return fn

        def run(*args: object) -> T:
            for attempt in range(tries):
                try:
                    return fn(*args)
                except Exception as exc:
                    if attempt + 1 >= tries or not _endpoint_failed(exc, idempotent):
                        raise
            raise AssertionError("unreachable")
        return run

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        if self._closed:
            raise MetadataUnavailable("store closed")
        loop = asyncio.get_running_loop()
        run = self._failing_over(fn, getattr(fn, "idempotent", False))
        try:
            return await loop.run_in_executor(self._pool, run, *args)
        except Exception as exc:
            if self._closed:
                raise MetadataUnavailable("store closed") from exc
            mapped = _map_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    # ---- KV ---------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        resp = await self._call(_idempotent(self._client.get_response), key)
        return _kv(resp.kvs[0]) if resp.kvs else None

    async def get_prefix(self, prefix: str) -> Snapshot:
        """Every key under `prefix` at one revision, read PAGE_KEYS at a time (one range of
        100,000 subscriptions was 10 MB: past gRPC's message limit, the broker could not
        load their topic)."""
        key, end = _range_end(prefix)
        kvs: list[KeyValue] = []
        revision = None
        while True:
            resp = await self._call(_idempotent(
                lambda k=key, r=revision: self._client.get_range_response(
                    k, end, sort_order="ascend", limit=PAGE_KEYS, revision=r)))
            kvs.extend(_kv(kv) for kv in resp.kvs)
            if revision is None:
                revision = resp.header.revision
            if not resp.more or not resp.kvs:
                return Snapshot(kvs, revision)
            key = resp.kvs[-1].key + b"\0"  # the first key after the last one read

    async def get_keys(self, prefix: str, after: str = "", limit: int = 1000) -> list[str]:
        key, end = _range_end(prefix)
        if after and after.encode() >= key:
            key = after.encode() + b"\0"  # the first key after `after`
        resp = await self._call(_idempotent(lambda: self._client.get_range_response(
            key, end, sort_order="ascend", keys_only=True, limit=limit)))
        return [kv.key.decode() for kv in resp.kvs]

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        # a plain put again is the same state: sent to the next member on any UNAVAILABLE
        resp = await self._call(_idempotent(self._client.put), key, value, lease or None)
        return int(resp.header.revision)

    async def delete(self, key: str, prefix: bool = False) -> int:
        def run() -> int:
            if prefix:
                k, end = _range_end(key)
                req = etcdrpc.DeleteRangeRequest(key=k, range_end=end)
                resp = self._raw(lambda: self._client.kvstub.DeleteRange(req, self.timeout))
                return int(resp.deleted)
            return int(self._client.delete(key, return_response=True).deleted)
        return await self._call(run)

    async def txn(self, compares: Sequence[Compare], success: Sequence[Put | Delete],
                  failure: Sequence[Put | Delete] = ()) -> TxnResult:
        # etcd3's `transaction()` drops the response header (the revision), so build the
        # request with etcd3's helpers and call the KV stub ourselves.
        request = etcdrpc.TxnRequest(
            compare=[_compare(c).build_message() for c in compares],
            # etcd3's only way to turn ops into RequestOps is private
            success=self._client._ops_to_requests([_op(o) for o in success]),  # noqa: SLF001
            failure=self._client._ops_to_requests([_op(o) for o in failure]))  # noqa: SLF001
        resp = await self._call(self._raw, lambda: self._client.kvstub.Txn(request, self.timeout))
        return TxnResult(resp.succeeded, resp.header.revision)

    # ---- leases -----------------------------------------------------------------------------

    async def grant_lease(self, ttl: int) -> int:
        if ttl < 1:
            raise ValueError("lease ttl must be >= 1 s")
        lease = await self._call(self._client.lease, ttl)
        return int(lease.id)

    async def refresh_lease(self, lease: int) -> None:
        responses = await self._call(_idempotent(lambda: list(self._client.refresh_lease(lease))))
        if not responses or responses[0].TTL <= 0:  # etcd answers TTL 0 for an unknown lease
            raise LeaseNotFound(f"lease {lease:x} not found")

    async def revoke_lease(self, lease: int) -> None:
        await self._call(self._client.revoke_lease, lease)

    async def compact(self, revision: int) -> None:
        try:
            await self._call(self._client.compact, revision)
        except ValueError as exc:
            if "compacted" in str(exc):
                return  # already compacted at or past `revision`: nothing to do
            raise MetadataError(str(exc)) from exc

    # ---- watch ------------------------------------------------------------------------------

    async def watch_prefix(self, prefix: str,
                           start_revision: int) -> AsyncIterator[list[WatchEvent]]:
        if self._closed:
            raise MetadataUnavailable("store closed")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[_WatchItem] = asyncio.Queue()
        requests: queue.Queue[EtcdObject | None] = queue.Queue()
        key, end = _range_end(prefix)
        requests.put(etcdrpc.WatchRequest(create_request=etcdrpc.WatchCreateRequest(
            key=key, range_end=end, start_revision=max(start_revision, 0))))
        done = threading.Event()

        def deliver(item: _WatchItem) -> None:
            if done.is_set():
                return
            try:
                loop.call_soon_threadsafe(events.put_nowait, item)
            except RuntimeError:  # loop closed
                done.set()

        def request_iter() -> Iterator[EtcdObject]:
            while (rq := requests.get()) is not None:
                yield rq

        try:
            call = etcdrpc.WatchStub(self._client.channel).Watch(request_iter())
        except Exception as exc:
            raise _map_error(exc) from exc
        with self._lock:
            self._watch_calls.add((call, requests))

        def reader() -> None:
            try:
                for resp in call:
                    if resp.compact_revision:
                        deliver(RevisionCompacted(compact_revision=resp.compact_revision))
                        return
                    if resp.canceled:
                        deliver(MetadataUnavailable(f"etcd watch canceled: {resp.cancel_reason}"))
                        return
                    if resp.events:
                        failpoints.hit("metadata.watch.events")
                        deliver([WatchEvent("delete" if ev.type == ev.DELETE else "put",
                                            ev.kv.key.decode(), ev.kv.value, ev.kv.mod_revision)
                                 for ev in resp.events])
                deliver(MetadataUnavailable("etcd watch stream ended"))
            except grpc.RpcError as exc:
                if self._closed and exc.code() == grpc.StatusCode.CANCELLED:
                    deliver(None)  # store closed: end the iteration
                else:
                    deliver(MetadataUnavailable(
                        f"etcd watch broken: {exc.code().name} {exc.details()}"))
            except Exception as exc:  # pragma: no cover - defensive
                deliver(MetadataUnavailable(f"etcd watch failed: {exc!r}"))

        threading.Thread(target=reader, name=f"etcd-watch {prefix}", daemon=True).start()
        try:
            while True:
                item = await events.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            done.set()
            requests.put(None)
            call.cancel()
            with self._lock:
                self._watch_calls.discard((call, requests))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            calls = list(self._watch_calls)
        for call, requests in calls:
            requests.put(None)
            call.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()
