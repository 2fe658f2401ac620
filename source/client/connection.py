"""One gRPC channel to a broker, and the mapping of gRPC failures to typed errors.

`Connection.call` is one attempt; the retries of opening and admin calls are
source/client/retry.py's, within the connection's `operation_timeout`. The channel tries to
reconnect to a broker that went away at least every `MAX_RECONNECT_BACKOFF_MS` (gRPC's
default grows to 120 s): a broker back after a restart is reached within the backoff of
the retries, not minutes later. A broker that stops answering without closing (paused) is
found by keepalive pings (`KEEPALIVE_MS`, `KEEPALIVE_TIMEOUT_MS`).
"""
from __future__ import annotations

import ipaddress
import os
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf.message import Message

from shadowtopic.client.options import DEFAULT_TIMEOUT_S
from shadowtopic.client.options import operation_timeout as checked_timeout
from shadowtopic.client.retry import Retry
from shadowtopic.core import errors
from shadowtopic.pb.v1 import admin_pb2_grpc, producer_pb2_grpc
from shadowtopic.security.dial import PLAINTEXT, AuthToken, Dial, token_source

DEFAULT_URL = "localhost:6650"
MAX_MESSAGE = 64 << 20
MAX_RECONNECT_BACKOFF_MS = 1000
#: a broker that stops answering (paused, its machine frozen, a half-open TCP connection) is
#: given up after a ping unanswered for KEEPALIVE_TIMEOUT_MS, and the streams on it reconnect
#: (to the topic's next owner); brokers let clients ping every 5 s, half this, so no ping
#: is ever refused as too many (source/broker/memory.py)
KEEPALIVE_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000

Req = TypeVar("Req", bound=Message, contravariant=True)
Resp = TypeVar("Resp", covariant=True)
R = TypeVar("R")
M = TypeVar("M", bound=Message)


class Unary(Protocol[Req, Resp]):
    """A unary method of a gRPC stub (`grpc.UnaryUnaryMultiCallable`)."""

    def __call__(self, request: Req, timeout: float | None = None) -> Resp:
        ...


#: URL schemes that ask for TLS (and the plaintext ones, also accepted)
TLS_SCHEMES = ("shadowtopic+ssl://", "grpcs://")
PLAIN_SCHEMES = ("shadowtopic://", "grpc://")


def service_url(url: str | None) -> str:
    """The broker address (`host:port`) of a service URL, its scheme dropped."""
    return parse_service_url(url)[0]


def parse_service_url(url: str | None) -> tuple[str, bool]:
    """(address, whether its scheme asks for TLS) of a service URL (default
    $SHADOWTOPIC_URL or localhost:6650)."""
    url = url or os.environ.get("SHADOWTOPIC_URL") or DEFAULT_URL
    for scheme in TLS_SCHEMES + PLAIN_SCHEMES:
        if url.startswith(scheme):
            return url[len(scheme):], scheme in TLS_SCHEMES
    return url, False


def client_dial(url: str | None, trust_certs_file: str | None, cert_file: str | None,
                key_file: str | None, auth_token: AuthToken | None = None
                ) -> tuple[str, Dial]:
    """The broker address and how to dial it: TLS when the URL's scheme asks for it
    (`shadowtopic+ssl://`) or any TLS file is given, with `auth_token` on every call
    (source/security/dial.py); `InvalidArgument` for a certificate without its key (or the
    reverse), a file that cannot be read, or an `auth_token` of another type."""
    try:
        token = token_source(auth_token)
    except ValueError as exc:
        raise errors.InvalidArgument(str(exc)) from None
    address, tls = parse_service_url(url)
    files = (trust_certs_file, cert_file, key_file)
    tls = tls or any(f is not None for f in files)
    for f in files:
        if f is not None and not os.access(f, os.R_OK):
            raise errors.InvalidArgument(f"cannot read the TLS file {f!r}")
    try:
        return address, Dial(tls, trust_certs_file, cert_file, key_file, token)
    except ValueError as exc:
        raise errors.InvalidArgument(str(exc)) from None


def channel_target(address: str) -> tuple[str, list[tuple[str, Any]]]:
    """The gRPC target of a service address, and the options it needs.

    One `host:port` is dialled as it is. Several brokers separated by commas
    (`10.0.0.1:6650,10.0.0.2:6650`, as Pulsar's `pulsar://h1:6650,h2:6650`) become one
    channel over all of them (gRPC's `ipv4:`/`ipv6:` address list, calls spread round-robin
    over those that answer), so lookups and admin calls go on while any of them is up;
    `localhost` counts as 127.0.0.1. The brokers of a list must be IP addresses (a DNS name
    with several addresses already works as one); anything else is `InvalidArgument`."""
    if "," not in address:
        return address, []
    v4: list[str] = []
    v6: list[str] = []
    for part in (p.strip() for p in address.split(",")):
        host, sep, port = part.rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise errors.InvalidArgument(f"service URL: {part!r} is not host:port")
        host = "127.0.0.1" if host == "localhost" else host
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            raise errors.InvalidArgument(
                f"service URL: several brokers must be IP addresses, not {host!r} (a DNS "
                "name with several addresses works as one broker address)") from None
        (v4 if ip.version == 4 else v6).append(f"{host}:{port}")
    if v4 and v6:
        raise errors.InvalidArgument("service URL: IPv4 and IPv6 brokers cannot be mixed")
    target = "ipv4:" + ",".join(v4) if v4 else "ipv6:" + ",".join(v6)
    return target, [("grpc.lb_policy_name", "round_robin")]


class Connection:
    def __init__(self, url: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 operation_timeout: float | None = None, dial: Dial = PLAINTEXT):
        self.url = service_url(url)
        self.dial = dial  # plaintext or TLS (source/security/tls.py): never falls back
        self.timeout = timeout
        self.operation_timeout = checked_timeout(operation_timeout, timeout)
        self.retry = Retry(self.operation_timeout)
        target, extra = channel_target(self.url)
        self.channel = dial.channel(target, options=[
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.enable_retries", 1),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
            ("grpc.keepalive_time_ms", KEEPALIVE_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            # a keepalive due while another ping (gRPC's own bandwidth probe) is unanswered
            # waits on that ping, whose timeout is 60 s by default: a paused broker was
            # given up after ~63 s, not 5 (tests/test_source/client/test_keepalive.py)
            ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 1), *extra])
        self.closed = False
        # (the generated gRPC stubs are untyped: their methods are Any)
        self.admin = admin_pb2_grpc.AdminStub(self.channel)  # type: ignore[no-untyped-call]
        self.producer = producer_pb2_grpc.ProducerStub(  # type: ignore[no-untyped-call]
            self.channel)

    def call(self, method: Unary[M, R], request: M, timeout: float | None = None) -> R:
        """A unary call; gRPC errors come back as the typed errors the server sent, a call
        on a closed connection as `AlreadyClosed`."""
        if self.closed:
            raise errors.AlreadyClosed("client is closed")
        try:
            return method(request, timeout=timeout or self.timeout)
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None
        except ValueError:  # gRPC's "Cannot invoke RPC on closed channel!" (a close raced)
            if self.closed:
                raise errors.AlreadyClosed("client is closed") from None
            raise

    def close(self) -> None:
        self.closed = True
        self.channel.close()
