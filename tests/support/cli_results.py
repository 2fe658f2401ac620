"""What a CLI run (a `subprocess.CompletedProcess`, or one made from an in-process `main`)
should look like: success with its output, or one `error:` line naming the reason."""
from __future__ import annotations

import subprocess


def ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res.stdout


def one_line_error(res: subprocess.CompletedProcess, reason: str) -> str:
    assert res.returncode == 1, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert reason in lines[0], (reason, lines[0])
    return lines[0]
