"""A throwaway PostgreSQL server for tests: Debian's PostgreSQL (`make install` installs the
`postgresql` package when none is there), a fresh cluster in a temp dir, listening on a free
loopback port only (and its own socket dir), trust authentication for one user. PostgreSQL
refuses to run as root: as root the cluster belongs to the `postgres` system user the
package creates, and initdb and the server run as that user (the server process is the
child itself, so `close` stops it by its own pid).

    with PostgresServer.start() as pg:
        pg.uri  # postgresql+psycopg2://shadowtopic@127.0.0.1:PORT/postgres
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time

USER = "shadowtopic"


def bin_dir() -> str:
    """The newest installed PostgreSQL's bin dir (AssertionError naming what is missing)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    assert found, ("no PostgreSQL server under /usr/lib/postgresql (Debian's `postgresql` "
                   "package; `make install` installs it)")
    return os.path.dirname(found[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    def __init__(self, root: str, port: int, proc: subprocess.Popen[bytes], log_path: str):
        self.root = root
        self.port = port
        self.proc = proc
        self.log_path = log_path

    @property
    def uri(self) -> str:
        """The SQLAlchemy URL pyiceberg's SQL catalog takes."""
        return f"postgresql+psycopg2://{USER}@127.0.0.1:{self.port}/postgres"

    @classmethod
    def start(cls, timeout: float = 60.0) -> PostgresServer:
        bindir = bin_dir()
        root = tempfile.mkdtemp(prefix="st-postgres-")
        run_as: dict[str, object] = {}
        if os.getuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(root, pw.pw_uid, pw.pw_gid)
            run_as = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        data = os.path.join(root, "data")
        log_path = os.path.join(root, "postgres.log")
        init = subprocess.run([os.path.join(bindir, "initdb"), "-D", data, "-U", USER,
                               "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"],
                              capture_output=True, timeout=120, cwd=root, **run_as)
        assert init.returncode == 0, f"initdb failed: {init.stderr.decode()[-2000:]}"
        port = free_port()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [os.path.join(bindir, "postgres"), "-D", data, "-h", "127.0.0.1",
                 "-p", str(port), "-k", root, "-F", "-c", "fsync=off",
                 "-c", "full_page_writes=off", "-c", "max_connections=50"],
                stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True,
                **run_as)
        server = cls(root, port, proc, log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                server.close()
                raise AssertionError(f"postgres exited ({proc.returncode}): {server.log()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    pass
                if b"ready to accept connections" in open(log_path, "rb").read():
                    return server
            except OSError:
                pass
            time.sleep(0.1)
        server.close()
        raise AssertionError(f"postgres not ready in {timeout} s: {server.log()}")

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-3000:]
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
