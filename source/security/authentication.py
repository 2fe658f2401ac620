"""Who is calling: the role of a gRPC call, from its token or its client certificate (as
Pulsar's authentication providers).

- **token**: the call's metadata `authorization: Bearer <JWT>` (tokens.py), validated with the
  broker's secret key or public key; the role is the token's `sub`. A token is validated once
  and remembered (up to `CACHE_TOKENS` of them) until it expires.
- **tls**: the subject common name of the client certificate the TLS handshake verified
  (mutual TLS: tls.py, `--tls-require-client-cert`).

A call with a token is authenticated by its token (a bad token is refused even when a
certificate would do); a call without one, by its certificate when the tls provider is on.
Nothing else authenticates: a call with neither is refused (`Unauthenticated`), and so is
any token when no token provider is configured. When no provider is configured at all,
authentication is off and every call is `ANONYMOUS`.
"""
from __future__ import annotations

import argparse
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shadowtopic.core import errors
from shadowtopic.security.tokens import Claims, TokenValidator

AUTHORIZATION = "authorization"  # the metadata key (gRPC lower-cases keys)
BEARER = "bearer "
CACHE_TOKENS = 4096
#: the TLS auth context's property of the verified client certificate's common name
CERT_COMMON_NAME = "x509_common_name"


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: its `role`, how it was authenticated ("token", "tls" or
    "anonymous" when authentication is off), and when its credential expires (seconds since
    the epoch; None: never)."""

    role: str
    method: str
    expires_at: float | None = None


ANONYMOUS = Principal("", "anonymous")


def bearer(token: str) -> tuple[str, str]:
    """The metadata item that carries `token`."""
    return AUTHORIZATION, "Bearer " + token


class Authenticator:
    """The providers a broker was configured with (module doc)."""

    def __init__(self, tokens: TokenValidator | None = None, tls: bool = False):
        self._tokens = tokens
        self._tls = tls
        self._lock = threading.Lock()
        self._known: OrderedDict[str, Claims] = OrderedDict()  # valid tokens, newest last

    @property
    def enabled(self) -> bool:
        return self._tokens is not None or self._tls

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]] | None,
                     auth_context: Mapping[str, Iterable[bytes]] | None = None) -> Principal:
        """The principal of a call with this `metadata` and TLS `auth_context` (gRPC's);
        `errors.Unauthenticated` with the reason otherwise."""
        if not self.enabled:
            return ANONYMOUS
        token = _token(metadata)
        if token is not None:
            if self._tokens is None:
                raise errors.Unauthenticated("this broker does not take tokens "
                                             "(authenticate with a client certificate)")
            claims = self._claims(token)
            return Principal(claims.role, "token", claims.expires_at)
        if self._tls:
            names = list((auth_context or {}).get(CERT_COMMON_NAME) or ())
            if names:
                role = names[0].decode("utf-8", "replace")
                if role:
                    return Principal(role, "tls")
            raise errors.Unauthenticated("no token and no client certificate with a common "
                                         "name: authentication is required")
        raise errors.Unauthenticated("no token: authentication is required (metadata "
                                     "'authorization: Bearer <token>')")

    def _claims(self, token: str) -> Claims:
        assert self._tokens is not None
        now = time.time()
        with self._lock:
            known = self._known.get(token)
            if known is not None:
                if known.expires_at is None or now <= known.expires_at + self._tokens.leeway_s:
                    self._known.move_to_end(token)
                    return known
                del self._known[token]
        claims = self._tokens.validate(token)  # (raises Unauthenticated with its reason)
        with self._lock:
            self._known[token] = claims
            if len(self._known) > CACHE_TOKENS:
                self._known.popitem(last=False)
        return claims


def _token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The bearer token of the metadata, or None when it carries none."""
    for key, value in metadata or ():
        if key != AUTHORIZATION:
            continue
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        if not text[:len(BEARER)].lower() == BEARER:
            raise errors.Unauthenticated("the authorization metadata is not 'Bearer <token>'")
        return text[len(BEARER):].strip()
    return None


@dataclass(frozen=True)
class AuthOptions:
    """A broker's authentication flags (module doc); off when none is given."""

    token_secret_key: str | None = None     # a secret key file (HS256)
    token_public_key: str | None = None     # a public key file (RS256, ES256)
    token_audience: str | None = None       # tokens must name it in `aud`
    tls: bool = False                       # roles from client certificates
    #: the token this broker presents when it dials another broker (a file, read at each
    #: new connection); without one it presents its certificate (mutual TLS)
    client_token_file: str | None = None
    #: authorization (source/broker/authorize.py): on, every call needs a role allowed to
    #: make it; superusers may do everything; proxy roles may act for another role
    authorization: bool = False
    superuser_roles: tuple[str, ...] = ()
    proxy_roles: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.token_secret_key and self.token_public_key:
            raise ValueError("give --auth-token-secret-key or --auth-token-public-key, "
                             "not both")
        if self.authorization and not (self.token_secret_key or self.token_public_key
                                       or self.tls):
            raise ValueError("--authorization needs an authentication provider "
                             "(--auth-token-secret-key, --auth-token-public-key or --auth-tls)")

    def authenticator(self) -> Authenticator:
        """The broker's authenticator (`InvalidArgument` for a key file that does not
        load)."""
        validator = None
        if self.token_secret_key or self.token_public_key:
            validator = TokenValidator.from_files(secret_key=self.token_secret_key,
                                                  public_key=self.token_public_key,
                                                  audience=self.token_audience)
        return Authenticator(validator, self.tls)

    def flags(self) -> list[str]:
        """These options as command-line flags."""
        out: list[str] = []
        for flag, value in (("--auth-token-secret-key", self.token_secret_key),
                            ("--auth-token-public-key", self.token_public_key),
                            ("--auth-token-audience", self.token_audience),
                            ("--auth-client-token-file", self.client_token_file)):
            if value:
                out += [flag, value]
        for flag, roles in (("--superuser-roles", self.superuser_roles),
                            ("--proxy-roles", self.proxy_roles)):
            if roles:
                out += [flag, ",".join(roles)]
        return out + (["--auth-tls"] if self.tls else []) + \
            (["--authorization"] if self.authorization else [])


def add_arguments(p: argparse.ArgumentParser) -> None:
    """A broker's authentication flags (config file keys and environment variables too)."""
    p.add_argument("--auth-token-secret-key", default=None, metavar="FILE",
                   help="authenticate token callers: validate tokens with this secret key "
                        "(HS256; shadowtopic tokens create-secret-key)")
    p.add_argument("--auth-token-public-key", default=None, metavar="PEM",
                   help="authenticate token callers: validate tokens with this public key "
                        "(RS256 or ES256; shadowtopic tokens create-key-pair)")
    p.add_argument("--auth-token-audience", default=None, metavar="NAME",
                   help="tokens must name this audience in their `aud` claim")
    p.add_argument("--auth-tls", action="store_true",
                   help="authenticate callers without a token by their client certificate "
                        "(its common name is the role; needs --tls-require-client-cert)")
    p.add_argument("--auth-client-token-file", default=None, metavar="FILE",
                   help="the token this broker presents when it dials another broker")
    p.add_argument("--authorization", action="store_true",
                   help="authorize every call: roles need grants (needs an authentication "
                        "provider; docs/SECURITY.md, Authorization)")
    p.add_argument("--superuser-roles", default="", metavar="ROLE,ROLE",
                   help="roles that may do everything (list every broker's role here)")
    p.add_argument("--proxy-roles", default="", metavar="ROLE,ROLE",
                   help="roles that may forward calls for another role (brokers' roles)")


def options_from(p: argparse.ArgumentParser, a: argparse.Namespace,
                 require_client_cert: bool) -> AuthOptions:
    """The authentication options of parsed flags; a bad combination ends with `p.error`."""
    if a.auth_tls and not require_client_cert:
        p.error("--auth-tls needs --tls-require-client-cert (roles come from verified client "
                "certificates)")
    try:
        opts = AuthOptions(a.auth_token_secret_key or None, a.auth_token_public_key or None,
                           a.auth_token_audience or None, bool(a.auth_tls),
                           a.auth_client_token_file or None, bool(a.authorization),
                           _roles(a.superuser_roles), _roles(a.proxy_roles))
        opts.authenticator()  # (a key file that does not load: refused now, not per call)
    except (ValueError, errors.ShadowTopicError) as exc:
        p.error(str(exc))
        raise  # not reached
    return opts


def _roles(text: str) -> tuple[str, ...]:
    return tuple(r.strip() for r in (text or "").split(",") if r.strip())
