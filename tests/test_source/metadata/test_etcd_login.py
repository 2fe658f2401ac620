"""The etcd store's login (source/metadata/etcd.py, "etcd's auth"): it authenticates before
its first call, sends its token with every call and watch stream, and when etcd refuses the
token (as after an etcd restart) it authenticates again, once for all the calls refused
together, and sends each refused call again, once. Against an in-process gRPC server that
answers etcd's Auth, KV and Watch calls the way etcd 3.4 does with auth on (its token
checks and its refusals, word for word); a real etcd restarted under a broker is
tests/test_integration/test_etcd_auth.py.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent import futures

import grpc
import pytest
from etcd3 import etcdrpc
from etcd3.etcdrpc import kv_pb2

from shadowtopic.metadata import EtcdOptions, EtcdStore, MetadataUnauthenticated

INVALID_TOKEN = "etcdserver: invalid auth token"
BAD_PASSWORD = "etcdserver: authentication failed, invalid user ID or password"


class FakeEtcd:
    """etcd's token checks, in process: `Authenticate` gives a new token for the right
    password; every Range, Put and Watch must carry a token it gave and has not `forget`ten
    (an etcd restart). `refuse_all` refuses every token (a user whose tokens never work)."""

    def __init__(self, user: str = "broker", password: str = "secret"):
        self.user, self.password = user, password
        self.lock = threading.Lock()
        self.valid: set[str] = set()
        self.logins = 0
        self.applied: dict[bytes, bytes] = {}
        self.refused_calls = 0
        self.refuse_all = False
        self.watch_tokens: list[str] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(16))
        etcdrpc.add_AuthServicer_to_server(_Auth(self), self.server)
        etcdrpc.add_KVServicer_to_server(_KV(self), self.server)
        etcdrpc.add_WatchServicer_to_server(_Watch(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def forget(self) -> None:
        """What an etcd restart does to simple tokens: every one is gone."""
        with self.lock:
            self.valid.clear()

    def takes(self, token: str | None) -> bool:
        with self.lock:
            return token in self.valid and not self.refuse_all

    def check(self, context: grpc.ServicerContext) -> str:
        token = dict(context.invocation_metadata()).get("token")
        ok = self.takes(token)
        if not ok:
            with self.lock:
                self.refused_calls += 1
        if token is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty")
        if not ok:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, INVALID_TOKEN)
        assert token is not None
        return token


class _Auth(etcdrpc.AuthServicer):
    def __init__(self, etcd: FakeEtcd):
        self.etcd = etcd

    def Authenticate(self, request, context):  # noqa: N802 - gRPC's name
        e = self.etcd
        if (request.name, request.password) != (e.user, e.password):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, BAD_PASSWORD)
        with e.lock:
            e.logins += 1
            token = f"token-{e.logins}"
            e.valid.add(token)
        time.sleep(0.05)  # a round of raft: calls refused meanwhile queue behind this login
        return etcdrpc.AuthenticateResponse(token=token)


class _KV(etcdrpc.KVServicer):
    def __init__(self, etcd: FakeEtcd):
        self.etcd = etcd

    def Range(self, request, context):  # noqa: N802
        self.etcd.check(context)
        value = self.etcd.applied.get(request.key)
        kvs = [kv_pb2.KeyValue(key=request.key, value=value, create_revision=2,
                               mod_revision=2, version=1)] if value is not None else []
        return etcdrpc.RangeResponse(header=etcdrpc.ResponseHeader(revision=2), kvs=kvs)

    def Put(self, request, context):  # noqa: N802
        self.etcd.check(context)
        self.etcd.applied[request.key] = request.value
        return etcdrpc.PutResponse(header=etcdrpc.ResponseHeader(revision=3))


class _Watch(etcdrpc.WatchServicer):
    def __init__(self, etcd: FakeEtcd):
        self.etcd = etcd

    def Watch(self, request_iterator, context):  # noqa: N802
        token = dict(context.invocation_metadata()).get("token", "")
        self.etcd.watch_tokens.append(token)
        create = next(request_iterator).create_request
        if not self.etcd.takes(token):  # etcd 3.4 answers such a create: created, canceled
            yield etcdrpc.WatchResponse(
                created=True, canceled=True,
                cancel_reason=f"rpc error: code = Unauthenticated desc = {INVALID_TOKEN}")
            return
        yield etcdrpc.WatchResponse(created=True)
        yield etcdrpc.WatchResponse(events=[kv_pb2.Event(
            type=kv_pb2.Event.PUT, kv=kv_pb2.KeyValue(key=create.key + b"k", value=b"v",
                                                      mod_revision=5))])
        while context.is_active():
            time.sleep(0.05)


@pytest.fixture
def etcd():
    fake = FakeEtcd()
    yield fake
    fake.server.stop(0)


def store_of(etcd: FakeEtcd, password: str = "secret", **kw) -> EtcdStore:
    return EtcdStore(etcd.endpoint, timeout=3.0,
                     options=EtcdOptions(user="broker", password=password), **kw)


def test_the_store_logs_in_before_its_first_call_and_sends_its_token(etcd, arun):
    async def go():
        store = store_of(etcd)
        try:
            assert await store.put("/k", b"1") == 3
            assert (await store.get("/k")).value == b"1"
        finally:
            await store.close()
    arun(go())
    assert etcd.logins == 1 and etcd.refused_calls == 0


def test_calls_refused_together_share_one_new_login_and_each_is_sent_again(etcd, arun):
    """An etcd restart ends the token: 12 calls in flight are refused, one login follows,
    and every call succeeds, sent again once with the new token."""
    async def go():
        store = store_of(etcd)
        try:
            await store.put("/k", b"1")
            etcd.forget()
            got = await asyncio.gather(*[store.get("/k") for _ in range(12)],
                                       store.put("/k2", b"2"))
            assert all(kv.value == b"1" for kv in got[:-1]) and got[-1] == 3
            assert etcd.applied[b"/k2"] == b"2"
        finally:
            await store.close()
    arun(go())
    assert etcd.logins == 2
    assert 1 <= etcd.refused_calls <= 13


def test_a_token_refused_again_after_a_new_login_is_a_typed_error(etcd, arun):
    """No loop: one new login, one more try, then `MetadataUnauthenticated` naming the
    user."""
    async def go():
        store = store_of(etcd)
        try:
            await store.get("/k")
            etcd.refuse_all = True
            with pytest.raises(MetadataUnauthenticated, match="etcd refused user broker"):
                await store.get("/k")
        finally:
            await store.close()
    arun(go())
    assert etcd.logins == 2 and etcd.refused_calls == 2


def test_a_wrong_password_is_refused_before_any_call(etcd, arun):
    async def go():
        store = store_of(etcd, password="wrong")
        try:
            with pytest.raises(MetadataUnauthenticated) as info:
                await store.check_access()
            assert str(info.value) == f"etcd refused user broker: {BAD_PASSWORD}"
            with pytest.raises(MetadataUnauthenticated):
                await store.put("/k", b"1")
        finally:
            await store.close()
    arun(go())
    assert etcd.logins == 0 and etcd.applied == {}


def test_the_password_file_is_read_at_each_login(etcd, arun, tmp_path):
    """A password changed in etcd and in the file is taken at the next login."""
    path = tmp_path / "broker.password"
    path.write_text("secret\n")

    async def go():
        store = EtcdStore(etcd.endpoint, timeout=3.0,
                          options=EtcdOptions(user="broker", password_file=str(path)))
        try:
            await store.get("/k")
            etcd.password = "rotated"
            path.write_text("rotated\n")
            etcd.forget()
            await store.get("/k")
        finally:
            await store.close()
    arun(go())
    assert etcd.logins == 2


def test_a_watch_opened_with_a_dead_token_is_opened_again_with_a_new_one(etcd, arun):
    """The stream carries the token it was opened with: etcd cancels its creation, the
    store logs in again and opens it again from the same revision."""
    async def go():
        store = store_of(etcd)
        try:
            await store.get("/k")   # logged in: token-1
            etcd.forget()           # etcd restarted, no call since
            async for events in store.watch_prefix("/w/", 1):
                assert [(e.key, e.value) for e in events] == [("/w/k", b"v")]
                break
        finally:
            await store.close()
    arun(go())
    assert etcd.watch_tokens == ["token-1", "token-2"] and etcd.logins == 2


def test_a_watch_refused_again_ends_with_a_typed_error(etcd, arun):
    async def go():
        store = store_of(etcd)
        try:
            await store.get("/k")
            etcd.refuse_all = True  # the new login's token is refused too

            async def watch():
                async for _ in store.watch_prefix("/w/", 1):
                    pass
            with pytest.raises(MetadataUnauthenticated, match="invalid auth token"):
                await watch()
        finally:
            await store.close()
    arun(go())
    assert etcd.watch_tokens == ["token-1", "token-2"] and etcd.logins == 2


def test_without_a_user_the_store_never_logs_in(etcd, arun):
    async def go():
        store = EtcdStore(etcd.endpoint, timeout=3.0)
        try:
            with pytest.raises(MetadataUnauthenticated, match="no etcd user"):
                await store.get("/k")
        finally:
            await store.close()
    arun(go())
    assert etcd.logins == 0
