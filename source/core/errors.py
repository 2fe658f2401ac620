"""One error hierarchy for server and client, and the one table that maps it to gRPC.

Every error carries a gRPC status code, a stable `reason` (sent in trailing metadata under
`REASON_KEY`, and inside streams as `ErrorStatus.reason`) and a `retriable` flag. The server
turns an exception into a status with `to_status`; the client turns a status back into the
same class with `from_status`, so users catch `TopicNotFound`, not `grpc.RpcError`. What
the server tells a client of any other exception is `typed` (and `error_status`, its in-band
form inside streams): the one place an untyped failure becomes a typed one.
"""
from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Iterable
from typing import cast

import grpc
from google.protobuf.message import DecodeError

from shadowtopic.pb.v1 import common_pb2

REASON_KEY = "x-shadowtopic-reason"


class ShadowTopicError(Exception):
    """Base of every error the service or client raises."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    reason: str = "Internal"
    retriable: bool = False

    def __init__(self, message: str = ""):
        super().__init__(message or self.reason)
        self.message = message or self.reason


def _error(name: str, code: grpc.StatusCode, retriable: bool = False,
           base: type[ShadowTopicError] = ShadowTopicError) -> type[ShadowTopicError]:
    cls = type(name, (base,), {"code": code, "reason": name, "retriable": retriable,
                               "__doc__": f"{code.name}, reason `{name}`."})
    cls.__module__ = __name__
    return cls


S = grpc.StatusCode
InvalidArgument = _error("InvalidArgument", S.INVALID_ARGUMENT)
InvalidTopicName = _error("InvalidTopicName", S.INVALID_ARGUMENT, base=InvalidArgument)
InvalidMessageId = _error("InvalidMessageId", S.INVALID_ARGUMENT, base=InvalidArgument)
InvalidPolicies = _error("InvalidPolicies", S.INVALID_ARGUMENT, base=InvalidArgument)
MessageTooBig = _error("MessageTooBig", S.RESOURCE_EXHAUSTED)
TooManyProducers = _error("TooManyProducers", S.RESOURCE_EXHAUSTED)
TooManySubscriptions = _error("TooManySubscriptions", S.RESOURCE_EXHAUSTED)
TooManyConsumers = _error("TooManyConsumers", S.RESOURCE_EXHAUSTED)
#: a topic's backlog quota is exceeded: produce refused (action producer_exception), or held
#: past the broker's bound (producer_request_hold)
ProducerBlockedQuotaExceeded = _error("ProducerBlockedQuotaExceeded", S.RESOURCE_EXHAUSTED)
StorageFull = _error("StorageFull", S.RESOURCE_EXHAUSTED, retriable=True)
#: the broker holds its cap of memory for clients (source/broker/memory.py): new work
#: (a produce request, a subscribe) is refused until it is released
BrokerMemoryFull = _error("BrokerMemoryFull", S.RESOURCE_EXHAUSTED, retriable=True)
#: a consumer stream that took none of its queued data for the broker's bound was cut
SlowConsumer = _error("SlowConsumer", S.RESOURCE_EXHAUSTED)
TopicNotFound = _error("TopicNotFound", S.NOT_FOUND)
SubscriptionNotFound = _error("SubscriptionNotFound", S.NOT_FOUND)
LedgerNotFound = _error("LedgerNotFound", S.NOT_FOUND)
CompactionNotFound = _error("CompactionNotFound", S.NOT_FOUND)
TopicAlreadyExists = _error("TopicAlreadyExists", S.ALREADY_EXISTS)
#: no Iceberg table of that name in the catalog (source/tables.py)
TableNotFound = _error("TableNotFound", S.NOT_FOUND)
TenantNotFound = _error("TenantNotFound", S.NOT_FOUND)
NamespaceNotFound = _error("NamespaceNotFound", S.NOT_FOUND)
TenantAlreadyExists = _error("TenantAlreadyExists", S.ALREADY_EXISTS)
NamespaceAlreadyExists = _error("NamespaceAlreadyExists", S.ALREADY_EXISTS)
#: a tenant that still has namespaces, a namespace that still has topics: not deleted
NotEmpty = _error("NotEmpty", S.FAILED_PRECONDITION)
SubscriptionAlreadyExists = _error("SubscriptionAlreadyExists", S.ALREADY_EXISTS)
NotAllowed = _error("NotAllowed", S.FAILED_PRECONDITION)
HasShadowTopics = _error("HasShadowTopics", S.FAILED_PRECONDITION)
ConsumerBusy = _error("ConsumerBusy", S.FAILED_PRECONDITION)
ProducerBusy = _error("ProducerBusy", S.FAILED_PRECONDITION)
CompactionInProgress = _error("CompactionInProgress", S.FAILED_PRECONDITION)
Fenced = _error("Fenced", S.ABORTED, retriable=True)
TopicNotOwned = _error("TopicNotOwned", S.UNAVAILABLE, retriable=True)


class ServiceUnavailable(ShadowTopicError):
    """UNAVAILABLE, reason `ServiceUnavailable`: retriable (a class statement, not `_error`,
    because other errors derive from it)."""
    code = S.UNAVAILABLE
    reason = "ServiceUnavailable"
    retriable = True


class MetadataError(ShadowTopicError):
    """INTERNAL, reason `MetadataError`: the metadata store failed."""
    code = S.INTERNAL
    reason = "MetadataError"


class MetadataUnavailable(ServiceUnavailable, MetadataError):
    """UNAVAILABLE, reason `MetadataUnavailable`: the metadata store (etcd) cannot be
    reached; a client may retry."""
    code = S.UNAVAILABLE
    reason = "MetadataUnavailable"
    retriable = True


LeaseNotFound = _error("LeaseNotFound", S.UNAVAILABLE, retriable=True, base=MetadataError)
#: etcd refused this process's credentials (a wrong etcd user or password, or none where etcd
#: requires one: source/metadata/etcd.py); the message names the user
MetadataUnauthenticated = _error("MetadataUnauthenticated", S.UNAUTHENTICATED, base=MetadataError)
#: etcd refused a read or a write that the etcd user's roles do not grant (docs/SECURITY.md,
#: "etcd")
MetadataPermissionDenied = _error("MetadataPermissionDenied", S.PERMISSION_DENIED,
                                  base=MetadataError)


class RevisionCompacted(MetadataError):
    """A watch asked for a revision older than the store's compaction point (a follower
    lists again: source/metadata/follow.py)."""

    def __init__(self, message: str = "", compact_revision: int = 0):
        super().__init__(message or f"revision compacted; oldest available is {compact_revision}")
        self.compact_revision = compact_revision


ConnectError = _error("ConnectError", S.UNAVAILABLE, retriable=True, base=ServiceUnavailable)
#: the Iceberg catalog (source/tables.py) cannot be opened or answers with an error
CatalogUnavailable = _error("CatalogUnavailable", S.UNAVAILABLE, retriable=True,
                            base=ServiceUnavailable)
Timeout = _error("Timeout", S.DEADLINE_EXCEEDED, retriable=True)
ChecksumError = _error("ChecksumError", S.DATA_LOSS)
DataLoss = _error("DataLoss", S.DATA_LOSS)
Unimplemented = _error("Unimplemented", S.UNIMPLEMENTED)
Unauthenticated = _error("Unauthenticated", S.UNAUTHENTICATED)
PermissionDenied = _error("PermissionDenied", S.PERMISSION_DENIED)
Cancelled = _error("Cancelled", S.CANCELLED)
AlreadyClosed = _error("AlreadyClosed", S.FAILED_PRECONDITION)
Internal = _error("Internal", S.INTERNAL)


class StorageReadOnly(ShadowTopicError):
    """UNAVAILABLE, reason `StorageReadOnly`: the broker's data disk is read-only (EROFS), so
    it takes no writes (produce, roll, compact, cursor saves) while it still serves reads;
    retriable: writes work again once the disk is writable (or the topic moves)."""
    code = S.UNAVAILABLE
    reason = "StorageReadOnly"
    retriable = True

#: reason -> class: the registry both directions go through.
REGISTRY: dict[str, type[ShadowTopicError]] = {
    cls.reason: cls for cls in list(globals().values())
    if isinstance(cls, type) and issubclass(cls, ShadowTopicError) and cls is not ShadowTopicError
}

#: status code -> class, for statuses that arrive without a reason (e.g. from grpc itself).
_BY_CODE: dict[grpc.StatusCode, type[ShadowTopicError]] = {
    S.INVALID_ARGUMENT: InvalidArgument, S.NOT_FOUND: TopicNotFound,
    S.ALREADY_EXISTS: TopicAlreadyExists, S.FAILED_PRECONDITION: NotAllowed,
    S.RESOURCE_EXHAUSTED: MessageTooBig, S.UNAVAILABLE: ServiceUnavailable,
    S.DEADLINE_EXCEEDED: Timeout, S.DATA_LOSS: DataLoss, S.UNIMPLEMENTED: Unimplemented,
    S.UNAUTHENTICATED: Unauthenticated, S.PERMISSION_DENIED: PermissionDenied,
    S.CANCELLED: Cancelled, S.ABORTED: Fenced,
}


def to_status(err: ShadowTopicError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """(code, details, trailing metadata) for a server to abort a call with."""
    return err.code, err.message, ((REASON_KEY, err.reason),)


def from_status(code: grpc.StatusCode | None, details: str | None,
                reason: str | None) -> ShadowTopicError:
    """The typed error for a status the client received (`code` None: an in-stream error
    that named no code)."""
    cls = REGISTRY.get(reason or "")
    if cls is None:
        cls = _BY_CODE.get(code, Internal) if code is not None else Internal
    return cls(details or (code.name if code else "unknown error"))


def from_rpc_error(exc: grpc.RpcError) -> ShadowTopicError:
    reason = None
    try:
        # grpc hands (key, value) pairs, str values for keys not ending in -bin; its stubs say
        # objects with .key and .value
        pairs = cast("Iterable[tuple[str, str]]", exc.trailing_metadata() or ())
        for key, value in pairs:
            if key == REASON_KEY:
                reason = value
    except Exception:  # noqa: BLE001 - some RpcErrors carry no call metadata
        pass
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == S.UNAVAILABLE and reason is None:
        return ConnectError(details or "cannot reach the broker")
    return from_status(code, details, reason)


def from_reason(reason: str, message: str, code_name: str = "") -> ShadowTopicError:
    """The typed error for an in-stream `ErrorStatus`."""
    code = getattr(grpc.StatusCode, code_name, grpc.StatusCode.INTERNAL) if code_name else None
    return from_status(code, message, reason)


# ---- a failed write to the broker's disk -----------------------------------------------------

#: errno values that mean "the disk takes no writes now" (not a bug): the typed error of each
STORAGE_ERRNOS: dict[int, type[ShadowTopicError]] = {
    errno.ENOSPC: StorageFull, errno.EDQUOT: StorageFull, errno.EROFS: StorageReadOnly,
}


def storage_error(exc: OSError, what: str = "storage write") -> ShadowTopicError:
    """The typed error of a failed disk write: `StorageFull` (ENOSPC, EDQUOT),
    `StorageReadOnly` (EROFS), anything else `Internal`."""
    cls = STORAGE_ERRNOS.get(exc.errno or 0, Internal)
    return cls(f"{what} failed: {exc.strerror or exc}")


# ---- what a server tells a client of a failure ---------------------------------------------

log = logging.getLogger("shadowtopic.errors")
MAX_DETAILS = 1000  # characters; percent-encoded UTF-8 stays below gRPC's 16 KiB metadata


def bounded(text: str) -> str:
    """A status message cut to MAX_DETAILS characters: a message travels in trailing
    metadata, and one above gRPC's limit (an error echoing a 6 MB argument) reached the
    client as an untyped RESOURCE_EXHAUSTED instead of the error."""
    return text if len(text) <= MAX_DETAILS else text[:MAX_DETAILS] + "..."


def typed(exc: BaseException, where: str = "a handler") -> ShadowTopicError:
    """The typed error a client is told of an exception `where` let out: a typed error as it
    is; a request that does not parse `InvalidArgument`; anything else `Internal`, logged
    with its traceback (a bug to fix), a cancellation without one."""
    if isinstance(exc, ShadowTopicError):
        return exc
    if isinstance(exc, DecodeError):
        return InvalidArgument(f"malformed request: {exc}")
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:  # a full or read-only disk
        return storage_error(exc, where)
    if not isinstance(exc, asyncio.CancelledError):
        log.error("%s failed", where, exc_info=exc)
    return Internal(f"{where} failed: {type(exc).__name__}: {exc}")


def error_status(exc: BaseException, **details: str) -> common_pb2.ErrorStatus:
    """The in-band form of `typed(exc)`: what a stream reports a failed item with."""
    err = typed(exc)
    return common_pb2.ErrorStatus(code=err.code.name, reason=err.reason,
                                  message=bounded(err.message), details=details)
