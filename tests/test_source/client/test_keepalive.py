"""The client's keepalive pings (source/client/connection.py) against what brokers accept
(source/broker/memory.py): a broker that gets pings without data more often than
`MIN_CLIENT_PING_MS` counts strikes and closes the connection with GOAWAY
"too_many_pings", so the client must ping at most half as often (timers drift), and must
give a paused broker up well within a minute."""
from __future__ import annotations

from shadowtopic.broker import memory
from shadowtopic.client import connection


def test_the_client_pings_no_more_often_than_brokers_accept():
    assert connection.KEEPALIVE_MS >= 2 * memory.MIN_CLIENT_PING_MS


def test_a_paused_broker_is_given_up_within_twenty_seconds():
    assert connection.KEEPALIVE_MS + connection.KEEPALIVE_TIMEOUT_MS <= 20_000



def test_brokers_never_hold_a_clients_pings_against_it():
    options = dict(memory.server_options())
    assert options["grpc.http2.max_ping_strikes"] == 0  # 0: no GOAWAY "too_many_pings"
    assert options["grpc.http2.min_recv_ping_interval_without_data_ms"] == \
        memory.MIN_CLIENT_PING_MS
