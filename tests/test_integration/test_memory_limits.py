"""F12: hostile clients against a broker with a small cap on client memory
(`--client-memory-bytes`, source/broker/memory.py).

- 300 Consumer streams that subscribe readers with large permits on a topic with data and
  never read, and 200 produce requests of 1 MiB refused (MessageTooBig) on streams that stay
  open: the broker's RSS (sampled every 20 ms) stays under its baseline plus the cap,
  another client's produce keeps working, and once the clients are gone the broker counts
  none of their memory (`shadowtopic_client_memory_bytes` on /metrics) and its RSS is back
  near the baseline.
- A stream that does not read is cut after the stall bound with a status that says why,
  while another reader goes on.
- One client message of millions of tiny Flow commands: health checks keep answering.
- A half-open connection (TCP connected, nothing sent) is closed within the handshake
  timeout.

Every loop has a count and a deadline; the RSS is read from /proc/<pid>/status.
"""
from __future__ import annotations

import socket
import threading
import time
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.metrics_support import scrape, value

from shadowtopic.broker.memory import STREAM_BYTES
from shadowtopic.broker.server import free_port
from shadowtopic.client import Client
from shadowtopic.core import errors
from shadowtopic.pb.v1 import common_pb2, consumer_pb2, producer_pb2
from shadowtopic.standalone import BrokerProcess

CAP = 256 << 20
#: what the RSS may keep after the clients left: freed pages the allocator holds on
#: to (a CI run saw 105 MiB over a 153 MiB baseline while nothing was counted)
SLACK = 128 << 20
#: the peak may pass the cap by what gRPC has already read ahead or not yet sent (not
#: counted: the broker's known gap) and pages the allocator has not handed back; a full
#: `make test` once peaked 1 MiB over it (388 MiB against a 131 MiB baseline). Without the
#: cap 300 such streams held 1.3 GB.
PEAK_SLACK = 32 << 20
STALL_SECONDS = 4
HANDSHAKE_SECONDS = 1
READERS = 300
REFUSED = 200
PAYLOAD = 100 << 10       # the topic holds 200 x 100 KiB
FLOWS = 4_000_000


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


@pytest.fixture
def capped_broker(etcd_server, tmp_path):
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "data"), free_port(),
                      extra_args=["--lease-ttl", "3", "--client-memory-bytes", str(CAP),
                                  "--client-stall-seconds", str(STALL_SECONDS),
                                  "--handshake-timeout", str(HANDSHAKE_SECONDS)])
    b.start(timeout=60)
    try:
        yield b
    finally:
        b.kill()


def _channel(url: str) -> grpc.Channel:
    return grpc.insecure_channel(url, options=[("grpc.max_send_message_length", 100 << 20),
                                               ("grpc.max_receive_message_length", 100 << 20)])


def _stream(channel: grpc.Channel, method: str, first: bytes, stop: threading.Event):
    """A raw bidi call that sends `first` and then nothing until `stop` (bounded)."""
    def requests():
        yield first
        stop.wait(60)
    return channel.stream_stream(method)(requests())


def _subscribe(topic: str) -> bytes:
    return consumer_pb2.ClientMessage(commands=[
        consumer_pb2.ClientCommand(handle=1, subscribe=consumer_pb2.Subscribe(
            topic=topic, start=common_pb2.StartPosition(earliest=True))),
        consumer_pb2.ClientCommand(handle=1, flow=consumer_pb2.Flow(permits=1_000_000)),
    ]).SerializeToString()


class PeakRss:
    """The highest RSS of a process, sampled every 20 ms by a thread (bounded by `stop`)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.peak = _rss(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for _ in range(30_000):  # 10 minutes at most
            if self._stop.wait(0.02):
                return
            self.peak = max(self.peak, _rss(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak


def test_hostile_streams_stay_under_the_cap_and_leave_nothing(capped_broker):
    broker = capped_broker
    pid = broker.proc.pid
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"
    channels: list[grpc.Channel] = []
    stop = threading.Event()
    with Client(broker.url, timeout=60) as client:
        client.admin.create_topic(topic)
        producer = client.create_producer(topic)
        for _ in range(200):
            producer.send(b"y" * PAYLOAD)
        time.sleep(1)
        baseline = _rss(pid)
        sampler = PeakRss(pid)
        try:
            readers = []
            for i in range(READERS):
                if i % 30 == 0:
                    channels.append(_channel(broker.url))
                readers.append(_stream(channels[-1], "/shadowtopic.v1.Consumer/Connect",
                                       _subscribe(topic), stop))
            deadline = time.monotonic() + 2 * STALL_SECONDS + 2
            sent = 0
            while time.monotonic() < deadline and sent < 100:
                producer.send(b"live")  # another client's produce keeps working
                sent += 1
                time.sleep(0.2)
            # refused requests on streams that stay open keep nothing
            too_big = producer_pb2.ProduceRequest(
                topic=topic, request_id=7,
                messages=[common_pb2.Message(payload=b"x" * (1 << 20))]).SerializeToString()
            reasons = set()
            for i in range(REFUSED):
                if i % 20 == 0:
                    channels.append(_channel(broker.url))
                call = _stream(channels[-1], "/shadowtopic.v1.Producer/Produce", too_big, stop)
                receipt = producer_pb2.ProduceReceipt.FromString(next(call))
                reasons.add(receipt.error.reason)
            assert reasons <= {"MessageTooBig", "BrokerMemoryFull"} and reasons, reasons
            producer.send(b"live")
            peak = sampler.stop()
            assert peak < baseline + CAP + PEAK_SLACK, \
                f"RSS {peak >> 20} MiB, baseline {baseline >> 20} MiB, cap {CAP >> 20} MiB"
        finally:
            sampler.stop()
            stop.set()
            for ch in channels:
                ch.close()
        # nothing is kept for clients that left: the broker counts only this test's own
        # producer stream, and its RSS comes back down (the allocator may keep some pages)
        deadline = time.monotonic() + 30
        while (held := value(scrape(broker.metrics_url()), "shadowtopic_client_memory_bytes",
                             cluster="standalone")) != STREAM_BYTES:
            assert time.monotonic() < deadline, f"{held} bytes still held for clients"
            time.sleep(0.5)
        after = _rss(pid)
        deadline = time.monotonic() + 15
        while after > baseline + SLACK and time.monotonic() < deadline:
            time.sleep(0.5)
            after = _rss(pid)
        assert after <= baseline + SLACK, \
            f"RSS {after >> 20} MiB after the clients left, baseline {baseline >> 20} MiB"
        producer.send(b"still")
        producer.close()


def test_a_stream_that_does_not_read_is_cut_and_the_others_go_on(capped_broker):
    """A reader that takes nothing while the broker has frames for it is cut after the
    stall bound (logged with its reason); when its client reads again it gets what gRPC
    had buffered, then the status RESOURCE_EXHAUSTED, reason SlowConsumer. A reader on
    another connection reads everything."""
    broker = capped_broker
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"
    stop = threading.Event()
    with Client(broker.url, timeout=60) as client:
        client.admin.create_topic(topic)
        producer = client.create_producer(topic)
        for _ in range(300):  # 30 MiB: more than the outbox and gRPC's windows take
            producer.send_async(b"z" * PAYLOAD)
        producer.flush(timeout=60)
        stalled_channel = _channel(broker.url)
        try:
            stalled = _stream(stalled_channel, "/shadowtopic.v1.Consumer/Connect",
                              _subscribe(topic), stop)
            with client.create_reader(topic, start="earliest") as live:
                got = [live.read_next(timeout=30) for _ in range(300)]
            assert len(got) == 300
            deadline = time.monotonic() + STALL_SECONDS + 20
            while "consumer stream cut (SlowConsumer" not in broker.log_tail(200):
                assert time.monotonic() < deadline, broker.log_tail(20)
                time.sleep(0.2)
            received = 0
            with pytest.raises(grpc.RpcError) as cut:
                for message in stalled:  # what was buffered before the cut, then the end
                    frames = consumer_pb2.ServerMessage.FromString(message).frames
                    received += sum(len(f.entries) for f in frames)
                    assert received < 300, "the whole topic arrived: nothing was cut"
            assert cut.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "took no data" in cut.value.details()
            assert (errors.REASON_KEY, "SlowConsumer") in cut.value.trailing_metadata()
        finally:
            stop.set()
            stalled_channel.close()


def test_a_flood_of_flow_commands_does_not_stall_health(capped_broker):
    broker = capped_broker
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"
    with Client(broker.url, timeout=60) as client:
        client.admin.create_topic(topic)
        one = consumer_pb2.ClientCommand(handle=1, flow=consumer_pb2.Flow(permits=1))
        one = one.SerializeToString()
        flood = (b"\x0a" + bytes([len(one)]) + one) * FLOWS  # ClientMessage.commands
        stop = threading.Event()
        channel = _channel(broker.url)
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(broker.url))
        try:
            def requests():
                yield _subscribe(topic)
                yield flood
                stop.wait(60)
            call = channel.stream_stream("/shadowtopic.v1.Consumer/Connect")(requests())
            time.sleep(0.5)
            for _ in range(40):  # about 8 s while the flood is processed
                res = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                assert res.status == health_pb2.HealthCheckResponse.SERVING
                time.sleep(0.2)
            call.cancel()
        finally:
            stop.set()
            channel.close()


def test_a_half_open_connection_is_closed(capped_broker):
    host, port = capped_broker.url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.settimeout(HANDSHAKE_SECONDS + 9)
        t0 = time.monotonic()
        got = b""
        for _ in range(100):  # the server's settings and GOAWAY, then the end
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        else:
            pytest.fail("the connection was not closed")
        assert time.monotonic() - t0 < HANDSHAKE_SECONDS + 5
