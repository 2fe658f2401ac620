"""Table views (`Client.table_view`) against real brokers: the latest message of every key,
loaded from the compacted view and the tail, then kept current while a producer writes, a
compaction lands and the source broker is killed with -9 and restarted; on a shadow as on
its source; over the partitions of a partitioned topic. Each view is compared with a model
of the topic built from what the producer was acknowledged, in order."""
from __future__ import annotations

import random
import threading
import time

import pytest
from support.compacted_read import produce, publish_compaction

from shadowtopic.client import Client, errors


def model(items: list[tuple[str, str]]) -> dict[str, str]:
    """key -> latest value; an empty value deletes the key (a tombstone)."""
    state: dict[str, str] = {}
    for key, value in items:
        if value:
            state[key] = value
        else:
            state.pop(key, None)
    return state


def as_dict(view) -> dict[str, str]:
    return {key: msg.value() for key, msg in view.items()}


def items(n: int, keys: int, seed: int, prefix: str) -> list[tuple[str, str]]:
    """`n` writes over `keys` keys, about one in eight a delete."""
    rnd = random.Random(seed)
    return [(f"k{rnd.randrange(keys)}", "" if rnd.random() < 0.125 else f"{prefix}{i}")
            for i in range(n)]


class LiveProducer:
    """A thread that sends keyed writes (deletes among them) until stopped, bounded in
    count and time, and records each one once it was acknowledged, in order."""

    def __init__(self, client: Client, topic: str, limit: int = 3000, seconds: float = 60):
        self.sent: list[tuple[str, str]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._producer = client.create_producer(topic)
        self._plan = items(limit, 60, seed=7, prefix="live")
        self._until = time.monotonic() + seconds
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for key, value in self._plan:
                if self._stop.is_set() or time.monotonic() > self._until:
                    return
                self._producer.send(value, key=key)
                self.sent.append((key, value))
                time.sleep(0.002)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def wait_for(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.sent) < count:
            assert self.error is None, self.error
            assert time.monotonic() < deadline, f"only {len(self.sent)} of {count} sent"
            time.sleep(0.02)

    def stop(self) -> list[tuple[str, str]]:
        self._stop.set()
        self._thread.join(60)
        self._producer.close()
        assert self.error is None, self.error
        return self.sent


def test_a_table_view_follows_a_live_producer_across_a_compaction_and_a_kill_9(
        etcd_server, start_pair, tmp_path):
    """Loaded from a compacted view and a tail, a view of the source and one of its shadow
    follow a live producer while a second compaction is published and the source broker is
    killed with -9 and restarted; after `refresh` both equal the model of everything
    acknowledged, and a listener saw every delete as (key, None)."""
    src, _sh = start_pair()
    root = str(tmp_path / "shared-storage")
    topic = "persistent://public/tv/live"
    shadow = topic + "-shadow"
    with Client(src.url, timeout=30) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(shadow, topic)
        before = items(400, 50, seed=1, prefix="v")
        produce(c, topic, before)
        c.admin.roll_ledger(topic)
        publish_compaction(etcd_server, root, topic, "job-1")
        tail = items(100, 50, seed=2, prefix="t")
        produce(c, topic, tail)

        view = c.table_view(topic, timeout=30)
        shadow_view = c.table_view(shadow, timeout=30)
        assert as_dict(view) == model(before + tail)
        assert as_dict(shadow_view) == model(before + tail)

        seen: dict[str, str] = {}
        deletes: list[str] = []

        def listener(key, msg):
            if msg is None:
                deletes.append(key)
                seen.pop(key, None)
            else:
                seen[key] = msg.value()
        view.for_each_and_listen(listener)
        assert seen == model(before + tail)

        live = LiveProducer(c, topic)
        live.wait_for(200)
        c.admin.roll_ledger(topic)
        publish_compaction(etcd_server, root, topic, "job-2")
        live.wait_for(400)
        src.kill()
        src.start(timeout=60)
        live.wait_for(len(live.sent) + 200)
        sent = live.stop()

        want = model(before + tail + sent)
        view.refresh(timeout=30)
        shadow_view.refresh(timeout=30)
        assert as_dict(view) == want
        assert as_dict(shadow_view) == want
        assert seen == want
        deleted_live = {k for k, v in sent if not v}
        assert deleted_live and deleted_live <= set(deletes)
        assert len(view) == len(want) and sorted(view.keys()) == sorted(want)


def test_a_partitioned_topics_view_reads_every_partition_and_reads_its_writes(client, topic):
    """Over three partitions: the view holds every key; after a send, `refresh` makes the
    write visible (read-your-writes); a delete removes the key and reaches listeners as
    (key, None); keys are text and `get` takes bytes too."""
    client.admin.create_topic(topic, partitions=3)
    writes = items(300, 40, seed=3, prefix="p")
    produce(client, topic, writes)
    with client.table_view(topic, timeout=30) as view:
        assert as_dict(view) == model(writes)
        events: list[tuple[str, str | None]] = []
        view.listen(lambda key, msg: events.append((key, msg and msg.value())))
        live_key = next(iter(model(writes)))
        with client.create_producer(topic) as p:
            p.send("fresh", key="new-key")
            p.send("", key=live_key)
        view.refresh(timeout=30)
        assert view.get("new-key").value() == "fresh"
        assert view.get(b"new-key").value() == "fresh"
        assert view["new-key"].key == b"new-key"
        assert view.get(live_key) is None and live_key not in view
        with pytest.raises(KeyError):
            view[live_key]
        assert ("new-key", "fresh") in events and (live_key, None) in events
        assert {m.message_id.partition for _k, m in view.items()} == {0, 1, 2}
    with pytest.raises(errors.AlreadyClosed):
        view.get("new-key")


def test_a_table_view_of_a_missing_topic_is_topic_not_found(client, topic):
    with pytest.raises(errors.TopicNotFound):
        client.table_view(topic + "-missing", timeout=10)


def test_a_table_view_of_a_deleted_topic_fails_instead_of_going_stale(client, topic):
    """The topic deleted under a view: its calls raise the broker's typed error from then
    on (a view never answers from a state it can no longer follow)."""
    client.admin.create_topic(topic)
    produce(client, topic, [("a", "1")])
    view = client.table_view(topic, timeout=30)
    assert view.get("a").value() == "1"
    client.admin.delete_topic(topic, force=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            view.get("a")
        except errors.ShadowTopicError as exc:
            assert not isinstance(exc, errors.AlreadyClosed)
            break
        assert time.monotonic() < deadline, "the view went on after its topic was deleted"
        time.sleep(0.1)
    view.close()
