"""TLS on gRPC ports: what a process serves with and what it dials with.

A process that serves gRPC (a broker, the compaction worker's health port) serves TLS only
once it has a certificate (`--tls-cert-file`, `--tls-key-file`); with
`--tls-require-client-cert` it accepts only clients whose certificate a CA in
`--tls-trust-certs-file` signed (mutual TLS). The same process dials other brokers (stats,
lookups, replication, storage reads) with the CAs of `--tls-trust-certs-file` and, when it
has one, its own certificate as the client's: one cluster certificate serves both ways.

Files are read again when they change: the server checks their modification times at each
new connection's handshake (gRPC's certificate-configuration fetcher) and serves the new
certificate from then on, without a restart; open connections keep theirs. A channel
`dial`ed after the files changed uses the new ones. A file that cannot be read (or a pair
that does not match) keeps the last good configuration, logged.

TLS is all or nothing per port: a plaintext client's handshake fails against a TLS port, and
a channel dialled with `Dial.tls` never falls back to plaintext.
"""
from __future__ import annotations

import argparse
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

import grpc

from shadowtopic.security.dial import PLAINTEXT, Dial

log = logging.getLogger(__name__)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _stamp(paths: list[str]) -> tuple[tuple[int, int], ...]:
    out = []
    for p in paths:
        st = os.stat(p)
        out.append((st.st_mtime_ns, st.st_size))
    return tuple(out)




@dataclass(frozen=True)
class TlsOptions:
    """A serving process's TLS (see the module doc); off without `cert_file`."""

    cert_file: str | None = None
    key_file: str | None = None
    trust_certs_file: str | None = None
    require_client_cert: bool = False

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("--tls-cert-file and --tls-key-file go together")
        if self.require_client_cert and not (self.cert_file and self.trust_certs_file):
            raise ValueError("--tls-require-client-cert needs --tls-cert-file, --tls-key-file "
                             "and --tls-trust-certs-file (the CAs clients' certificates are "
                             "checked against)")
        for path in (self.cert_file, self.key_file, self.trust_certs_file):
            if path is not None and not os.access(path, os.R_OK):
                raise ValueError(f"cannot read {path}")

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None

    def dial(self) -> Dial:
        """How this process dials other brokers: as it serves (TLS with its trust store and
        its own certificate), or plaintext when it serves plaintext."""
        if not self.enabled:
            return PLAINTEXT
        return Dial(True, self.trust_certs_file, self.cert_file, self.key_file)

    def flags(self) -> list[str]:
        """These options as a serving process's command-line flags."""
        out: list[str] = []
        for flag, value in (("--tls-cert-file", self.cert_file),
                            ("--tls-key-file", self.key_file),
                            ("--tls-trust-certs-file", self.trust_certs_file)):
            if value is not None:
                out += [flag, value]
        return out + (["--tls-require-client-cert"] if self.require_client_cert else [])

    def server_credentials(self) -> grpc.ServerCredentials:
        """Credentials that read the files again when they change (module doc)."""
        return _Reloading(self).credentials()


class _Reloading:
    """The server's certificate configuration, read again when a file's mtime or size
    changed (checked at each handshake, at most once a second)."""

    CHECK_EVERY_S = 1.0

    def __init__(self, opts: TlsOptions):
        assert opts.cert_file is not None and opts.key_file is not None
        self._opts = opts
        self._paths = [p for p in (opts.cert_file, opts.key_file, opts.trust_certs_file) if p]
        self._lock = threading.Lock()
        self._stamp = _stamp(self._paths)
        self._checked = 0.0
        self._initial = self._configuration()

    def _configuration(self) -> Any:
        o = self._opts
        assert o.cert_file is not None and o.key_file is not None
        return grpc.ssl_server_certificate_configuration(
            [(_read(o.key_file), _read(o.cert_file))],
            root_certificates=_read(o.trust_certs_file) if o.trust_certs_file else None)

    def fetch(self) -> Any:
        """gRPC's fetcher: a new configuration, or None to keep the current one."""
        import time
        now = time.monotonic()
        with self._lock:
            if now - self._checked < self.CHECK_EVERY_S:
                return None
            self._checked = now
            try:
                stamp = _stamp(self._paths)
                if stamp == self._stamp:
                    return None
                config = self._configuration()
            except OSError as exc:
                log.warning("TLS files not reloaded (keeping the current ones): %s", exc)
                return None
            self._stamp = stamp
        log.info("TLS certificate files changed: new connections use them")
        return config

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._initial, self.fetch,
            require_client_authentication=self._opts.require_client_cert)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The TLS flags of a serving process (config file keys and environment variables too:
    source/config_file.py)."""
    p.add_argument("--tls-cert-file", default=None, metavar="PEM",
                   help="serve TLS only, with this certificate (and dial other brokers with "
                        "it as the client's); reloaded when it changes")
    p.add_argument("--tls-key-file", default=None, metavar="PEM",
                   help="the private key of --tls-cert-file")
    p.add_argument("--tls-trust-certs-file", default=None, metavar="PEM",
                   help="the CA certificates trusted: of brokers dialled, and of client "
                        "certificates with --tls-require-client-cert")
    p.add_argument("--tls-require-client-cert", action="store_true",
                   help="mutual TLS: refuse clients without a certificate a trusted CA "
                        "signed")


def options_from(p: argparse.ArgumentParser, a: argparse.Namespace) -> TlsOptions:
    """The TLS options of parsed flags; a bad combination ends with `p.error`."""
    try:
        return TlsOptions(a.tls_cert_file or None, a.tls_key_file or None,
                          a.tls_trust_certs_file or None, bool(a.tls_require_client_cert))
    except ValueError as exc:
        p.error(str(exc))
        raise  # not reached
