"""Real processes to test code against: etcd, a source broker, a shadow broker and (when asked)
the compaction worker, each on free loopback ports with data in a temp dir, and a `Client`
for them. Nothing is faked: what passes here passes against a deployment.

As plain functions and context managers (no pytest needed):

    from shadowtopic.testing import standalone

    with standalone() as st:                    # etcd + source broker + shadow broker
        with st.client() as client:
            client.admin.create_topic("persistent://public/default/t")
            with client.create_producer("persistent://public/default/t") as p:
                p.send(b"hello")

`standalone(compaction=True)` starts the compaction worker too (it needs the `compaction`
extra: Spark). `start_etcd()` and `start_broker(etcd.endpoint, data_dir)` start the parts one
by one; `stop()` (or leaving the `with`) kills what was started and removes the temp dir.

As a pytest plugin: in a conftest.py, `pytest_plugins = ["shadowtopic.testing"]`; then

    def test_round_trip(shadowtopic_client, shadowtopic_topic):
        with shadowtopic_client.create_producer(shadowtopic_topic) as p:
            p.send(b"x")

Fixtures: `shadowtopic_standalone` (one per test session: etcd, source and shadow broker),
`shadowtopic_client` (a Client of its source broker, per test) and `shadowtopic_topic` (a
topic created for the test in a namespace of its own, so tests sharing the session's
standalone never see each other's data). pytest is not a dependency of the package: this
module imports it only when pytest has already loaded it (as it has for a plugin).
docs/TESTING.md says more.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client
from shadowtopic.metadata.etcd_options import EtcdOptions
from shadowtopic.metadata.etcd_server import EtcdServer
from shadowtopic.security.tls import TlsOptions
from shadowtopic.standalone import BrokerProcess

SOURCE_BROKER = "shadowtopic.broker"
SHADOW_BROKER = "shadowtopic.shadow.broker"
COMPACTION_WORKER = "shadowtopic.compaction.worker"


def start_etcd(data_dir: str | os.PathLike | None = None, timeout: float = 30.0) -> EtcdServer:
    """A single-node etcd on free loopback ports (a temp data dir unless given), started;
    `close()` stops it."""
    server = EtcdServer(data_dir)
    server.start(timeout=timeout)
    return server


def start_broker(etcd: str, data_dir: str | os.PathLike, *, port: int | None = None,
                 args: list[str] | tuple[str, ...] = (), module: str = SOURCE_BROKER,
                 timeout: float = 60.0, tls: TlsOptions | None = None,
                 etcd_options: EtcdOptions | None = None) -> BrokerProcess:
    """A broker process (the source broker; the shadow broker or the compaction worker with
    `module`) of etcd `etcd`, on a free loopback port unless given, SERVING when this
    returns; `kill()` stops it. With `tls`, it serves TLS with those files (and is asked
    for its health with them). With `etcd_options`, it reaches etcd as that user, over TLS
    when they say so (`EtcdServer.client_options(user)`; a password given as a value goes
    in its environment, never on its command line)."""
    tls = tls or TlsOptions()
    etcd_options = etcd_options or EtcdOptions()
    broker = BrokerProcess(etcd, str(data_dir), port or free_port(),
                           extra_args=[*tls.flags(), *etcd_options.flags(), *args],
                           module=module, dial=tls.dial(), env=etcd_options.env() or None)
    try:
        broker.start(timeout=timeout)
    except BaseException:
        broker.kill()  # it never became SERVING: leave no process behind
        raise
    return broker


class Standalone:
    """etcd and the broker processes of one cluster of their own, on one data dir: the
    source broker (`broker`, `url`), the shadow broker (`shadow`) and the compaction worker
    (`worker`) when started. The shadow broker reads the source's storage root, as in
    `shadowtopic standalone`. With `tls`, every process serves TLS with those files and
    dials the others with them (one cluster certificate), and `client()` uses them too."""

    def __init__(self, data_dir: str | os.PathLike | None = None, *, shadow: bool = True,
                 compaction: bool = False, broker_args: list[str] | tuple[str, ...] = (),
                 tls: TlsOptions | None = None):
        self.tls = tls or TlsOptions()
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="shadowtopic-test-"))
        self.cluster = f"test-{uuid.uuid4().hex[:8]}"
        self.with_shadow, self.with_compaction = shadow, compaction
        self.broker_args = ["--cluster", self.cluster, *broker_args]
        self.etcd: EtcdServer | None = None
        self.broker: BrokerProcess | None = None
        self.shadow: BrokerProcess | None = None
        self.worker: BrokerProcess | None = None

    @property
    def url(self) -> str:
        """The source broker's address (what a Client connects to)."""
        assert self.broker is not None, "not started"
        return self.broker.url

    def start(self, timeout: float = 60.0) -> Standalone:
        """Start etcd, then each broker; stops what did start if one fails."""
        try:
            self.etcd = start_etcd(self.data_dir / "etcd", timeout=timeout)
            self.broker = start_broker(self.etcd.endpoint, self.data_dir / "broker",
                                       args=self.broker_args, timeout=timeout, tls=self.tls)
            if self.with_shadow:
                storage = self.data_dir / "broker" / "storage"
                self.shadow = start_broker(self.etcd.endpoint, self.data_dir / "shadow",
                                           args=[*self.broker_args, "--storage-root",
                                                 str(storage)],
                                           module=SHADOW_BROKER, timeout=timeout,
                                           tls=self.tls)
            if self.with_compaction:
                self.worker = start_broker(self.etcd.endpoint, self.data_dir / "worker",
                                           args=["--cluster", self.cluster],
                                           module=COMPACTION_WORKER, timeout=max(timeout, 120),
                                           tls=self.tls)
        except BaseException:
            self.stop()
            raise
        return self

    def client(self, timeout: float = 20.0) -> Client:
        """A Client of the source broker (close it, or use it in a `with`)."""
        t = self.tls
        if not t.enabled:
            return Client(self.url, timeout=timeout)
        return Client(self.url, timeout=timeout, tls_trust_certs_file=t.trust_certs_file,
                      tls_cert_file=t.cert_file, tls_key_file=t.key_file)

    def stop(self) -> None:
        """Kill every process started (kill -9: nothing here needs a clean stop), stop etcd,
        remove the data dir when it was a temp one."""
        for proc in (self.worker, self.shadow, self.broker):
            if proc is not None:
                proc.kill()
        if self.etcd is not None:
            self.etcd.close()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> Standalone:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def standalone(data_dir: str | os.PathLike | None = None, *, shadow: bool = True,
               compaction: bool = False, broker_args: list[str] | tuple[str, ...] = (),
               timeout: float = 60.0, tls: TlsOptions | None = None) -> Standalone:
    """A started `Standalone` (use it in a `with`, or call `stop()`)."""
    return Standalone(data_dir, shadow=shadow, compaction=compaction,
                      broker_args=broker_args, tls=tls).start(timeout=timeout)


def fresh_topic(name: str = "t") -> str:
    """A topic name in a namespace nobody else uses."""
    return f"persistent://public/ns-{uuid.uuid4().hex[:8]}/{name}"


# ---- the pytest plugin (only when pytest is already loaded: it is not our dependency) ---

if "pytest" in sys.modules:
    import pytest

    @pytest.fixture(scope="session")
    def shadowtopic_standalone():
        """etcd, a source broker and a shadow broker for the whole test session."""
        with standalone() as st:
            yield st

    @pytest.fixture
    def shadowtopic_client(shadowtopic_standalone):
        """A Client of the session's source broker, closed after the test."""
        with shadowtopic_standalone.client() as client:
            yield client

    @pytest.fixture
    def shadowtopic_topic(shadowtopic_client):
        """A topic of this test's own, created (in a namespace nobody else uses): its name."""
        topic = fresh_topic()
        shadowtopic_client.admin.create_topic(topic)
        return topic
