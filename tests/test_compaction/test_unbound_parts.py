"""Parts used before they are wired fail with a typed error of the one error table, not an
AttributeError on None: a compacted view made without storage asked to open a pointer, and
the compaction and shadow features used before the broker binds them."""
from __future__ import annotations

import asyncio

import pytest

from shadowtopic.compaction.feature import CompactionFeature
from shadowtopic.compaction.view import CompactedView
from shadowtopic.core import errors
from shadowtopic.ledger.memory_view import MemoryView
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.shadow.feature import ShadowFeature


def test_a_compacted_view_without_storage_refuses_to_open_a_pointer():
    view = CompactedView(MemoryView())
    pointer = mpb.CompactionPointer(job_id="j1")
    with pytest.raises(errors.Internal, match="without storage"):
        asyncio.run(view.update(pointer))
    assert view.pointer is None  # nothing was swapped in
    asyncio.run(view.update(None))  # no pointer needs no storage
    assert view.pointer is None


@pytest.mark.parametrize("feature", [CompactionFeature, ShadowFeature])
def test_a_feature_used_before_bind_fails_typed(feature):
    f = feature()
    with pytest.raises(errors.Internal, match="before it is bound"):
        _ = f.host
    with pytest.raises(errors.Internal, match="before it is bound"):
        _ = f.admin
