"""Standalone: etcd, then a source broker, a shadow broker and a compaction worker as child
processes on one data dir (like `pulsar standalone`). Ready when every role it started says
SERVING on gRPC health.

    <data-dir>/LOCK       held by the running standalone (source/dirlock.py)
    <data-dir>/etcd       etcd's data
    <data-dir>/storage    ledgers (the storage root) and WALs; under iceberg/ the metadata of
                          the topics' Iceberg tables (docs/TABLES.md)
    <data-dir>/compaction-worker/iceberg-catalog.db
                          the Iceberg catalog (SQLite) the worker keeps those tables in
    <data-dir>/logs       etcd.log, broker.log, shadow-broker.log, compaction-worker.log,
                          spark.log (Spark's own logging, WARN and above)
    <data-dir>/security   with --secure: certificates, token keys and tokens, etcd passwords
                          (`Secured`; docs/SECURITY.md)

A data dir another standalone holds is refused at once, with one line naming its holder,
before anything is written into it. The children die with the standalone, even under kill -9
(`shadowtopic.process.spawn`). It refuses
to start when its service port or etcd's ports are taken (say by an earlier standalone), so
an orphan answering health on the port can never pass for its own broker. It prints one line
as each part becomes ready (etcd, then each role, with its URL), then a summary. A config
file (`config`) and the log flags are passed on to every role; each reads its own section
(source/config_file.py), and each role checks its section before anything starts. A role that
exits is restarted by a `shadowtopic.process.Supervisor` (back-off 0.5 s doubling to 8 s; 5
failures within a minute stop everything, exit 1); etcd exiting stops everything. SIGTERM
or SIGINT stops the roles, then etcd, exit 0.

`BrokerProcess` (start a broker, shadow broker or worker process, wait for SERVING,
terminate or kill -9 it) is what tests and benchmarks use too.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shadowtopic import config_file, dirlock, logs
from shadowtopic.metadata.etcd_auth import BROKER, COMPACTION, ROLES, EtcdAuth, generate_password
from shadowtopic.metadata.etcd_options import EtcdOptions
from shadowtopic.metadata.etcd_server import EtcdServer
from shadowtopic.process import FAILED, RUNNING, Supervisor, describe_exit, port_in_use, spawn
from shadowtopic.security.authentication import AuthOptions
from shadowtopic.security.dial import PLAINTEXT, Dial
from shadowtopic.security.files import write_private
from shadowtopic.security.tls import TlsOptions

LOOPBACK = "127.0.0.1"


def wait_serving(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None,
                 dial: Dial = PLAINTEXT) -> None:
    """Block until gRPC health at `url` says SERVING (raises TimeoutError / RuntimeError)."""
    deadline = time.monotonic() + timeout
    with dial.channel(url) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"exited with code {proc.returncode}")
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"broker at {url} not SERVING after {timeout}s")


def serving(url: str, timeout: float = 1.0, dial: Dial = PLAINTEXT) -> bool:
    """One gRPC health probe: does `url` say SERVING?"""
    with dial.channel(url) as ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                        timeout=timeout)
        except grpc.RpcError:
            return False
    return resp.status == health_pb2.HealthCheckResponse.SERVING


class BrokerProcess:
    """One broker as a child process (a `shadowtopic.process.Role`)."""

    role = "broker"

    def __init__(self, etcd: str, data_dir: str, port: int, host: str = "127.0.0.1",
                 log_path: str | None = None, extra_args: list[str] | None = None,
                 module: str = "shadowtopic.broker", env: dict[str, str] | None = None,
                 prefix: list[str] | None = None, dial: Dial = PLAINTEXT):
        self.module = module    # the shadow broker is "shadowtopic.shadow.broker"
        self.role = {"shadowtopic.shadow.broker": "shadow broker",
                     "shadowtopic.compaction.worker": "compaction worker"}.get(module, "broker")
        self.etcd = etcd
        self.data_dir = data_dir
        self.host = host
        self.port = port
        self.log_path = log_path or os.path.join(data_dir, "logs", f"broker-{port}.log")
        self.extra_args = extra_args or []
        self.env = env          # added to this process's environment (e.g. failpoints.env)
        #: a command the broker runs under, that ends by exec'ing its arguments (unshare,
        #: setpriv, a container runtime): the pid stays the broker's
        self.prefix = prefix or []
        self.proc: subprocess.Popen | None = None
        self.dial = dial        # how its health is asked (TLS when it serves TLS)

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 60.0, wait: bool = True) -> BrokerProcess:
        args = [sys.executable, "-m", self.module, "--etcd", self.etcd,
                "--data-dir", self.data_dir, "--host", self.host,
                "--port", str(self.port), *self.extra_args]
        self.proc = spawn([*self.prefix, *args], self.log_path,
                          env=dict(os.environ, **self.env) if self.env else None)
        if wait:
            try:
                wait_serving(self.url, timeout, self.proc, self.dial)
            except RuntimeError as exc:  # it exited: say why, from its log
                raise RuntimeError(f"{self.role} {exc}; the end of {self.log_path}:\n"
                                   f"{self.log_tail(30)}") from None
        return self

    def launch(self) -> None:
        """Start without waiting, refusing a taken port: whoever holds it is not ours."""
        if port_in_use(self.port, self.host):
            raise OSError(f"port {self.port} is in use")
        self.start(wait=False)

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def ready(self) -> bool:
        return serving(self.url, dial=self.dial)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM (graceful); SIGKILL if it does not exit within `timeout`."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        """kill -9."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def metrics_url(self) -> str:
        """The /metrics URL the process logged as it started ("" when off or not yet)."""
        try:
            with open(self.log_path, errors="replace") as f:
                found = re.findall(r"metrics on (http://[^\s\"]+/metrics)", f.read())
        except OSError:
            return ""
        return found[-1] if found else ""

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode("utf-8", "replace")
        except OSError:
            return ""


#: what the ready line calls each role, by module
LABELS = {"shadowtopic.broker": "source broker", "shadowtopic.shadow.broker": "shadow broker",
          "shadowtopic.compaction.worker": "compaction worker"}


def run(data_dir: str = "./data", wipe: bool = False, port: int = 6650,
        etcd_port: int = 2379, host: str = LOOPBACK, etcd_peer_port: int | None = None,
        broker_args: list[str] | None = None, shadow_port: int | None = None,
        compaction_port: int | None = None, worker_args: list[str] | None = None,
        config: str | None = None, log_format: str | None = None,
        log_level: str | None = None, spark_log_level: str | None = None,
        compaction: bool = True, secure: bool = False) -> int:
    """Run until stopped; 0 after SIGTERM / SIGINT, 1 (after one `error:` line) when it
    cannot start or a part fails. `config`, `log_format` and `log_level` go to every role
    (None: not passed, each role's own config decides). `compaction=False` starts no
    compaction worker (no Java needed; compaction requests wait for a worker). `secure`:
    TLS, token authentication and etcd's auth, with files it makes under
    <data-dir>/security (`Secured`)."""
    logs.setup(log_format or "console", log_level or "INFO")
    common = _passed_on(config, log_format, log_level)
    bad = check_config(common)
    if bad:
        print(f"error: {bad}", file=sys.stderr, flush=True)
        return 1
    data_dir = os.path.abspath(data_dir)
    try:
        lock = dirlock.acquire(data_dir, "shadowtopic standalone")
    except dirlock.DataDirInUse as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except OSError as exc:
        print(f"error: cannot use data dir {data_dir}: {exc}", file=sys.stderr, flush=True)
        return 1
    with lock:
        return _run(lock, data_dir, wipe, port, etcd_port, host, etcd_peer_port,
                    broker_args or [], shadow_port, compaction_port, worker_args or [],
                    common, spark_log_level, compaction, secure)


def check_config(common: list[str], timeout: float = 60.0) -> str | None:
    """Each role's section of the config file and its variables, checked by the role itself
    (`--print-config`, side by side) before anything starts: the first error, or None. Only
    when there is a file or a SHADOWTOPIC_CFG__ variable to check."""
    if "--config" not in common and not any(v.startswith(config_file.ENV_PREFIX)
                                            for v in os.environ):
        return None
    procs = [subprocess.Popen([sys.executable, "-m", module, *common, "--print-config"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True) for module in LABELS]
    errors = []
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                lines = err.strip().splitlines() or [f"exited with code {proc.returncode}"]
                errors.append(lines[-1].removeprefix("error: "))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return errors[0] if errors else None


def _passed_on(config: str | None, log_format: str | None, log_level: str | None
               ) -> list[str]:
    """The flags every role is given."""
    args = ["--config", os.path.abspath(config)] if config else []
    if log_format:
        args += ["--log-format", log_format]
    if log_level:
        args += ["--log-level", log_level]
    return args


def _wipe(data_dir: str, keep: str) -> None:
    """Everything in `data_dir` but the lock file `keep` (held: another standalone must not
    take the directory while it is emptied)."""
    for name in os.listdir(data_dir):
        path = os.path.join(data_dir, name)
        if path == keep:
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def _run(lock: dirlock.DirLock, data_dir: str, wipe: bool, port: int, etcd_port: int,
         host: str, etcd_peer_port: int | None, broker_args: list[str],
         shadow_port: int | None, compaction_port: int | None, worker_args: list[str],
         common: list[str], spark_log_level: str | None, compaction: bool,
         secure: bool) -> int:
    peer_port = etcd_peer_port or etcd_port + 1
    shadow_port = shadow_port or port + 1
    compaction_port = compaction_port or port + 2
    ports = [(port, host), (shadow_port, host), (etcd_port, LOOPBACK), (peer_port, LOOPBACK)]
    if compaction:
        ports.insert(2, (compaction_port, LOOPBACK))
    for p, h in ports:
        try:
            busy = port_in_use(p, h)
        except OSError as exc:
            print(f"error: cannot listen on {h}:{p}: {exc}", file=sys.stderr)
            return 1
        if busy:
            print(f"error: port {p} is in use (is another shadowtopic standalone running?)",
                  file=sys.stderr)
            return 1
    if wipe:
        _wipe(data_dir, lock.path)
    log_dir = os.path.join(data_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    sec = Secured.under(os.path.join(data_dir, "security"), host) if secure else None
    tls_args = sec.tls.flags() if sec is not None else []
    auth_args = sec.auth.flags() if sec is not None else []
    dial = sec.tls.dial() if sec is not None else PLAINTEXT
    # with --secure etcd's auth is on: brokers as etcd user broker, the worker as compaction
    etcd = EtcdServer(os.path.join(data_dir, "etcd"), client_port=etcd_port,
                      peer_port=peer_port, log_path=os.path.join(log_dir, "etcd.log"),
                      auth=sec.etcd_auth() if sec is not None else None)
    etcd_broker = sec.etcd_options(BROKER).flags() if sec is not None else []
    etcd_worker = sec.etcd_options(COMPACTION).flags() if sec is not None else []
    broker = BrokerProcess(etcd.endpoint, data_dir, port, host=host,
                           log_path=os.path.join(log_dir, "broker.log"),
                           extra_args=[*common, *tls_args, *auth_args, *etcd_broker,
                                       *broker_args],
                           dial=dial)
    # the shadow broker: a data dir of its own, the source broker's storage root (it reads
    # the source's ledgers there and writes none)
    shadow = BrokerProcess(etcd.endpoint, os.path.join(data_dir, "shadow-broker"), shadow_port,
                           host=host, log_path=os.path.join(log_dir, "shadow-broker.log"),
                           extra_args=[*common, *tls_args, *auth_args, *etcd_broker,
                                       *broker_args,
                                       "--storage-root", os.path.join(data_dir, "storage")],
                           module="shadowtopic.shadow.broker", dial=dial)
    # the compaction worker: one warm SparkSession; its port serves gRPC health only. Given
    # the brokers' storage root it keeps the topics' Iceberg tables (docs/TABLES.md), in
    # compaction-worker/iceberg-catalog.db unless --iceberg-catalog-uri says otherwise
    # Spark's own logging goes to logs/spark.log (WARN unless --spark-log-level)
    spark = ["--spark-log", os.path.join(log_dir, "spark.log")]
    if spark_log_level:
        spark += ["--spark-log-level", spark_log_level]
    worker = BrokerProcess(etcd.endpoint, os.path.join(data_dir, "compaction-worker"),
                           compaction_port, host=LOOPBACK,
                           log_path=os.path.join(log_dir, "compaction-worker.log"),
                           extra_args=[*common, *tls_args, *etcd_worker, *spark,
                                       "--storage-root", os.path.join(data_dir, "storage"),
                                       *worker_args],
                           module="shadowtopic.compaction.worker", dial=dial)
    roles = [Supervisor(broker), Supervisor(shadow)]
    if compaction:
        roles.append(Supervisor(worker, start_timeout=120))
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        print(f"starting etcd ({etcd.binary}) ...", flush=True)
        etcd.start(timeout=60)
        print(f"etcd ready: http://{etcd.endpoint}"
              + (" (auth on: users root, broker, compaction)" if sec is not None else ""),
              flush=True)
        print("starting the source and shadow brokers"
              + (" and the compaction worker ..." if compaction else
                 " (no compaction worker: --no-compaction) ..."), flush=True)
        for role in roles:
            role.start()
        announced = False
        ready: set[int] = set()
        while not stopping:
            states = [role.poll() for role in roles]
            for i, role in enumerate(roles):
                if states[i] == RUNNING and i not in ready:
                    ready.add(i)
                    print(_ready_line(role.child), flush=True)
            failed = next((r for r in roles if r.state == FAILED), None)
            if failed is not None:
                _report_failure(failed)
                return 1
            if not etcd.running():
                gone = "is not running" if etcd.proc is None else describe_exit(
                    etcd.proc.returncode)
                print(f"error: etcd {gone}; stopping "
                      f"(see {etcd.log_path})", file=sys.stderr, flush=True)
                return 1
            if not announced and all(s == RUNNING for s in states):
                announced = True
                worker_line = (f"worker health on {worker.url} (Spark)" if compaction else
                               "off (--no-compaction: compaction requests wait for a worker)")
                url = f"shadowtopic+ssl://{broker.url}" if sec is not None else broker.url
                print(f"shadowtopic standalone is ready (health SERVING)\n"
                      f"  service URL : {url}   (export SHADOWTOPIC_URL={url})\n"
                      + (sec.banner() if sec is not None else "") +
                      f"  shadow broker: {shadow.url}  (shadow topics; any URL serves them)\n"
                      f"  compaction  : {worker_line}\n"
                      f"  etcd        : http://{etcd.endpoint}\n"
                      f"  data dir    : {data_dir}\n"
                      f"  logs        : {broker.log_path}, {shadow.log_path}"
                      + (f",\n                {worker.log_path}\n" if compaction else "\n")
                      + f"  etcd log    : {etcd.log_path}\n"
                      f"Ctrl-C to stop.", flush=True)
            time.sleep(0.2)
        print("stopping ...", flush=True)
        return 0
    except (RuntimeError, OSError) as exc:
        print(f"error: standalone failed to start: {exc}", file=sys.stderr)
        return 1
    finally:
        for role in reversed(roles):
            role.stop()
        etcd.close()


class Secured:
    """What `standalone --secure` runs with, made once under a directory and kept there (a
    restart reuses them: tokens stay valid): a CA (`ca.crt`), the brokers' certificate for
    the host and loopback (`broker.crt`, `broker.key`), a token secret key (`secret.key`),
    the admin's token (`admin.token`, role `admin`, a superuser: the brokers authorize every
    call) and the brokers' own (`broker.token`),
    and etcd's passwords (`etcd-root.password`, `etcd-broker.password`,
    `etcd-compaction.password`: random, one line each) for its users root, broker (the
    brokers) and compaction (the worker), whose roles grant the keys of cluster
    `standalone` (source/metadata/etcd_auth.py). Every file is mode 0600. etcd takes them
    at each start: the first sets its users and roles up and turns its auth on, a restart
    finds them in place and changes nothing."""

    def __init__(self, directory: str):
        self.dir = directory
        j = functools.partial(os.path.join, directory)
        self.ca, self.cert, self.key = j("ca.crt"), j("broker.crt"), j("broker.key")
        self.secret, self.admin_token, self.broker_token = (j("secret.key"), j("admin.token"),
                                                            j("broker.token"))
        #: etcd user -> the file of its password
        self.etcd_passwords = {user: j(f"etcd-{user}.password") for user in ("root", *ROLES)}
        self.tls = TlsOptions(self.cert, self.key, self.ca) if os.path.exists(self.cert) \
            else TlsOptions()
        # authorization on: `admin` and the brokers' own role are superusers, the brokers'
        # role forwards calls for their callers (docs/SECURITY.md, "Authorization")
        self.auth = AuthOptions(token_secret_key=self.secret,
                                client_token_file=self.broker_token, authorization=True,
                                superuser_roles=("admin", "broker"), proxy_roles=("broker",))

    @classmethod
    def under(cls, directory: str, host: str) -> Secured:
        """The files under `directory`, made when missing."""
        from shadowtopic.security import certs, tokens  # (cryptography, PyJWT: only here)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        made = cls(directory)
        if not os.path.exists(made.ca):
            ca = certs.make_ca("shadowtopic standalone CA")
            hosts = sorted({host, "127.0.0.1", "localhost"})
            certs.write(certs.issue(ca, "broker", hosts), directory, "broker")
            certs.write(ca, directory, "ca")  # (last: its presence says the set is whole)
        if not os.path.exists(made.secret):
            secret = tokens.create_secret_key()
            for path, data in ((made.admin_token, tokens.create_token("admin", secret)),
                               (made.broker_token, tokens.create_token("broker", secret))):
                write_private(path, data.encode())
            write_private(made.secret, secret)
        for path in made.etcd_passwords.values():
            if not os.path.exists(path):
                write_private(path, (generate_password() + "\n").encode())
        return cls(directory)

    def etcd_options(self, user: str) -> EtcdOptions:
        """How a role's process reaches etcd: as `user`, its password from its file."""
        return EtcdOptions(user=user, password_file=self.etcd_passwords[user])

    def etcd_auth(self) -> EtcdAuth:
        """etcd's users and roles, their passwords read from the files."""
        def password(user: str) -> str:
            return self.etcd_options(user).read_password()
        return EtcdAuth(password("root"), {role: password(role) for role in ROLES},
                        ("standalone",))

    def banner(self) -> str:
        return (f"  TLS + tokens: CA {self.ca}\n"
                f"                admin token {self.admin_token}\n"
                f"  etcd auth   : root's password {self.etcd_passwords['root']}\n"
                f"    export SHADOWTOPIC_TLS_TRUST_CERTS_FILE={self.ca}\n"
                f"    export SHADOWTOPIC_AUTH_TOKEN=file://{self.admin_token}\n")


def _ready_line(child: BrokerProcess) -> str:
    label = LABELS.get(child.module, child.role)
    metrics = f", metrics {url}" if (url := child.metrics_url()) else ""
    if child.module == "shadowtopic.compaction.worker":
        return f"{label} ready: health on {child.url}{metrics}"
    return f"{label} ready: {child.url}{metrics}"


def _report_failure(sup: Supervisor[BrokerProcess]) -> None:
    if sup.ever_ready:
        print(f"error: {sup.error}; stopping", file=sys.stderr, flush=True)
        return
    print(f"error: standalone failed to start: {sup.error} (see {sup.child.log_path})",
          file=sys.stderr)
    tail = sup.child.log_tail(10)
    if tail:
        print(tail, file=sys.stderr, flush=True)
