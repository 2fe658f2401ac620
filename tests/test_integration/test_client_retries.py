"""The client retries temporary errors by itself (issue 18, item 5; source/client/retry.py),
against real processes: a source broker and a shadow broker (`start_pair` in conftest) on the
session's etcd. While the shadow broker is away its shadows answer retriable errors (a stale
owner refuses connections, then the source broker says `ServiceUnavailable`); a subscribe
or a reader started meanwhile succeeds by itself once the shadow broker is back, within the
client's operation timeout; with the broker left down, it raises the retriable typed error
once the operation timeout has passed. No timed assertions: only 'it raised, and it did not
hang past a generous bound'."""
from __future__ import annotations

import threading
import time

import pytest

from shadowtopic.client import Client, errors

HANG_BOUND_S = 60  # far above any operation timeout used here


@pytest.fixture
def pair(start_pair):
    """(source broker, shadow broker): see conftest's `start_pair`."""
    return start_pair()


def served_shadow(client: Client, topic: str, n: int = 3) -> tuple[str, list]:
    """A shadow of `topic` holding `n` messages, read once through the shadow broker (so a
    shadow broker has served it: while that broker is away, the shadow is unavailable for
    now, not `NotAllowed`)."""
    shadow = f"{topic}-shadow"
    client.admin.create_topic(topic)
    client.admin.create_shadow_topic(shadow, topic)
    with client.create_producer(topic) as p:
        ids = [p.send(f"m{i}".encode()) for i in range(n)]
    with client.create_reader(shadow, start="earliest") as r:
        assert r.read_next(timeout=20).message_id == ids[0]
    return shadow, ids


def in_thread(fn) -> tuple[threading.Thread, dict]:
    """Run `fn()` in a thread: its result lands in out["result"], its error in out["error"]."""
    out: dict = {}

    def run():
        try:
            out["result"] = fn()
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            out["error"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_subscribe_and_a_reader_opened_while_the_shadow_broker_restarts_succeed_by_themselves(
        pair, topic):
    src, sh = pair
    with Client(src.url, timeout=10, operation_timeout=90) as c:
        shadow, ids = served_shadow(c, topic)
        sh.kill()
        sub, sub_out = in_thread(lambda: c.subscribe(shadow, "s", initial_position="earliest"))
        read, read_out = in_thread(lambda: c.create_reader(shadow, start="earliest"))
        time.sleep(3)  # both keep retrying meanwhile (the stale owner, then the source broker)
        assert not sub_out and not read_out  # neither could have opened, nor gave up
        sh.start(timeout=60)
        sub.join(HANG_BOUND_S)
        read.join(HANG_BOUND_S)
        assert not sub.is_alive() and not read.is_alive()
        assert "error" not in sub_out, repr(sub_out.get("error"))
        assert "error" not in read_out, repr(read_out.get("error"))
        consumer, reader = sub_out["result"], read_out["result"]
        got = [consumer.receive(timeout=20) for _ in ids]
        assert [m.message_id for m in got] == ids
        assert [reader.read_next(timeout=20).message_id for _ in ids] == ids


def test_with_the_shadow_broker_left_down_the_retriable_error_surfaces_after_the_timeout(
        pair, topic):
    src, sh = pair
    with Client(src.url, timeout=10) as c:
        shadow, _ = served_shadow(c, topic)
    sh.kill()
    with Client(src.url, timeout=10, operation_timeout=3) as c:
        for open_ in (lambda: c.subscribe(shadow, "s"),
                      lambda: c.create_reader(shadow, start="earliest")):
            t, out = in_thread(open_)
            t.join(HANG_BOUND_S)
            assert not t.is_alive(), "the call hung past the operation timeout"
            err = out.get("error")
            assert isinstance(err, errors.ServiceUnavailable) and err.retriable, repr(out)
            assert err.reason in ("ServiceUnavailable", "ConnectError"), err.reason
