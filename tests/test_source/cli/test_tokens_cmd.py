"""`shadowtopic tokens` (source/cli/tokens_cmd.py) run in-process through the CLI's `main`:
each flag, key files never overwritten, algorithms inferred from and checked against key
files, and every failure one `error:` line with exit 1. The console script end to end is in
tests/test_integration/test_cli_tokens.py."""
from __future__ import annotations

import base64
import io
import json
import os
import stat
import subprocess

import pytest
from support.cli_results import ok, one_line_error

from shadowtopic.cli.main import main


@pytest.fixture
def cli(capsys, monkeypatch):
    """cli(*args, stdin=None) -> CompletedProcess of `shadowtopic tokens *args`."""
    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        if stdin is not None:
            monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        with pytest.raises(SystemExit) as info:
            main(["tokens", *args])
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, info.value.code, out.out, out.err)
    return run


def test_secret_keys_raw_or_base64_never_overwritten(cli, tmp_path):
    key = tmp_path / "k"
    assert "32 bytes" in ok(cli("create-secret-key", "--output", str(key)))
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600 and len(key.read_bytes()) == 32
    before = key.read_bytes()
    one_line_error(cli("create-secret-key", "--output", str(key)), "exists: not overwritten")
    assert key.read_bytes() == before

    b64 = tmp_path / "b64"
    ok(cli("create-secret-key", "--output", str(b64), "--base64"))
    assert len(base64.b64decode(b64.read_bytes().strip(), validate=True)) == 32
    printed = ok(cli("create-secret-key", "--base64"))
    assert printed.endswith("\n") and len(base64.b64decode(printed.strip(), validate=True)) == 32

    token = ok(cli("create", "-s", "svc", "--secret-key", str(b64))).strip()
    out = json.loads(ok(cli("validate", token, "--secret-key", str(b64), "-o", "json")))
    assert out == {"subject": "svc", "algorithm": "HS256", "expires_at": None,
                   "expires_in_s": None}
    assert "never" in ok(cli("validate", token, "--secret-key", str(b64)))
    one_line_error(cli("validate", token, "--secret-key", str(key)),
                   "Unauthenticated: token signature does not verify")
    one_line_error(cli("create", "-s", "svc", "--secret-key", str(key), "-a", "RS256"),
                   "secret key signs HS256 tokens")


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
def test_key_pairs_and_their_algorithm(cli, tmp_path, alg):
    private, public = tmp_path / "private.pem", tmp_path / "public.pem"
    ok(cli("create-key-pair", "--algorithm", alg, "--output-private-key", str(private),
           "--output-public-key", str(public)))
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert public.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")

    token = ok(cli("create", "--subject", "reader", "--expiry", "30m", "--private-key",
                   str(private), "--header", "kid=k1")).strip()
    out = json.loads(ok(cli("validate", "-i", "--public-key", str(public), "-o", "json",
                            stdin=token + "\n")))
    assert out["subject"] == "reader" and out["algorithm"] == alg
    assert 1790 <= out["expires_in_s"] <= 1800
    ok(cli("validate", token, "--public-key", str(public), "--algorithm", alg))

    other = "ES256" if alg == "RS256" else "RS256"
    one_line_error(cli("create", "-s", "r", "--private-key", str(private), "-a", other),
                   f"not {other}")
    one_line_error(cli("validate", token, "--public-key", str(public), "-a", other),
                   f"not {other}")
    one_line_error(cli("validate", token, "--public-key", str(private)),
                   "give the public key")
    one_line_error(cli("validate", token, "--secret-key", str(public)),
                   "may not be a PEM")
    # neither file is replaced, and no private key is left without its public one
    new = tmp_path / "new.pem"
    one_line_error(cli("create-key-pair", "--algorithm", alg, "--output-private-key",
                       str(new), "--output-public-key", str(public)), "exists")
    assert not new.exists()
    one_line_error(cli("create-key-pair", "--output-private-key", str(new),
                       "--output-public-key", str(new)), "same file")


def test_bad_tokens_are_one_line_that_never_quotes_them(cli, tmp_path):
    key = tmp_path / "k"
    ok(cli("create-secret-key", "--output", str(key)))
    token = ok(cli("create", "-s", "a", "--secret-key", str(key))).strip()
    head, payload, _ = token.split(".")
    for bad, reason in [("garbage", "malformed token"), (f"{head}.{payload}", "malformed"),
                        (token[:-1], "Unauthenticated"), ("x" * 20_000, "too long"),
                        (f"{head}.{payload}.{'A' * 43}", "signature does not verify")]:
        line = one_line_error(cli("validate", "-i", "--secret-key", str(key), stdin=bad),
                              reason)
        assert bad not in line and payload not in line
    one_line_error(cli("validate", "-i", "--secret-key", str(key), stdin=""), "empty token")
    (tmp_path / "token").write_text("x" * 100_000)
    one_line_error(cli("validate", "-f", str(tmp_path / "token"), "--secret-key", str(key)),
                   "too long")


def test_usage_errors_are_one_line(cli, tmp_path):
    key = tmp_path / "k"
    ok(cli("create-secret-key", "--output", str(key)))
    one_line_error(cli("validate", "--secret-key", str(key)), "give the token")
    one_line_error(cli("validate", "a.b.c", "-i", "--secret-key", str(key), stdin="x"),
                   "one of them")
    one_line_error(cli("validate", "a.b.c"), "required")
    one_line_error(cli("create", "-s", "r", "--secret-key", str(key), "--private-key",
                       str(key)), "not allowed with argument")
    for expiry in ("0", "-1", "soon"):
        one_line_error(cli("create", "-s", "r", "--expiry", expiry, "--secret-key", str(key)),
                       "--expiry")
    assert ok(cli("create", "-s", "r", "--expiry", "1w", "--secret-key", str(key)))
    one_line_error(cli("create", "-s", "", "--secret-key", str(key)), "empty")
    one_line_error(cli("create", "-s", "r", "--secret-key", str(tmp_path / "missing")),
                   "No such file")
    one_line_error(cli("create", "-s", "r", "--secret-key", str(key), "--header",
                       "alg=none"), "InvalidArgument")
    one_line_error(cli("validate", "-f", str(tmp_path / "missing"), "--secret-key", str(key)),
                   "cannot read")
    one_line_error(cli("create-key-pair", "--algorithm", "HS256", "--output-private-key",
                       "a", "--output-public-key", "b"), "invalid choice")
