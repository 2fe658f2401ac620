"""F11: a shadow follows its source again after an etcd outage ("a shadow stops after an
etcd outage and says it is caught up").

A source broker and a shadow broker with short leases (2 s) on a private etcd, so the outage
touches no other test: etcd is paused (SIGSTOP), or killed and restarted on its data dir,
past the brokers' lease deadline, so both brokers lose their leases and fence their topics.
Messages produced after the outage must reach a fresh reader of the shadow within seconds;
before the fix the shadow broker kept the fenced shadow loaded, its readers got
`TopicNotOwned: keeps reloading` and the replicator's acks said caught up.
"""
from __future__ import annotations

import time
import uuid

import pytest
from support.waiting import wait_for

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client, errors
from shadowtopic.metadata import EtcdServer
from shadowtopic.standalone import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def retry(fn, timeout: float, what: str):
    """`fn()` until it returns without a retriable error, for `timeout` seconds at most."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except errors.ShadowTopicError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise AssertionError(f"{what}: {exc!r}") from exc
            time.sleep(0.2)


def read_all(c: Client, topic: str, n: int, timeout: float = 5.0) -> list[bytes]:
    """What a fresh reader of `topic` reads from the start (at most `n` messages)."""
    got = []
    with c.create_reader(topic, start="earliest") as r:
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            try:
                got.append(r.read_next(timeout=max(0.1, deadline - time.monotonic())).payload)
            except errors.Timeout:
                break
    return got


def _replicated(c: Client, topic: str, shadow: str) -> str | None:
    rep = c.admin.stats(topic).get("shadowReplication", {}).get(shadow, {})
    return rep.get("replicatedPosition") if rep.get("connected") else None


def outage(etcd: EtcdServer, how: str) -> None:
    """etcd away for 4 s, past both brokers' lease deadline (0.8 x 2 s): they fence.
    `paused`: SIGSTOP (calls hang); `killed`: kill -9, then a restart on its data dir."""
    if how == "paused":
        etcd.pause()
        time.sleep(4)
        etcd.resume()
    else:
        etcd.kill()
        time.sleep(4)
        etcd.restart()


@pytest.mark.parametrize("how", ["paused", "killed"])
def test_f11_a_shadow_follows_its_source_again_after_etcd_was_away(tmp_path, how):
    etcd = EtcdServer(data_dir=tmp_path / "etcd").start()
    args = ["--lease-ttl", "2", "--storage-root", str(tmp_path / "storage"),
            "--cluster", f"c-{uuid.uuid4().hex[:8]}"]
    src = BrokerProcess(etcd.endpoint, str(tmp_path / "src"), free_port(), extra_args=args)
    sh = BrokerProcess(etcd.endpoint, str(tmp_path / "sh"), free_port(), extra_args=args,
                       module="shadowtopic.shadow.broker")
    try:
        src.start(timeout=60)
        sh.start(timeout=60)
        topic = "persistent://public/outage/t"
        shadow = topic + "-shadow"
        with Client(src.url, timeout=20) as c:
            c.admin.create_topic(topic)
            c.admin.create_shadow_topic(shadow, topic)
            with c.create_producer(topic) as p:
                for i in range(20):
                    p.send(f"before-{i}".encode())
            assert retry(lambda: read_all(c, shadow, 20), 20, "read before") == \
                [f"before-{i}".encode() for i in range(20)]

            outage(etcd, how)

            def produce_after():
                with c.create_producer(topic) as p:
                    for i in range(20):
                        p.send(f"after-{i}".encode())
            retry(produce_after, 30, "produce after the outage")
            want = [f"before-{i}".encode() for i in range(20)] + \
                   [f"after-{i}".encode() for i in range(20)]
            deadline = time.monotonic() + 20
            got: list[bytes] = []
            while time.monotonic() < deadline:
                try:
                    got = read_all(c, shadow, 40, timeout=2)
                except errors.ShadowTopicError as exc:
                    assert exc.retriable, exc  # temporary while the shadow reloads
                    got = []
                if got == want:
                    break
                time.sleep(0.2)
            assert got == want, f"the shadow read {len(got)} of 40 after the outage"
            # and the source's replication stats tell the same: the shadow is at its tail
            last = c.admin.last_message_id(topic)
            at = f"{last.ledger_id}:{last.entry_id}"
            wait_for(lambda: _replicated(c, topic, shadow) == at, 10,
                       f"the replication stats say {shadow} is at {at}")
    finally:
        for b in (src, sh):
            b.kill()
        etcd.close()
