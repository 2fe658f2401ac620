"""How a client, the CLI or a broker dials a broker: plaintext or TLS (never a fallback from
one to the other), and the token it presents (docs/SECURITY.md).

`Dial` makes sync and asyncio channels. With TLS, the files are read when the channel is made,
so a channel made after a certificate rotated uses the new one. With a `token` (a callable
returning the current token: `token_source`), every call carries the metadata
`authorization: Bearer <token>`, asked of the callable at each call (a stream: at its start),
so a callable that refreshes, or a file that is rewritten, is followed.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

AUTHORIZATION = "authorization"

Token = Callable[[], str]
#: what a user gives as `auth_token`: the token, a file holding it, or a callable
AuthToken = str | os.PathLike[str] | Token


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def token_source(token: AuthToken | None) -> Token | None:
    """A token callable from what a user gives: a token string, a file path (`pathlib.Path`
    or a `file://` URL: read at each call, so a rewritten file is followed) or a callable
    (called at each call). ValueError for anything else."""
    if token is None:
        return None
    if callable(token):
        return token
    if isinstance(token, os.PathLike) or (isinstance(token, str) and
                                          token.startswith("file://")):
        path = os.fspath(token)
        path = path[len("file://"):] if path.startswith("file://") else path

        def read() -> str:
            return _read(path).decode("utf-8", "replace").strip()
        return read
    if isinstance(token, str):
        if not token.strip():
            raise ValueError("auth_token is empty")
        text = token.strip()
        return lambda: text
    raise ValueError(f"auth_token must be a token, a file path or a callable, got {token!r}")


def _with_token(metadata: Sequence[tuple[str, Any]] | None, token: Token
                ) -> list[tuple[str, Any]]:
    return [*(metadata or ()), (AUTHORIZATION, "Bearer " + token())]


class _Details:
    """gRPC's client call details with other metadata (its namedtuple types differ)."""

    def __init__(self, details: Any, metadata: list[tuple[str, Any]]):
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
              grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the token to every call of a sync channel."""

    def __init__(self, token: Token):
        self._token = token

    def _details(self, details: Any) -> Any:
        return _Details(details, _with_token(details.metadata, self._token))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


class _AioBearer:
    """Adds the token to the calls of an asyncio channel (one subclass per call kind:
    grpc.aio files each interceptor under the first kind it is an instance of)."""

    def __init__(self, token: Token):
        self._token = token

    def _details(self, details: Any) -> Any:
        return details._replace(metadata=grpc.aio.Metadata(
            *_with_token(list(details.metadata or ()), self._token)))


class _AioUnaryUnary(_AioBearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _AioUnaryStream(_AioBearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _AioStreamUnary(_AioBearer, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details,
                                     request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


class _AioStreamStream(_AioBearer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details,
                                      request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


def _aio_bearers(token: Token) -> list[Any]:
    return [kind(token) for kind in (_AioUnaryUnary, _AioUnaryStream, _AioStreamUnary,
                                     _AioStreamStream)]


@dataclass(frozen=True)
class Dial:
    """How a client dials a broker: plaintext (`tls=False`), or TLS trusting the CAs of
    `trust_certs_file` (None: the system's roots), presenting `cert_file` / `key_file` when
    given (mutual TLS; its common name is the role, docs/SECURITY.md)."""

    tls: bool = False
    trust_certs_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token: Token | None = None  # presented at every call (module doc)

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs both its cert file and its key file")
        if not self.tls and (self.trust_certs_file or self.cert_file):
            raise ValueError("TLS files given without tls=True")

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel credentials, read from the files now."""
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.trust_certs_file) if self.trust_certs_file else None,
            private_key=_read(self.key_file) if self.key_file else None,
            certificate_chain=_read(self.cert_file) if self.cert_file else None)

    def channel(self, url: str, options: list[tuple[str, Any]] | None = None
                ) -> grpc.Channel:
        """A sync channel to `url`."""
        ch = (grpc.secure_channel(url, self.credentials(), options=options) if self.tls
              else grpc.insecure_channel(url, options=options))
        return ch if self.token is None else grpc.intercept_channel(ch, _Bearer(self.token))

    def aio_channel(self, url: str, options: list[tuple[str, Any]] | None = None
                    ) -> grpc.aio.Channel:
        """An asyncio channel to `url`."""
        interceptors = None if self.token is None else _aio_bearers(self.token)
        if not self.tls:
            return grpc.aio.insecure_channel(url, options=options, interceptors=interceptors)
        return grpc.aio.secure_channel(url, self.credentials(), options=options,
                                       interceptors=interceptors)


PLAINTEXT = Dial()
