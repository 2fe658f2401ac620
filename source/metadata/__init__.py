"""Metadata store (docs/ARCHITECTURE.md, "Metadata in etcd"): the interface, an etcd
implementation, an in-memory twin, and a helper that runs a local etcd server."""
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
from .etcd import EtcdStore
from .etcd_options import EtcdOptions
from .etcd_server import EtcdServer, find_etcd_binary
from .memory import MemoryStore

__all__ = [
    "Compare", "Delete", "EtcdOptions", "EtcdServer", "EtcdStore", "KeyValue", "LeaseNotFound",
    "MemoryStore", "MetadataError", "MetadataPermissionDenied", "MetadataStore",
    "MetadataUnauthenticated", "MetadataUnavailable", "Put",
    "RevisionCompacted", "Snapshot", "TxnResult", "WatchEvent", "find_etcd_binary",
]
