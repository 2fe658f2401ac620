"""Durable cursors: the per-subscription state (state.py), the stores that persist every
cursor of a topic in batches (store.py: interface and in-memory twin; snapshot.py: files on
storage named by an etcd pointer) and the per-topic flusher (flusher.py)."""
from .flusher import CursorFlusher
from .snapshot import SnapshotCursorStore
from .state import CursorState, NextAfter, next_after_in
from .store import CursorStore, Fence, MemoryCursorStore

__all__ = ["CursorFlusher", "CursorState", "CursorStore", "Fence", "MemoryCursorStore",
           "NextAfter", "SnapshotCursorStore", "next_after_in"]
