"""A cursor change that answers "done" survives kill -9 of the broker that owns the topic
(issue 29, docs/BEHAVIOURS.md C4a): reset-cursor by id and by time, skip, clear-backlog,
create-subscription at a position, a consumer's seek, unsubscribe and delete. Every change is
made through the client on a topic of its own, each waited for (its answer); then the owner
is killed at once (no sleep) and restarted, once for all of them (`source_changes`, a broker
restart per change cost seconds each), and each case's test finds its subscription where the
answer put it: its backlog, and a fresh consumer receiving exactly the messages that
position implies. The same on a shadow's own subscriptions, on the shadow broker.

The brokers flush batched cursor changes only once an hour (`--cursor-flush-interval`), so
nothing here is saved by a flush that happened to come between an answer and the kill: only
a write made before the answer counts.
"""
from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client, errors
from shadowtopic.standalone import BrokerProcess

N = 20
SLOW_FLUSH = ["--lease-ttl", "3", "--cursor-flush-interval", "3600"]
CHANGES = ["reset_by_id", "reset_by_time", "skip", "clear_backlog", "create_at", "seek",
           "unsubscribe", "delete"]


def wait_for(fn, timeout: float = 30.0, what: str = "a condition"):
    """`fn()`'s first truthy value, polled every 0.1 s; typed broker errors (the topic is
    still loading on the restarted broker) count as not yet."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            got = fn()
            if got:
                return got
        except errors.ShadowTopicError as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


def kill_and_restart(b: BrokerProcess) -> None:
    b.kill()
    b.start(timeout=60)


def stop_all(started: list[BrokerProcess]) -> None:
    for b in started:
        if b.proc is not None and b.proc.poll() is None:
            os.kill(b.proc.pid, signal.SIGCONT)
        b.kill()


@pytest.fixture(scope="module")
def source_broker(etcd_server, tmp_path_factory):
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path_factory.mktemp("durable-cursors")),
                      free_port(), extra_args=SLOW_FLUSH)
    b.start(timeout=60)
    try:
        yield b
    finally:
        stop_all([b])


@pytest.fixture(scope="module")
def shadow_pair(etcd_server, tmp_path_factory):
    """(source broker, shadow broker) on one storage root, a cluster of their own."""
    root = tmp_path_factory.mktemp("durable-shadow-cursors")
    args = [*SLOW_FLUSH, "--storage-root", str(root / "shared"),
            "--cluster", f"c-{uuid.uuid4().hex[:8]}"]
    src = BrokerProcess(etcd_server.endpoint, str(root / "src"), free_port(), extra_args=args)
    sh = BrokerProcess(etcd_server.endpoint, str(root / "sh"), free_port(), extra_args=args,
                       module="shadowtopic.shadow.broker")
    try:
        src.start(timeout=60)
        sh.start(timeout=60)
        yield src, sh
    finally:
        stop_all([src, sh])


def fill(c: Client, topic: str) -> tuple[list, int]:
    """N messages; returns their ids and a publish time between message 7 and 8."""
    with c.create_producer(topic) as p:
        ids = [p.send(f"m{i}".encode()) for i in range(8)]
        time.sleep(0.05)
        at_ms = int(time.time() * 1000)
        time.sleep(0.05)
        ids += [p.send(f"m{i}".encode()) for i in range(8, N)]
    return ids, at_ms


def index_at(ids: list, landed) -> int:
    """The index of the first message at or after the position `landed`."""
    key = (landed.ledger_id, landed.entry_id)
    return next((i for i, m in enumerate(ids) if (m.ledger_id, m.entry_id) >= key), len(ids))


def change(c: Client, topic: str, kind: str, ids: list, at_ms: int) -> int | None:
    """Make the change `kind` on subscription "s" of `topic` and wait for its answer.
    Returns the index of the first message the subscription should get from now on (None:
    the subscription is gone)."""
    admin = c.admin
    if kind == "reset_by_id":
        admin.create_subscription(topic, "s", "latest")
        landed, _ = admin.reset_cursor(topic, "s", ids[5])
        assert index_at(ids, landed) == 5
        return 5
    if kind == "reset_by_time":
        admin.create_subscription(topic, "s", "latest")
        landed, _ = admin.reset_cursor(topic, "s", at_ms)
        assert index_at(ids, landed) == 8
        return 8
    if kind == "skip":
        admin.create_subscription(topic, "s", "earliest")
        assert admin.skip(topic, "s", 7)
        return 7
    if kind == "clear_backlog":
        admin.create_subscription(topic, "s", "earliest")
        admin.clear_backlog(topic, "s")
        return N
    if kind == "create_at":
        admin.create_subscription(topic, "s", ids[4])
        return 4
    if kind == "seek":
        consumer = c.subscribe(topic, "s", initial_position="latest")
        landed, _ = consumer.seek(ids[6])
        assert index_at(ids, landed) == 6
        return 6
    if kind == "unsubscribe":
        c.subscribe(topic, "s", initial_position="earliest").unsubscribe()
        return None
    if kind == "delete":
        admin.create_subscription(topic, "s", "earliest")
        admin.delete_subscription(topic, "s")
        return None
    raise AssertionError(kind)


def check_after_restart(c: Client, topic: str, ids: list, first: int | None) -> None:
    """Subscription "s" of `topic` is where `change` said: gone, or with the backlog from
    message `first` on, which a fresh consumer receives exactly."""
    with c.create_reader(topic, start="earliest") as r:  # served: the topic is loaded
        assert r.read_next(timeout=30).payload == b"m0"
    subs = c.admin.stats(topic)["subscriptions"]
    if first is None:
        assert "s" not in subs, "a deleted subscription came back"
        return
    assert subs["s"]["msgBacklog"] == N - first, subs["s"]
    with c.subscribe(topic, "s", initial_position="latest") as cons:
        got = []
        while len(got) < N - first:
            m = cons.receive(timeout=10)
            got.append(m.payload.decode())
        assert got == [f"m{i}" for i in range(first, N)]
        with pytest.raises(errors.Timeout):
            cons.receive(timeout=0.5)


@pytest.fixture(scope="module")
def source_changes(source_broker) -> dict[str, tuple[str, list, int | None]]:
    """Every change of CHANGES on a topic of its own of the source broker, each answered;
    then the broker killed at once and restarted: {kind: (topic, ids, first)} (`change`)."""
    made = {}
    with Client(source_broker.url, timeout=20) as c:
        for kind in CHANGES:
            topic = f"persistent://durable/{uuid.uuid4().hex[:10]}/t"
            c.admin.create_topic(topic)
            ids, at_ms = fill(c, topic)
            made[kind] = (topic, ids, change(c, topic, kind, ids, at_ms))
        source_broker.kill()  # at once: no flush can have saved them since the answers
    source_broker.start(timeout=60)
    return made


@pytest.mark.parametrize("kind", CHANGES)
def test_a_cursor_change_answered_done_survives_kill_9(source_broker, source_changes, kind):
    topic, ids, first = source_changes[kind]
    with Client(source_broker.url, timeout=20) as c:
        check_after_restart(c, topic, ids, first)


@pytest.fixture(scope="module")
def shadow_changes(shadow_pair) -> dict[str, tuple[str, list, int | None]]:
    """`source_changes` on shadows: every change on a shadow of its own (of a source of its
    own), served by the shadow broker; then the shadow broker killed at once and restarted:
    {kind: (shadow, ids, first)}."""
    src, sh = shadow_pair
    made = {}
    with Client(src.url, timeout=20) as c:
        for kind in CHANGES:
            topic = f"persistent://durable/{uuid.uuid4().hex[:10]}/t"
            shadow = f"{topic}-shadow"
            c.admin.create_topic(topic)
            c.admin.create_shadow_topic(shadow, topic)
            ids, at_ms = fill(c, topic)
            with c.create_reader(shadow, start="earliest") as r:  # the shadow has them all
                for i in range(N):
                    assert r.read_next(timeout=15).payload == f"m{i}".encode()
            owner = c.admin.lookup(shadow).get("brokerUrl")
            assert owner == sh.url, f"the shadow broker serves the shadow, not {owner}"
            # the shadow's own ids are the source's (a shadow replicates them as they are)
            made[kind] = (shadow, ids, change(c, shadow, kind, ids, at_ms))
        sh.kill()
    sh.start(timeout=60)
    return made


@pytest.mark.parametrize("kind", CHANGES)
def test_a_shadow_subscription_change_answered_done_survives_kill_9(shadow_pair, shadow_changes,
                                                                    kind):
    src, sh = shadow_pair
    shadow, ids, first = shadow_changes[kind]
    with Client(src.url, timeout=20) as c:
        wait_for(lambda: c.admin.lookup(shadow).get("brokerUrl") == sh.url,
                 what="the shadow broker to serve the shadow again")
        check_after_restart(c, shadow, ids, first)


def test_a_reset_wins_over_acknowledgements_batched_before_it(source_broker):
    """A consumer acknowledges all 20 messages (batched, in memory: no flush for an hour) and
    a reset to message 5 answers; killed at once, the subscription restarts at message 5:
    the reset, not the older batched state, nor the state saved before the acks."""
    topic = f"persistent://durable/{uuid.uuid4().hex[:10]}/t"
    with Client(source_broker.url, timeout=20) as c:
        c.admin.create_topic(topic)
        ids, _ = fill(c, topic)
        cons = c.subscribe(topic, "s", initial_position="earliest")
        for _ in range(N):  # acks go out while messages still arrive
            cons.acknowledge(cons.receive(timeout=10))
        wait_for(lambda: c.admin.stats(topic)["subscriptions"]["s"]["msgBacklog"] == 0,
                 what="the acks to arrive")
        landed, _ = c.admin.reset_cursor(topic, "s", ids[5])
        assert index_at(ids, landed) == 5
        source_broker.kill()
    source_broker.start(timeout=60)
    with Client(source_broker.url, timeout=20) as c:
        check_after_restart(c, topic, ids, 5)
