"""Replication of source topics to their shadows (the source side)."""
from source.replication.replicator import ShadowReplicator

__all__ = ["ShadowReplicator"]
