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

**etcd's auth** (`EtcdOptions`: source/metadata/etcd_options.py; docs/SECURITY.md, "etcd").
With a user, the store authenticates (etcd's `Authenticate`) before its first call and
sends the token etcd gave it with every call and with each watch stream it opens. etcd's
default (simple) tokens live in its memory: an etcd restart, the token's TTL or a new
password ends them (JWT tokens carry the auth store's revision: a change of users or roles
ends those), and etcd then refuses the call ("invalid auth token", "revision of auth store
is old"). The store then authenticates again, once for all the calls that saw the same
token, and sends the call again: the refused call changed nothing, a write included. A
watch stream whose creation etcd cancels for its token is opened again with the new one
(it delivered nothing yet, so from the same revision). etcd3's
own user and password arguments are not used: it authenticates once, in its constructor
(where an etcd away fails the store's creation), and it sends the token as per-call
credentials, which gRPC refuses on a plaintext channel. A user whose etcd has auth off works
anonymously until auth is turned on. What etcd refuses is typed: a wrong password, no user
where one is required, or a token refused again after a new one `MetadataUnauthenticated`
("etcd refused user broker: ..."); a key the user's roles do not grant
`MetadataPermissionDenied`. With `ca_file` the store dials etcd with TLS only (and its own
certificate with `cert_file`, `key_file`).
"""
from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import etcd3
import grpc
from etcd3 import etcdrpc
from etcd3 import exceptions as etcd_exc
from etcd3 import transactions as etcd_txn
from etcd3 import utils as etcd_utils

from shadowtopic import failpoints
from shadowtopic.core.errors import ShadowTopicError

from .base import (
    Compare,
    Delete,
    KeyValue,
    LeaseNotFound,
    MetadataError,
    MetadataPermissionDenied,
    MetadataStore,
    MetadataUnauthenticated,
    MetadataUnavailable,
    Put,
    RevisionCompacted,
    Snapshot,
    TxnResult,
    WatchEvent,
)
from .etcd_options import EtcdOptions

T = TypeVar("T")
#: an object of the etcd3 module (its protobuf messages, stubs, calls): it has no type stubs
EtcdObject = Any


@dataclass(frozen=True)
class _Refused:
    """etcd refused a watch stream's token or its user before it delivered anything."""
    reason: str


#: what a watch's reader thread hands the loop: events, the error that ended it, etcd's
#: refusal of its credentials, or None at the end of a closed store's watch
_WatchItem = list[WatchEvent] | BaseException | _Refused | None

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
    # a keepalive due while another ping is unanswered waits on that one (60 s by default)
    ("grpc.http2.ping_timeout_ms", 5_000),
]
_UNAVAILABLE_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                      grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
                      grpc.StatusCode.INTERNAL, grpc.StatusCode.RESOURCE_EXHAUSTED}
_COMPARE_TARGETS = {"version": etcd_txn.Version, "create_revision": etcd_txn.Create,
                    "mod_revision": etcd_txn.Mod, "value": etcd_txn.Value}
#: what etcd says of a token it no longer takes, or of a call without one: authenticate again
_TOKEN_REFUSED = ("invalid auth token", "user name is empty", "auth store is old",
                  "auth token is expired", "auth token expired")


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


class EtcdClient(etcd3.MultiEndpointEtcd3Client):  # type: ignore[misc]  # etcd3: untyped
    """etcd3's client with the token of etcd's auth set from outside (`use_token`): every
    etcd3 call sends `metadata`; its per-call credentials stay unset (gRPC refuses them on a
    plaintext channel)."""

    def use_token(self, token: str | None) -> None:
        """Send `token` with every call from now on (None: none)."""
        self.metadata = (("token", token),) if token else None
        self.call_credentials = None


def make_client(endpoints: str, timeout: float, options: EtcdOptions | None = None
                ) -> EtcdClient:
    """An etcd3 client that does not blacklist its endpoint after one failure (etcd3's
    default `time_retry=300` makes a single-endpoint client raise ValueError for 5 min),
    dialling with TLS when `options` has a CA file. It does not authenticate: see
    `authenticate`."""
    options = options or EtcdOptions()
    parsed = _parse_endpoints(endpoints)
    multi = len(parsed) > 1
    creds = options.channel_credentials()
    eps = [etcd3.Endpoint(host, port, secure=creds is not None, creds=creds,
                          time_retry=1.0 if multi else 0.0, opts=_GRPC_OPTIONS)
           for host, port in parsed]
    return EtcdClient(endpoints=eps, timeout=timeout, failover=multi)


def authenticate(client: EtcdClient, user: str, password: str, timeout: float) -> str | None:
    """etcd's token for `user` (None when etcd's auth is off). `MetadataUnauthenticated`
    when etcd refuses the user or the password; an unreachable endpoint is marked failed
    (the next call goes to another member) and raised as etcd3 raises it."""
    try:
        resp = client.authstub.Authenticate(
            etcdrpc.AuthenticateRequest(name=user, password=password), timeout)
    except grpc.RpcError as exc:
        details = exc.details() or ""
        if "authentication is not enabled" in details:
            return None
        if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED,
                          grpc.StatusCode.PERMISSION_DENIED):
            raise MetadataUnauthenticated(f"etcd refused user {user}: {details}") from None
        # etcd3's failover bookkeeping has no public form; it always raises
        client._manage_grpc_errors(exc)  # noqa: SLF001
        raise
    return str(resp.token)


class _Login:
    """A store's etcd session as its user: authenticated before the first call, again when
    etcd refuses the token (module doc). `generation` counts the authentications: a call
    that saw generation g and was refused asks for `renew(g)`, and of the calls refused
    together only the first authenticates."""

    def __init__(self, client: EtcdClient, options: EtcdOptions, timeout: float):
        assert options.user is not None
        self.user = options.user
        self._client = client
        self._options = options
        self._timeout = timeout
        self._lock = threading.Lock()
        self.generation = 0

    def current(self) -> int:
        """The generation of the token in use, authenticating first when there is none."""
        if self.generation == 0:
            self.renew(0)
        return self.generation

    def renew(self, seen: int) -> None:
        """Authenticate again, unless another call did since generation `seen`."""
        with self._lock:
            if self.generation != seen:
                return
            try:
                password = self._options.read_password()
            except (OSError, ValueError) as exc:
                raise MetadataUnauthenticated(
                    f"etcd user {self.user}: cannot read its password: {exc}") from None
            self._client.use_token(authenticate(self._client, self.user, password,
                                                self._timeout))
            self.generation += 1


def _range_end(prefix: str) -> tuple[bytes, bytes]:
    key = prefix.encode()
    if not key:
        return b"\0", b"\0"  # the whole keyspace
    return key, etcd_utils.prefix_range_end(key)


def _kv(kv: EtcdObject) -> KeyValue:
    return KeyValue(kv.key.decode(), kv.value, kv.create_revision, kv.mod_revision,
                    kv.version, kv.lease)


def _refusal(details: str, user: str | None) -> ShadowTopicError:
    """The typed error of etcd's refusal `details` (of a call, or of a watch's creation)."""
    who = f"user {user}" if user else "this client (no etcd user: --etcd-user)"
    if "permission denied" in details:
        return MetadataPermissionDenied(f"etcd refused {who}: {details}")
    return MetadataUnauthenticated(f"etcd refused {who}: {details}")


def _refused(details: str) -> bool:
    """etcd's answer `details` refuses the caller's credentials or its roles' grants."""
    return "permission denied" in details or any(t in details for t in _TOKEN_REFUSED)


def _token_refused(exc: BaseException) -> bool:
    """`exc` is etcd refusing the call's token (or its lack of one): authenticate again."""
    rpc = exc if isinstance(exc, grpc.RpcError) else exc.__context__
    if not isinstance(rpc, grpc.RpcError) or not hasattr(rpc, "code"):
        return False
    details = rpc.details() or ""
    return (rpc.code() == grpc.StatusCode.UNAUTHENTICATED
            or any(t in details for t in _TOKEN_REFUSED))


def map_error(exc: BaseException, user: str | None = None) -> BaseException:
    """Translate etcd3/grpc exceptions into the MetadataError hierarchy (`user`: the etcd
    user the store authenticates as, named in a refusal)."""
    if isinstance(exc, MetadataError):
        return exc
    rpc = exc if isinstance(exc, grpc.RpcError) else exc.__context__
    if isinstance(rpc, grpc.RpcError) and hasattr(rpc, "code"):
        code, details = rpc.code(), (rpc.details() or "")
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or (
                code == grpc.StatusCode.INVALID_ARGUMENT and _refused(details)):
            return _refusal(details, user)
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


class _WatchStream:
    """One gRPC Watch stream of a `watch_prefix`: its call, the requests it sends (the
    create request, then None to end), and `done`, set once its events are not wanted."""

    def __init__(self, create: EtcdObject):
        self.requests: queue.Queue[EtcdObject | None] = queue.Queue()
        self.requests.put(create)
        self.done = threading.Event()
        self.call: EtcdObject = None

    def request_iter(self) -> Iterator[EtcdObject]:
        while (rq := self.requests.get()) is not None:
            yield rq

    def close(self) -> None:
        self.done.set()
        self.requests.put(None)
        if self.call is not None:
            self.call.cancel()


class EtcdStore(MetadataStore):
    """The store over etcd (module doc); `options`: its etcd user and TLS."""

    def __init__(self, endpoints: str = "127.0.0.1:2379", timeout: float = 5.0,
                 max_workers: int = 16, options: EtcdOptions | None = None):
        self.endpoints = endpoints
        self.timeout = timeout
        self.options = options or EtcdOptions()
        self._client = make_client(endpoints, timeout, self.options)
        self._login = (_Login(self._client, self.options, timeout)
                       if self.options.user is not None else None)
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

    def _authenticated(self, fn: Callable[..., T]) -> Callable[..., T]:
        """`fn`, after the store's login, and once more after a new login when etcd refused
        its token (module doc)."""
        login = self._login
        if login is None:
            return fn

        def run(*args: object) -> T:
            seen = login.current()
            try:
                return fn(*args)
            except Exception as exc:
                if not _token_refused(exc):
                    raise
            login.renew(seen)
            return fn(*args)
        return run

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        if self._closed:
            raise MetadataUnavailable("store closed")
        loop = asyncio.get_running_loop()
        run = self._failing_over(self._authenticated(fn), getattr(fn, "idempotent", False))
        try:
            return await loop.run_in_executor(self._pool, run, *args)
        except Exception as exc:
            if self._closed:
                raise MetadataUnavailable("store closed") from exc
            mapped = map_error(exc, self.options.user)
            if mapped is exc:
                raise
            raise mapped from exc

    async def check_access(self) -> None:
        """Authenticate now when the store has a user: `MetadataUnauthenticated` at once for
        a wrong user or password (a process checks it at start), `MetadataUnavailable` while
        etcd does not answer. Without a user, nothing."""
        if self._login is not None:
            await self._call(_idempotent(lambda: None))

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
                resp = self._raw(lambda: self._client.kvstub.DeleteRange(
                    req, self.timeout, metadata=self._client.metadata))
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
        resp = await self._call(self._raw, lambda: self._client.kvstub.Txn(
            request, self.timeout, metadata=self._client.metadata))
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
        key, end = _range_end(prefix)
        create = etcdrpc.WatchRequest(create_request=etcdrpc.WatchCreateRequest(
            key=key, range_end=end, start_revision=max(start_revision, 0)))
        login = self._login
        seen = 0
        if login is not None:  # the stream carries the token: log in first
            seen = await self._call(_idempotent(login.current))
        stream = self._open_watch(prefix, create, loop, events)
        renewed = False
        try:
            while True:
                item = await events.get()
                if item is None:
                    return
                if isinstance(item, _Refused):
                    if login is None or renewed:
                        raise _refusal(item.reason, self.options.user)
                    # the token etcd refused: a new one, and the stream again (it delivered
                    # nothing yet, so from the same revision)
                    renewed = True
                    self._close_watch(stream)
                    await self._call(_idempotent(lambda: login.renew(seen)))
                    stream = self._open_watch(prefix, create, loop, events)
                    continue
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._close_watch(stream)

    def _open_watch(self, prefix: str, create: EtcdObject, loop: asyncio.AbstractEventLoop,
                    events: asyncio.Queue[_WatchItem]) -> _WatchStream:
        """A Watch stream for `create` on the client's channel, with the token in use, and
        its reader thread, which hands what it reads to `events` on `loop`."""
        stream = _WatchStream(create)
        try:
            stream.call = etcdrpc.WatchStub(self._client.channel).Watch(
                stream.request_iter(), metadata=self._client.metadata)
        except Exception as exc:
            raise map_error(exc, self.options.user) from exc
        with self._lock:
            self._watch_calls.add((stream.call, stream.requests))

        def deliver(item: _WatchItem) -> None:
            if stream.done.is_set():
                return
            try:
                loop.call_soon_threadsafe(events.put_nowait, item)
            except RuntimeError:  # loop closed
                stream.done.set()

        def reader() -> None:
            delivered = False
            try:
                for resp in stream.call:
                    if resp.compact_revision:
                        deliver(RevisionCompacted(compact_revision=resp.compact_revision))
                        return
                    if resp.canceled:
                        reason = resp.cancel_reason or ""
                        deliver(_Refused(reason) if _refused(reason) and not delivered else
                                MetadataUnavailable(f"etcd watch canceled: {reason}"))
                        return
                    if resp.events:
                        failpoints.hit("metadata.watch.events")
                        delivered = True
                        deliver([WatchEvent("delete" if ev.type == ev.DELETE else "put",
                                            ev.kv.key.decode(), ev.kv.value, ev.kv.mod_revision)
                                 for ev in resp.events])
                deliver(MetadataUnavailable("etcd watch stream ended"))
            except grpc.RpcError as exc:
                if self._closed and exc.code() == grpc.StatusCode.CANCELLED:
                    deliver(None)  # store closed: end the iteration
                elif _token_refused(exc) and not delivered:
                    deliver(_Refused(exc.details() or exc.code().name))
                else:
                    deliver(MetadataUnavailable(
                        f"etcd watch broken: {exc.code().name} {exc.details()}"))
            except Exception as exc:  # pragma: no cover - defensive
                deliver(MetadataUnavailable(f"etcd watch failed: {exc!r}"))

        threading.Thread(target=reader, name=f"etcd-watch {prefix}", daemon=True).start()
        return stream

    def _close_watch(self, stream: _WatchStream) -> None:
        """End `stream`: its reader delivers nothing more."""
        stream.close()
        with self._lock:
            self._watch_calls.discard((stream.call, stream.requests))

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
