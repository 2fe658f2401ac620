"""Names: the grammar of topic / namespace / subscription names, and the mapping from names
to storage paths, which must be injective and stay under the root whatever name gets in."""
from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName, canonical, check_subscription, parse_namespace
from shadowtopic.ledger import wal
from shadowtopic.ledger.managed import ManagedLedger
from shadowtopic.ledger.storage import Storage, path_segment, topic_dir
from shadowtopic.metadata import keys
from shadowtopic.metadata.memory import MemoryStore
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

# ---- grammar -----------------------------------------------------------------------------

BAD_TOPICS = [
    "", "../../etc", "public/default/..", "public/default/.", "./default/x", "a/./x",
    "persistent://../../..", "persistent://a/../x", "persistent://b/../x",
    "persistent://a/b/.hidden", "a//x", "a/b/c/d", "persistent://a/b", "x\x00y", "tópico",
    "with space", "a/b/x\n", "non-persistent://a/b/c", "http://a/b/c", "a/b/" + "x" * 500,
    "t" * 65 + "/ns/x", "t/" + "n" * 65 + "/x",
]


@pytest.mark.parametrize("text", BAD_TOPICS)
def test_invalid_topic_names_are_refused_with_a_reason(text):
    with pytest.raises(errors.InvalidTopicName) as info:
        TopicName.parse(text)
    message = info.value.message
    assert "\n" not in message and "\x00" not in message and len(message) < 300


@pytest.mark.parametrize("text, full", [
    ("my-topic", "persistent://public/default/my-topic"),
    ("t1/ns_1/a.b=c:d", "persistent://t1/ns_1/a.b=c:d"),
    ("persistent://T/N/x-partition-3", "persistent://T/N/x-partition-3"),
])
def test_valid_names_have_one_canonical_form(text, full):
    assert canonical(text) == full
    assert canonical(full) == full
    assert TopicName.parse(text) == TopicName.parse(full)


def test_partition_names_are_reserved_at_creation():
    assert TopicName.parse("x-partition-2").partition_index == 2
    for name in ("x-partition-2", "x-partition-01"):
        with pytest.raises(errors.InvalidTopicName, match="reserved"):
            TopicName.parse(name).check_creatable()
    TopicName.parse("x-partitions").check_creatable()


def test_namespaces_and_subscriptions_follow_the_grammar():
    assert parse_namespace("public/default") == "public/default"
    for bad in ("public", "a/b/c", "../x", "a/.", "a/b c"):
        with pytest.raises(errors.InvalidTopicName):
            parse_namespace(bad)
    assert check_subscription("sub-1.a=b") == "sub-1.a=b"
    for bad in ("", ".", "..", "a/b", "s" * 201, "x\x00"):
        with pytest.raises(errors.InvalidArgument):
            check_subscription(bad)


# ---- storage paths -----------------------------------------------------------------------

_SEGMENT_OK = re.compile(r"[A-Za-z0-9_\-~][A-Za-z0-9_.\-~]*")


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=400))
def test_every_segment_is_one_safe_path_component(name):
    seg = path_segment(name)
    assert _SEGMENT_OK.fullmatch(seg), seg
    assert seg not in (".", "..") and "=" not in seg and ":" not in seg
    assert len(seg.encode()) < 255


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=300), st.text(max_size=300))
def test_segments_are_injective(a, b):
    if a != b:
        assert path_segment(a) != path_segment(b)


def test_long_names_differing_at_the_end_stay_apart():
    a, b = "x" * 300 + "a", "x" * 300 + "b"
    assert path_segment(a) != path_segment(b)
    assert path_segment("~") != path_segment("") != path_segment("~~")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=3, max_size=3))
def test_topic_dirs_never_leave_the_root(parts):
    """Whatever a TopicName holds (validation bypassed), its directory is under the root."""
    root = "/storage-root"
    path = os.path.normpath(os.path.join(root, "ledgers", topic_dir(TopicName(*parts))))
    assert path.startswith(root + "/ledgers/persistent/")
    assert path.count("/") == 6


def test_names_that_used_to_share_a_folder_keep_every_acknowledged_message(tmp_path):
    """`persistent://a/../x` and `persistent://b/../x` once mapped to one folder: the second
    owner's sweep deleted the first topic's WAL as an orphan. Built here without validation
    (as if a name got past it), both keep everything they acknowledged across a restart."""
    import asyncio

    store = MemoryStore()
    storage = Storage(str(tmp_path / "storage"))
    executor = ThreadPoolExecutor(4)
    topics = [TopicName("a", "..", "x"), TopicName("b", "..", "x")]
    epoch = [0]

    async def open_ledger(topic: TopicName) -> ManagedLedger:
        epoch[0] += 1
        own_key = keys.ownership("c", topic)
        value = mpb.Ownership(broker_id="b", epoch=epoch[0]).SerializeToString()
        await store.put(own_key, value)
        return await ManagedLedger.open(topic, store, storage, own_key, value, epoch[0],
                                        executor)

    async def read_all(ml: ManagedLedger) -> list[bytes]:
        out, pos = [], MessageId(0, 0)
        while got := await ml.read(pos, 1000, 1 << 30):
            out += [e.raw for e in got]
            pos = MessageId(got[-1].ledger_id, got[-1].entry_id + 1)
        return out

    async def main():
        acked = {}
        for t in topics:
            ml = await open_ledger(t)
            raws = [f"{t.tenant}-{i}".encode() for i in range(2)]
            await ml.append(raws, wal.request_bytes(raws), sum(map(len, raws)))
            acked[t] = raws
            # the broker dies here: no close, the open ledgers stay in their WALs
        for t in topics:  # restart: a new owner recovers each topic
            ml = await open_ledger(t)
            assert await read_all(ml) == acked[t], t
            raws = [f"{t.tenant}-new".encode()]
            await ml.append(raws, wal.request_bytes(raws), len(raws[0]))
            acked[t] = acked[t] + raws
        for t in topics:  # and once more: the new open ledgers were not swept either
            ml = await open_ledger(t)
            assert await read_all(ml) == acked[t], t
        root = os.path.realpath(storage.base)
        for dirpath, _, _files in os.walk(root):
            assert os.path.realpath(dirpath).startswith(root)

    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        executor.shutdown(wait=True)
