"""A server that stops answering without closing its connections (SIGSTOP: a paused process,
a frozen machine) is given up by the client's channel after a keepalive ping unanswered for
KEEPALIVE_TIMEOUT_MS (source/client/connection.py), not gRPC's default ping timeout of 60 s:
a stream in flight on it ends UNAVAILABLE, so the client's streams move to another broker."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
from support.echo_server import METHOD
from support.standalone_process import free_ports

from shadowtopic.client import connection

ROOT = Path(__file__).resolve().parents[2]


def test_a_stream_to_a_paused_server_ends_within_the_keepalive_and_its_timeout():
    port, = free_ports(1)
    server = subprocess.Popen([sys.executable, "-m", "support.echo_server", str(port)],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
    conn = connection.Connection(f"127.0.0.1:{port}")
    stop = threading.Event()
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        call = conn.channel.stream_stream(METHOD)

        def requests():
            for _ in range(100_000):  # bounded: 10 ms apart, longer than the test waits
                if stop.is_set():
                    return
                yield os.urandom(100)
                time.sleep(0.01)

        replies = call(requests())
        assert len(next(replies)) == 100  # the stream works before the pause
        for _ in range(100):  # and carries a bandwidth probe's ping, as a loaded one does
            next(replies)
        os.kill(server.pid, signal.SIGSTOP)
        paused = time.monotonic()
        try:
            for _ in replies:
                assert time.monotonic() - paused < 60
            code = None
        except grpc.RpcError as e:
            code = e.code()
        waited = time.monotonic() - paused
        assert code == grpc.StatusCode.UNAVAILABLE
        limit = (connection.KEEPALIVE_MS + connection.KEEPALIVE_TIMEOUT_MS) / 1000 + 5
        assert waited < limit, f"the paused server was given up after {waited:.1f} s"
    finally:
        stop.set()
        conn.close()
        server.send_signal(signal.SIGKILL)
        server.wait()
