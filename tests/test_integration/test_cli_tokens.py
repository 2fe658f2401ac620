"""`shadowtopic tokens` as a user runs it: the installed console script, key files on disk,
tokens through stdout, stdin and files; a failure is one `error:` line and exit 1 that never
quotes the token. No broker: these commands only read and write files. (Each run starts a
CLI, a second or two on a busy machine: the cases of each flag are in-process, in
tests/test_source/cli/test_tokens_cmd.py.)"""
from __future__ import annotations

import json
import os
import pty
import stat
import subprocess
import sys

from support.cli_results import ok, one_line_error

EXE = os.path.join(os.path.dirname(sys.executable), "shadowtopic")


def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, "tokens", *args], capture_output=True, text=True, timeout=60,
                          input=input, stdin=None if input is not None else subprocess.DEVNULL)


def test_secret_key_create_validate_round_trip_through_files(tmp_path):
    key = tmp_path / "secret.key"
    ok(run("create-secret-key", "--output", str(key)))
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600 and len(key.read_bytes()) == 32

    token = ok(run("create", "--subject", "team-a", "--expiry", "1h", "--secret-key",
                   str(key))).strip()
    assert token.count(".") == 2
    out = json.loads(ok(run("validate", token, "--secret-key", str(key), "-o", "json")))
    assert out["subject"] == "team-a" and out["algorithm"] == "HS256"
    assert 3590 <= out["expires_in_s"] <= 3600 and out["expires_at"].endswith("Z")
    # from stdin (with the newline `echo` adds), as a table
    table = ok(run("validate", "-i", "--secret-key", str(key), input=token + "\n"))
    assert "team-a" in table and "HS256" in table

    one_line_error(run("validate", "not-a-token", "--secret-key", str(key)),
                   "Unauthenticated: malformed token")
    forged = token[:-6] + ("AAAAAA" if not token.endswith("AAAAAA") else "BBBBBA")
    line = one_line_error(run("validate", "-i", "--secret-key", str(key), input=forged),
                          "Unauthenticated: token signature does not verify")
    assert forged not in line and forged.split(".")[2] not in line


def test_key_pair_round_trip_through_files(tmp_path):
    private, public, token = tmp_path / "k.pem", tmp_path / "k.pub", tmp_path / "token"
    ok(run("create-key-pair", "--algorithm", "ES256", "--output-private-key", str(private),
           "--output-public-key", str(public)))
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    token.write_text(ok(run("create", "--subject", "reader", "--expiry", "2d",
                            "--private-key", str(private))))
    out = json.loads(ok(run("validate", "--token-file", str(token), "--public-key",
                            str(public), "-o", "json")))
    assert out["subject"] == "reader" and out["algorithm"] == "ES256"
    assert 2 * 86400 - 10 <= out["expires_in_s"] <= 2 * 86400


def test_a_raw_key_is_not_written_to_a_terminal():
    primary, secondary = pty.openpty()
    try:
        res = subprocess.run([EXE, "tokens", "create-secret-key"], stdout=secondary,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                             timeout=60)
    finally:
        os.close(secondary)
        os.close(primary)
    assert res.returncode == 1 and "--base64" in res.stderr, res.stderr
    assert len(res.stderr.splitlines()) == 1
