"""`shadowtopic tokens`: keys and tokens for token authentication, as Pulsar's `pulsar tokens`
(source/security/tokens.py owns the formats, the algorithms and what a validator refuses).

    shadowtopic tokens create-secret-key [--output FILE] [--base64]
    shadowtopic tokens create-key-pair [--algorithm RS256|ES256] --output-private-key FILE
                                       --output-public-key FILE
    shadowtopic tokens create --subject ROLE [--expiry 1h] (--secret-key FILE | --private-key
                              FILE) [--algorithm ALG] [--header KEY=VALUE ...]
    shadowtopic tokens validate (TOKEN | -i/--stdin | -f/--token-file FILE) (--secret-key FILE
                                | --public-key FILE) [--algorithm ALG] [-o table|json]

Key files are created new (an existing file is not overwritten: replacing a key would end
every token made with it), private and secret keys with mode 0600. Without --output a raw
secret key goes to stdout, but never to a terminal (use --base64 there). The algorithm of a
key pair file is the key's own (RSA: RS256, P-256: ES256); --algorithm, when given, must
match it. `validate` prints the role and the expiry of a valid token, else one `error:
Unauthenticated: <reason>` line (exit 1); a token given as an argument shows in `ps` and the
shell's history: prefer --stdin or --token-file.

The tokens module (PyJWT, cryptography: the `broker` extra) is imported when a tokens
command runs, never by other commands.
"""
from __future__ import annotations

import argparse
import base64
import datetime
import os
import sys
import time
from types import ModuleType

from shadowtopic.cli.output import emit, fail
from shadowtopic.core.argtypes import duration, key_value

ALGORITHMS = ("HS256", "RS256", "ES256")


def add_parser(sub) -> None:
    """`tokens ...` under the CLI's subcommands."""
    group = sub.add_parser("tokens", help="keys and tokens for token authentication "
                                          "(JWT: HS256, RS256, ES256)")
    actions = group.add_subparsers(dest="action", required=True)

    p = actions.add_parser("create-secret-key", help="a new secret key (HS256, 32 random "
                                                     "bytes)")
    p.add_argument("--output", metavar="FILE", default=None,
                   help="write it to FILE, created new with mode 0600 (default: stdout)")
    p.add_argument("--base64", action="store_true",
                   help="the key in base64 text rather than raw bytes")
    p.set_defaults(func=create_secret_key)

    p = actions.add_parser("create-key-pair", help="a new key pair: the private key creates "
                                                   "tokens, the public key validates them")
    p.add_argument("--algorithm", choices=("RS256", "ES256"), default="RS256",
                   help="RS256 (RSA 2048, the default) or ES256 (ECDSA P-256)")
    p.add_argument("--output-private-key", metavar="FILE", required=True,
                   help="PEM (PKCS#8), created new with mode 0600")
    p.add_argument("--output-public-key", metavar="FILE", required=True,
                   help="PEM, created new")
    p.set_defaults(func=create_key_pair)

    p = actions.add_parser("create", help="a token for a role, signed with a secret or a "
                                          "private key; prints it")
    p.add_argument("--subject", "-s", required=True, metavar="ROLE",
                   help="the role the token authenticates as (its sub claim)")
    p.add_argument("--expiry", "-e", "--expiry-time", type=_expiry, default=None,
                   metavar="DURATION",
                   help="valid for this long, e.g. 30m, 1h, 2d, 1w (default: no expiry)")
    _key_flags(p, private=True)
    p.add_argument("--header", type=key_value, action="append", default=[],
                   metavar="KEY=VALUE", help="a JOSE header field, e.g. kid=2024 (repeat "
                                             "for more; never alg)")
    p.set_defaults(func=create_token)

    p = actions.add_parser("validate", help="check a token with a secret or a public key; "
                                            "print its role and expiry")
    p.add_argument("token", nargs="?", default=None,
                   help="the token (visible to `ps`: prefer --stdin or --token-file)")
    p.add_argument("-i", "--stdin", action="store_true", help="read the token from stdin")
    p.add_argument("-f", "--token-file", metavar="FILE", default=None,
                   help="read the token from FILE")
    _key_flags(p, private=False)
    p.add_argument("-o", "--output", choices=["table", "json"], default=argparse.SUPPRESS,
                   help="table (default) or json")
    p.set_defaults(func=validate_token)


def _key_flags(p: argparse.ArgumentParser, private: bool) -> None:
    key = p.add_mutually_exclusive_group(required=True)
    key.add_argument("--secret-key", metavar="FILE", default=None,
                     help="an HS256 secret key file (raw or base64)")
    if private:
        key.add_argument("--private-key", metavar="FILE", default=None,
                         help="a private key PEM file (RS256 or ES256)")
    else:
        key.add_argument("--public-key", metavar="FILE", default=None,
                         help="a public key PEM file (RS256 or ES256)")
    p.add_argument("--algorithm", "-a", choices=ALGORITHMS, default=None,
                   help="default: the key's (HS256 for a secret key)")


def _expiry(text: str) -> int:
    seconds = duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not an expiry above 0 (e.g. 30m, 1h, "
                                         "2d; leave --expiry out for none)")
    return seconds


def _tokens() -> ModuleType:
    """The tokens module, or one error line when its libraries are not installed."""
    try:
        from shadowtopic.security import tokens
    except ModuleNotFoundError as exc:
        if exc.name not in ("jwt", "cryptography"):
            raise
        fail(f"tokens commands need {exc.name} (PyJWT, cryptography): "
             "pip install 'shadowtopic[broker]'")
    return tokens


def _write_new(path: str, data: bytes, mode: int) -> None:
    """Create `path` (never over an existing file or through a symlink) holding `data`."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except FileExistsError:
        fail(f"{path} exists: not overwritten (a new key ends the tokens of the old one; "
             "remove the file first to replace it)")
    except OSError as exc:
        fail(f"cannot create {path}: {exc.strerror or exc}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        _remove(path)
        fail(f"cannot write {path}: {exc.strerror or exc}")


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def create_secret_key(args: argparse.Namespace) -> int:
    key = _tokens().create_secret_key()
    data = base64.b64encode(key) + b"\n" if args.base64 else key
    if args.output is None:
        if not args.base64 and sys.stdout.isatty():
            fail("not writing a raw key to a terminal: give --output FILE or --base64")
        sys.stdout.buffer.write(data)
        return 0
    _write_new(args.output, data, 0o600)
    print(f"secret key (HS256, {len(key)} bytes{', base64' if args.base64 else ''}) "
          f"written to {args.output}")
    return 0


def create_key_pair(args: argparse.Namespace) -> int:
    if os.path.abspath(args.output_private_key) == os.path.abspath(args.output_public_key):
        fail("--output-private-key and --output-public-key name the same file")
    for path in (args.output_private_key, args.output_public_key):
        if os.path.lexists(path):
            fail(f"{path} exists: not overwritten (remove it first to replace the key pair)")
    private_pem, public_pem = _tokens().create_key_pair(args.algorithm)
    _write_new(args.output_private_key, private_pem, 0o600)
    try:
        _write_new(args.output_public_key, public_pem, 0o644)
    except SystemExit:
        _remove(args.output_private_key)  # no private key without its public one
        raise
    print(f"{args.algorithm} key pair: private key {args.output_private_key}, "
          f"public key {args.output_public_key}")
    return 0


def create_token(args: argparse.Namespace) -> int:
    tokens = _tokens()
    if args.secret_key is not None:
        if args.algorithm not in (None, "HS256"):
            fail(f"a secret key signs HS256 tokens, not {args.algorithm} (use --private-key)")
        key, algorithm = tokens.load_secret_key(args.secret_key), "HS256"
    else:
        key, algorithm = tokens.load_key_pair_file(args.private_key, args.algorithm)
    token = tokens.create_token(args.subject, key, algorithm, args.expiry,
                                headers=dict(args.header) or None)
    print(token)
    return 0


def validate_token(args: argparse.Namespace) -> int:
    given = [args.token is not None, args.stdin, args.token_file is not None]
    if sum(given) != 1:
        fail("give the token as an argument, or --stdin, or --token-file FILE (one of them)")
    tokens = _tokens()
    validator = tokens.TokenValidator.from_files(secret_key=args.secret_key,
                                                 public_key=args.public_key,
                                                 algorithm=args.algorithm)
    limit = tokens.MAX_TOKEN_CHARS + 1024  # more is too long whatever it is: not read
    if args.stdin:
        text = sys.stdin.read(limit)
    elif args.token_file is not None:
        try:
            with open(args.token_file, encoding="ascii", errors="replace") as f:
                text = f.read(limit)
        except OSError as exc:
            fail(f"cannot read {args.token_file}: {exc.strerror or exc}")
    else:
        text = args.token
    claims = validator.validate(text.strip())
    never = None if args.output == "json" else "never"
    emit({"subject": claims.role, "algorithm": validator.algorithm,
          "expires_at": _when(claims.expires_at) or never,
          "expires_in_s": (round(claims.expires_at - time.time())
                           if claims.expires_at is not None else None)}, args.output)
    return 0


def _when(t: float | None) -> str | None:
    """ISO 8601 UTC of seconds since the epoch (None: never), or the number itself when it
    lies past what a date holds (year 9999)."""
    if t is None:
        return None
    try:
        when = datetime.datetime.fromtimestamp(t, datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return f"{t:.0f} s after the epoch"
    return when.isoformat().replace("+00:00", "Z")
