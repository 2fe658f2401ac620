"""One gRPC channel to a broker, and the mapping of gRPC failures to typed errors."""
from __future__ import annotations

import os

import grpc

from source.core import errors
from source.pb.v1 import admin_pb2_grpc, producer_pb2_grpc

DEFAULT_URL = "localhost:6650"
MAX_MESSAGE = 64 << 20


def service_url(url: str | None) -> str:
    url = url or os.environ.get("SHADOWTOPIC_URL") or DEFAULT_URL
    for scheme in ("grpc://", "shadowtopic://"):
        if url.startswith(scheme):
            url = url[len(scheme):]
    return url


class Connection:
    def __init__(self, url: str | None = None, timeout: float = 30.0):
        self.url = service_url(url)
        self.timeout = timeout
        self.channel = grpc.insecure_channel(self.url, options=[
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.enable_retries", 1)])
        self.closed = False
        self.admin = admin_pb2_grpc.AdminStub(self.channel)
        self.producer = producer_pb2_grpc.ProducerStub(self.channel)

    def call(self, method, request, timeout: float | None = None):
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
