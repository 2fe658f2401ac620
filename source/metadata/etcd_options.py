"""How a process reaches etcd beyond its endpoints: etcd's own authentication (a user and its
password) and TLS to etcd (docs/SECURITY.md, "etcd"). Every process that talks to etcd (the
brokers, the compaction worker, `shadowtopic brokers`) takes these flags:

    --etcd-user NAME            authenticate as this etcd user (etcd's users and roles)
    --etcd-password-file FILE   its password: the file's content less one trailing newline
    $SHADOWTOPIC_ETCD_PASSWORD  the password, when no file is configured
    --etcd-ca-file PEM          dial etcd with TLS, trusting these CA certificates
    --etcd-cert-file PEM        this client's certificate for etcd (mutual TLS), with
    --etcd-key-file PEM         its private key

The password is never a flag (a flag shows in `ps`). The password file is read at each
authentication, so a password changed in etcd and in the file is taken at the next one
(source/metadata/etcd.py authenticates when it starts and again whenever etcd refuses its
token). The TLS files are read when the store is made. An etcd started with
`--client-cert-auth` takes the client certificate's common name as the user when no
password is given: certificate-based etcd auth needs `--etcd-ca-file`, `--etcd-cert-file`
and `--etcd-key-file` only.

Each flag is also a key of the process's config file section (`etcd_user`,
`etcd_password_file`, `etcd_ca_file`, `etcd_cert_file`, `etcd_key_file`) and a
`SHADOWTOPIC_CFG__<SECTION>__<KEY>` variable (source/config_file.py).
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc

PASSWORD_ENV = "SHADOWTOPIC_ETCD_PASSWORD"
#: a password file larger than this is refused (it is not a password)
MAX_PASSWORD_FILE = 4096


@dataclass(frozen=True)
class EtcdOptions:
    """Credentials and TLS for etcd (module doc); the defaults: anonymous, plaintext.

    `password` is the password itself (from `$SHADOWTOPIC_ETCD_PASSWORD`, or given in code);
    `password_file` a file that holds it. A user needs one of them; a certificate needs its
    key and the CA that signed etcd's certificate."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    password_file: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        if self.user is not None and not self.user.strip():
            raise ValueError("--etcd-user is empty")
        has_password = self.password is not None or self.password_file is not None
        if self.user is None and has_password:
            raise ValueError("an etcd password needs --etcd-user (the user it is of)")
        if self.user is not None and not has_password:
            raise ValueError(f"--etcd-user {self.user} needs its password: "
                             f"--etcd-password-file FILE or ${PASSWORD_ENV}")
        if self.password is not None and not self.password:
            raise ValueError(f"${PASSWORD_ENV} is empty")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("--etcd-cert-file and --etcd-key-file go together")
        if self.cert_file is not None and self.ca_file is None:
            raise ValueError("--etcd-cert-file needs --etcd-ca-file (the CA certificates that "
                             "etcd's certificate is checked against)")
        for path in (self.password_file, self.ca_file, self.cert_file, self.key_file):
            if path is not None and not os.access(path, os.R_OK):
                raise ValueError(f"cannot read {path}")

    @property
    def tls(self) -> bool:
        """Dial etcd with TLS (never falling back to plaintext)."""
        return self.ca_file is not None

    def read_password(self) -> str:
        """The password: `password`, else the password file's content less one trailing
        newline, read now. Raises OSError (unreadable) or ValueError (empty, too large, not
        UTF-8)."""
        if self.password is not None:
            return self.password
        if self.password_file is None:
            raise ValueError("no etcd password configured")
        return read_password_file(self.password_file)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials of a channel to etcd (None: plaintext), the files read now."""
        if self.ca_file is None:
            return None
        with open(self.ca_file, "rb") as f:
            ca = f.read()
        key = cert = None
        if self.cert_file is not None and self.key_file is not None:
            with open(self.key_file, "rb") as f:
                key = f.read()
            with open(self.cert_file, "rb") as f:
                cert = f.read()
        return grpc.ssl_channel_credentials(ca, key, cert)

    def flags(self) -> list[str]:
        """These options as a child process's flags. A password given as a value (not a
        file) is not among them: `env()` passes it."""
        out: list[str] = []
        for flag, value in (("--etcd-user", self.user),
                            ("--etcd-password-file", self.password_file),
                            ("--etcd-ca-file", self.ca_file),
                            ("--etcd-cert-file", self.cert_file),
                            ("--etcd-key-file", self.key_file)):
            if value is not None:
                out += [flag, value]
        return out

    def env(self) -> dict[str, str]:
        """The environment a child process takes a password given as a value from."""
        if self.password is not None and self.password_file is None:
            return {PASSWORD_ENV: self.password}
        return {}


def read_password_file(path: str) -> str:
    """A password file's content less one trailing newline. Raises OSError (unreadable) or
    ValueError (empty, larger than MAX_PASSWORD_FILE, not UTF-8)."""
    with open(path, "rb") as f:
        data = f.read(MAX_PASSWORD_FILE + 1)
    if len(data) > MAX_PASSWORD_FILE:
        raise ValueError(f"{path} is larger than {MAX_PASSWORD_FILE} bytes: not a password "
                         "file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise ValueError(f"{path} is empty")
    return text


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The etcd credential and TLS flags (config file keys and environment variables too:
    source/config_file.py)."""
    g = p.add_argument_group("etcd access (docs/SECURITY.md, \"etcd\")")
    g.add_argument("--etcd-user", default=None, metavar="NAME",
                   help="authenticate to etcd as this user (etcd's own auth); its password "
                        f"from --etcd-password-file or ${PASSWORD_ENV}")
    g.add_argument("--etcd-password-file", default=None, metavar="FILE",
                   help="the etcd user's password: the file's content less one trailing "
                        "newline (read at each authentication)")
    g.add_argument("--etcd-ca-file", default=None, metavar="PEM",
                   help="dial etcd with TLS, trusting these CA certificates")
    g.add_argument("--etcd-cert-file", default=None, metavar="PEM",
                   help="this process's client certificate for etcd (mutual TLS; etcd with "
                        "--client-cert-auth takes its common name as the user when no "
                        "password is given)")
    g.add_argument("--etcd-key-file", default=None, metavar="PEM",
                   help="the key of --etcd-cert-file")


def from_namespace(a: argparse.Namespace, environ: Mapping[str, str] | None = None
                   ) -> EtcdOptions:
    """The options the parsed flags (`add_arguments`) and `$SHADOWTOPIC_ETCD_PASSWORD` give
    (the variable counts only for a user with no password file). Raises ValueError."""
    environ = os.environ if environ is None else environ
    password = None
    if a.etcd_user is not None and a.etcd_password_file is None:
        password = environ.get(PASSWORD_ENV)
    return EtcdOptions(user=a.etcd_user, password=password,
                       password_file=a.etcd_password_file, ca_file=a.etcd_ca_file,
                       cert_file=a.etcd_cert_file, key_file=a.etcd_key_file)


def options_from(p: argparse.ArgumentParser, a: argparse.Namespace,
                 environ: Mapping[str, str] | None = None) -> EtcdOptions:
    """`from_namespace`, a bad combination being the parser's usage error."""
    try:
        return from_namespace(a, environ)
    except ValueError as exc:
        p.error(str(exc))
