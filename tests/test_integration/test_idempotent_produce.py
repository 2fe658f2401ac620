"""Idempotent producing across broker crashes (issue 19, scenario F13): the producer
reconnects and resends by itself, and the broker stores nothing twice."""
from __future__ import annotations

import signal
import threading
import time

import pytest
from support.waiting import wait_for

from shadowtopic import failpoints
from shadowtopic.broker.server import free_port
from shadowtopic.client import Client, errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.standalone import BrokerProcess


def _read_all(url: str, topic: str) -> list:
    out = []
    with Client(url, timeout=20) as c, c.create_reader(topic, start="earliest") as r:
        for _ in range(100_000):
            if not r.has_message_available():
                return out
            out.append(r.read_next(timeout=20))
    raise AssertionError("the topic did not end")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["", "stable-producer"])
def test_producer_carries_on_through_kill9_restarts_exactly_once_in_order(
        etcd_server, tmp_path, topic, name):
    """F13: a producer sends 4,000 messages while its broker is kill -9'd and restarted on
    the same data dir and port three times. It reconnects and resends by itself: every
    message is acknowledged, and reading back gives each exactly once, in order, at the id
    its acknowledgement gave."""
    count, kills = 4000, 3
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "data"), free_port(),
                      extra_args=["--lease-ttl", "3"])
    b.start(timeout=60)
    acked: dict[int, MessageId] = {}
    failed: list = []
    try:
        with Client(b.url, timeout=5, operation_timeout=90) as c:
            c.admin.create_topic(topic)
            p = c.create_producer(topic, producer_name=name, batch_max_messages=50,
                                  linger_ms=2)

            def done(i):
                def cb(mid, exc):
                    if exc is None:
                        acked[i] = mid
                    else:
                        failed.append((i, exc))
                return cb

            def produce():
                for i in range(count):
                    p.send_async(f"{i}".encode(), key="k", callback=done(i))
                    if i % 50 == 49:
                        time.sleep(0.005)  # a stream spread over the kills

            sender = threading.Thread(target=produce, daemon=True)
            sender.start()
            for k in range(kills):
                wait_for(lambda k=k: len(acked) >= (k + 1) * count // (kills + 2) or failed, 120,
                         "acknowledgements before a kill", interval=0.02)
                b.kill()
                b.start(timeout=60)
            sender.join(180)
            assert not sender.is_alive()
            p.flush(timeout=180)
            assert not failed, f"{len(failed)} sends failed, first: {failed[0]}"
            assert len(acked) == count
            p.close()
        messages = _read_all(b.url, topic)
        assert [m.payload for m in messages] == [f"{i}".encode() for i in range(count)]
        for i, m in enumerate(messages):
            if acked[i].ledger_id:  # 0:0: a duplicate whose original id was not known
                assert m.message_id == acked[i], f"message {i} was acknowledged at another id"
    finally:
        b.kill()


def test_a_batch_resent_after_it_was_stored_but_before_its_receipt_is_stored_once(
        etcd_server, tmp_path, topic):
    """The broker dies (failpoint `produce.before_receipt`) after it stored the batch and
    before the receipt left; the producer resends it to the restarted broker, which knows
    the batch from its WAL: acknowledged once, with its original id, stored once."""
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "data"), free_port(),
                      extra_args=["--lease-ttl", "3"],
                      env=failpoints.env({"produce.before_receipt": "1*kill"}))
    b.start(timeout=60)
    try:
        with Client(b.url, timeout=5, operation_timeout=90) as c:
            c.admin.create_topic(topic)
            with c.create_producer(topic) as p:
                got: list = []
                p.send_async(b"once", callback=lambda mid, exc: got.append((mid, exc)))
                p.flush_nowait()  # send it now (no linger)
                assert b.proc.wait(30) == -signal.SIGKILL
                b.env = None
                b.start(timeout=60)
                p.flush(timeout=120)
                assert len(got) == 1 and got[0][1] is None, got
                after = p.send(b"after")
        messages = _read_all(b.url, topic)
        assert [m.payload for m in messages] == [b"once", b"after"]
        assert messages[0].message_id == got[0][0]
        assert messages[1].message_id == after
    finally:
        b.kill()


def test_a_second_live_producer_with_the_same_name_is_refused(broker, topic):
    """Two writers under one stable name would drop each other's batches as duplicates:
    the second is refused (`ProducerBusy`, as Pulsar) while the first is connected, and the
    name is free again once it closed."""
    with Client(broker.url, timeout=10, operation_timeout=2) as c:
        c.admin.create_topic(topic)
        first = c.create_producer(topic, producer_name="orders")
        first.send(b"one")
        with pytest.raises(errors.ProducerBusy, match="already connected"):
            c.create_producer(topic, producer_name="orders")
        first.close()
        deadline = time.monotonic() + 10  # the broker hears the closed stream end soon after
        while True:
            try:
                again = c.create_producer(topic, producer_name="orders")
                break
            except errors.ProducerBusy:
                assert time.monotonic() < deadline, "the name stayed taken after the close"
                time.sleep(0.1)
        with again:
            again.send(b"three")
    assert [m.payload for m in _read_all(broker.url, topic)] == [b"one", b"three"]


def test_a_producer_idle_past_the_broker_bound_is_forgotten(etcd_server, tmp_path, topic):
    """`--dedup-idle-seconds`: a stable name idle past it is forgotten (its attach answers
    last sequence 0 and its numbering starts again); one active within it is kept."""
    import grpc

    from shadowtopic.pb.v1 import producer_pb2

    b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "data"), free_port(),
                      extra_args=["--dedup-idle-seconds", "2"])
    b.start(timeout=60)
    try:
        def last_sequence(name: str) -> int:
            with grpc.insecure_channel(b.url) as ch:
                call = ch.stream_stream("/shadowtopic.v1.Producer/Produce")(iter([
                    producer_pb2.ProduceRequest(topic=topic, producer_name=name,
                                                attach=True).SerializeToString()]))
                receipt = producer_pb2.ProduceReceipt.FromString(next(call))
                assert not receipt.HasField("error"), receipt.error
                return receipt.last_sequence_id

        with Client(b.url, timeout=10) as c:
            c.admin.create_topic(topic)
            for name in ("idle", "busy"):
                with c.create_producer(topic, producer_name=name) as p:
                    for i in range(3):
                        p.send(f"{name}-{i}".encode())
            assert last_sequence("idle") == 3
            deadline = time.monotonic() + 30
            while last_sequence("idle") != 0:  # forgotten as another producer stores
                assert time.monotonic() < deadline, "the idle producer was never forgotten"
                with c.create_producer(topic, producer_name="busy") as p:
                    p.send(b"busy-more")
                time.sleep(0.5)
            assert last_sequence("busy") > 3
            with c.create_producer(topic, producer_name="idle") as p:
                p.send(b"idle-again")  # sequence 1 again: new, not a duplicate
        payloads = [m.payload for m in _read_all(b.url, topic)]
        assert payloads[:6] == [b"idle-0", b"idle-1", b"idle-2", b"busy-0", b"busy-1", b"busy-2"]
        assert payloads[-1] == b"idle-again"
    finally:
        b.kill()
