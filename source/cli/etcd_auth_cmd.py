"""`shadowtopic etcd-auth setup`: etcd's users and roles for shadowtopic, then etcd's auth on
(docs/SECURITY.md, "etcd"; source/metadata/etcd_auth.py says what each role may read and
write).

    shadowtopic etcd-auth setup [--etcd HOST:PORT[,HOST:PORT...]] --root-password-file FILE
                                [--broker-password-file FILE] [--compaction-password-file FILE]
                                [--cluster NAME ...] [--etcd-ca-file PEM [--etcd-cert-file PEM
                                --etcd-key-file PEM]] [-o table|json]

It makes user `root` (role root) with the password of --root-password-file and, for each
role whose password file is given, a user of the role's name (`broker`, `compaction`) with
that role; the compaction role writes the compaction keys of each `--cluster` (default
`standalone`, the brokers' default cluster: give every cluster its workers serve). Then it
turns auth on. It adds only what is missing and sets a password only when etcd refuses it,
so it may run again (say for another cluster): on a cluster set up already it changes
nothing. Once auth is on it works as root. A password file holds the password, less one
trailing newline; passwords are never arguments (an argument shows in `ps`).

It prints what it changed, one line each, or that nothing changed (`-o json`: `{"etcd":
ENDPOINTS, "changes": [...]}`); every error is one `error:` line, exit 1 (etcd refusing
root's password: `MetadataUnauthenticated`).

`add_etcd_flags` are the etcd access flags (`--etcd-user`, `--etcd-password-file`,
`--etcd-ca-file`, `--etcd-cert-file`, `--etcd-key-file`) of the CLI commands that read etcd
themselves (`brokers list|health`): the processes' own (source/metadata/etcd_options.py),
defined again here so that the CLI loads the metadata package (etcd3) only when such a command
runs; `etcd_access(args)` reads them.
"""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from shadowtopic.cli.brokers import etcd_endpoints
from shadowtopic.cli.output import emit, fail

if TYPE_CHECKING:
    from shadowtopic.metadata.etcd_options import EtcdOptions

#: the flags of `add_etcd_flags` that say how to dial etcd (TLS); the user flags are the rest
TLS_FLAGS = {
    "--etcd-ca-file": "dial etcd with TLS, trusting these CA certificates",
    "--etcd-cert-file": "a client certificate for etcd (mutual TLS)",
    "--etcd-key-file": "the key of --etcd-cert-file",
}
USER_FLAGS = {
    "--etcd-user": "read etcd as this etcd user (its password from --etcd-password-file or "
                   "$SHADOWTOPIC_ETCD_PASSWORD)",
    "--etcd-password-file": "the etcd user's password (the file's content less one trailing "
                            "newline)",
}


def add_etcd_flags(p: argparse.ArgumentParser, user: bool = True) -> None:
    """etcd's TLS flags and, with `user`, its user's (module doc)."""
    for flag, text in ({**USER_FLAGS, **TLS_FLAGS} if user else TLS_FLAGS).items():
        p.add_argument(flag, default=None, metavar="PEM" if flag in TLS_FLAGS else
                       ("NAME" if flag == "--etcd-user" else "FILE"), help=text)


def etcd_access(args: argparse.Namespace, user: bool = True) -> EtcdOptions:
    """The `EtcdOptions` of the parsed `add_etcd_flags` (the same `user`); a bad combination
    is one `error:` line."""
    from shadowtopic.metadata.etcd_options import EtcdOptions, from_namespace
    try:
        if not user:
            return EtcdOptions(ca_file=args.etcd_ca_file, cert_file=args.etcd_cert_file,
                               key_file=args.etcd_key_file)
        return from_namespace(args)
    except ValueError as exc:
        fail(str(exc))


def add_parser(sub) -> None:
    """`etcd-auth ...` under the CLI's subcommands."""
    group = sub.add_parser("etcd-auth", help="etcd's own auth: the users and roles brokers "
                                             "and the compaction worker run as")
    actions = group.add_subparsers(dest="action", required=True)
    p = actions.add_parser("setup", help="make users root, broker and compaction with their "
                                         "roles (key-prefix grants), then turn etcd's auth on")
    p.add_argument("--etcd", default=None, metavar="HOST:PORT",
                   help="etcd endpoints, comma-separated (default $SHADOWTOPIC_ETCD or "
                        "127.0.0.1:2379)")
    p.add_argument("--root-password-file", required=True, metavar="FILE",
                   help="the password of etcd's root user (set when auth is off, checked "
                        "when it is on)")
    p.add_argument("--broker-password-file", default=None, metavar="FILE",
                   help="the password of user broker (role broker: readwrite /shadowtopic/)")
    p.add_argument("--compaction-password-file", default=None, metavar="FILE",
                   help="the password of user compaction (role compaction: what the "
                        "compaction worker writes)")
    p.add_argument("--cluster", action="append", default=None, metavar="NAME",
                   help="a cluster whose compaction keys the compaction role writes (repeat "
                        "for more; default standalone)")
    p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                   help="seconds each call to etcd may take (default 5)")
    add_etcd_flags(p, user=False)
    p.add_argument("-o", "--output", choices=["table", "json"], default=argparse.SUPPRESS,
                   help="table (default) or json")
    p.set_defaults(func=setup)


def _password(path: str) -> str:
    from shadowtopic.metadata.etcd_options import read_password_file
    try:
        return read_password_file(path)
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}")
    except ValueError as exc:
        fail(str(exc))


def setup(args: argparse.Namespace) -> int:
    from shadowtopic.metadata.base import MetadataError
    from shadowtopic.metadata.etcd_auth import BROKER, COMPACTION, set_up

    endpoints = etcd_endpoints(args.etcd)
    files = {BROKER: args.broker_password_file, COMPACTION: args.compaction_password_file}
    users = {role: _password(path) for role, path in files.items() if path is not None}
    if not users:
        fail("give --broker-password-file or --compaction-password-file (or both): the "
             "users shadowtopic runs as")
    root = _password(args.root_password_file)
    try:
        changes = set_up(endpoints, root, users, args.cluster or ["standalone"],
                         options=etcd_access(args, user=False), timeout=args.timeout)
    except MetadataError as exc:
        fail(f"etcd at {endpoints}: {exc.reason}: {exc.message}")
    if args.output == "json":
        emit({"etcd": endpoints, "changes": changes}, "json")
    elif changes:
        print("\n".join(changes))
        print(f"etcd at {endpoints}: auth on")
    else:
        print(f"etcd at {endpoints}: auth on, users and roles in place (nothing changed)")
    return 0
