"""Service URLs naming several brokers (source/client/connection.py, `channel_target`): one
gRPC channel over an address list, calls spread round-robin over the brokers that answer;
what cannot be such a list is refused with `InvalidArgument`. (Failover through such a URL
against real brokers: tests/test_integration/test_multi_host.py.)"""
from __future__ import annotations

import pytest

from shadowtopic.client import Client
from shadowtopic.client.connection import channel_target
from shadowtopic.core import errors


def test_one_broker_is_dialled_as_it_is():
    assert channel_target("broker.example:6650") == ("broker.example:6650", [])


@pytest.mark.parametrize("address,target", [
    ("127.0.0.2:6650,127.0.0.3:6651", "ipv4:127.0.0.2:6650,127.0.0.3:6651"),
    ("localhost:6650, 10.0.0.1:6650", "ipv4:127.0.0.1:6650,10.0.0.1:6650"),
    ("[::1]:6650,[fe80::1]:6650", "ipv6:[::1]:6650,[fe80::1]:6650"),
])
def test_several_brokers_are_one_round_robin_channel(address, target):
    got, options = channel_target(address)
    assert got == target
    assert ("grpc.lb_policy_name", "round_robin") in options


@pytest.mark.parametrize("address,why", [
    ("a.example:6650,b.example:6650", "must be IP addresses"),
    ("127.0.0.1:6650,[::1]:6650", "cannot be mixed"),
    ("127.0.0.1:6650,127.0.0.2", "is not host:port"),
    ("127.0.0.1:6650,:6650", "is not host:port"),
])
def test_what_cannot_be_a_list_is_refused(address, why):
    with pytest.raises(errors.InvalidArgument, match=why):
        channel_target(address)
    with pytest.raises(errors.InvalidArgument, match=why):
        Client(f"shadowtopic://{address}")
