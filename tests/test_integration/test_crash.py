"""Durability under kill -9, torn WAL tails and corrupt sealed ledgers
(docs/BEHAVIOURS.md F1-F3)."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from shadowtopic import failpoints
from shadowtopic.broker.server import free_port
from shadowtopic.client import Client
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.standalone import BrokerProcess

PRODUCER_SCRIPT = textwrap.dedent("""
    import json, sys
    from shadowtopic.client import Client
    url, topic, out = sys.argv[1], sys.argv[2], sys.argv[5]
    pid, count = int(sys.argv[3]), int(sys.argv[4])
    acked, failed = [], []
    def cb(seq):
        def done(mid, exc):
            if exc is None:
                acked.append((seq, str(mid)))
            else:
                failed.append(seq)
        return done
    client = Client(url, timeout=10)
    p = client.create_producer(topic, producer_name=f"p{pid}", batch_max_messages=500)
    open(out + ".started", "w").close()
    for seq in range(count):
        if failed:
            break
        p.send_async(f"{pid}:{seq}".encode(), key=f"p{pid}", callback=cb(seq))
    try:
        p.flush(timeout=15)
    except Exception:
        pass
    with open(out, "w") as f:
        json.dump({"acked": acked, "failed": len(failed)}, f)
    import os; os._exit(0)
""")


def start_load(broker, client, topic: str, tmp_path) -> tuple[list, list]:
    """4 producer processes, 50,000 messages each; returns once all are connected and the
    broker has taken 40,000 messages (so a kill lands on all of them mid-load)."""
    script = tmp_path / "producer.py"
    script.write_text(PRODUCER_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    outs = [tmp_path / f"acked-{pid}.json" for pid in range(4)]
    procs = [subprocess.Popen([sys.executable, str(script), broker.url, topic, str(pid),
                               "50000", str(out)], env=env) for pid, out in enumerate(outs)]
    deadline = time.monotonic() + 60
    while not all(os.path.exists(f"{o}.started") for o in outs):
        assert time.monotonic() < deadline, "producer processes did not start"
        time.sleep(0.02)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if int(client.admin.stats(topic).get("msgInCounter", 0)) >= 40_000:
            break
        time.sleep(0.05)
    return procs, outs


def acked_by_producer(procs, outs) -> dict[int, dict[int, str]]:
    """Wait for the producer processes; {producer: {seq: acknowledged message id}}."""
    for p in procs:
        assert p.wait(90) == 0
    return {pid: dict(json.loads(out.read_text())["acked"]) for pid, out in enumerate(outs)}


def read_all(url: str, topic: str, timeout: float = 60) -> list:
    out = []
    deadline = time.monotonic() + timeout
    with Client(url, timeout=20) as c:
        with c.create_reader(topic, start="earliest") as r:
            while r.has_message_available() and time.monotonic() < deadline:
                out.append(r.read_next(timeout=20))
    return out


@pytest.mark.slow
@pytest.mark.own_broker
def test_kill9_during_produce_loses_no_acknowledged_message(broker, client, topic, tmp_path):
    """F1: 4 producer processes, 200,000 messages, kill -9 the broker mid-way, restart."""
    client.admin.create_topic(topic)
    procs, outs = start_load(broker, client, topic, tmp_path)
    broker.kill()
    acked = acked_by_producer(procs, outs)
    total_acked = sum(len(a) for a in acked.values())
    assert total_acked >= 20_000, "the kill came before enough messages were acknowledged"
    assert total_acked < 200_000, "the kill came after everything was acknowledged"

    broker.start(timeout=60)
    messages = read_all(broker.url, topic)
    seen: dict[int, list[int]] = {pid: [] for pid in range(4)}
    for m in messages:
        pid, seq = map(int, m.payload.decode().split(":"))
        assert m.key == f"p{pid}".encode()
        seen[pid].append(seq)
        if seq in acked[pid]:
            assert str(m.message_id) == acked[pid][seq], "an acknowledged id changed"
    for pid in range(4):
        got = seen[pid]
        assert got == sorted(got) and len(set(got)) == len(got), f"producer {pid}: order broken"
        missing = set(acked[pid]) - set(got)
        assert not missing, f"producer {pid}: {len(missing)} acknowledged messages lost"
    # the topic keeps working after recovery
    with Client(broker.url) as c, c.create_producer(topic) as p:
        mid = p.send(b"after-restart")
    assert mid > max(m.message_id for m in messages)


def _temp_parquet(broker) -> list[str]:
    """Parquet files a seal or a seal-ahead is writing (`.<name>.tmp`) under the broker's
    sealed ledgers."""
    root = os.path.join(broker.data_dir, "storage", "ledgers")
    return [os.path.join(d, f) for d, _dirs, files in os.walk(root) for f in files
            if f.startswith(".") and f.endswith(".tmp")]


@pytest.mark.slow
@pytest.mark.own_broker
def test_kill9_while_the_open_ledger_is_sealed_ahead_loses_nothing(broker, client, topic):
    """F1 with sealing ahead (source/ledger/seal_ahead.py): the open ledger's Parquet file
    is half written when the broker is killed; the restarted broker deletes it, seals the
    ledger from its WAL and serves every acknowledged message with its id. (A broker seals
    ahead once a roll was asked for, as a compaction does: `roll_ledger` first.)"""
    client.admin.create_topic(topic)
    client.admin.roll_ledger(topic)
    rng = random.Random(5)
    sent: dict[str, bytes] = {}
    acked: list[tuple[object, bytes]] = []
    failed: list[BaseException] = []

    def done(body: bytes):
        def cb(mid, exc):
            if exc is None:
                acked.append((mid, body))
            else:
                failed.append(exc)
        return cb

    with client.create_producer(topic, batch_max_messages=200) as p:
        for i in range(40_000):
            body = json.dumps({"i": i, "px": round(rng.uniform(1, 500), 2),
                               "note": "n" * rng.randrange(0, 90)}).encode()
            p.send_async(body, key=f"k{i % 700}", callback=done(body))
        p.flush(timeout=60)
        assert not failed and len(acked) == 40_000
        sent.update((str(mid), body) for mid, body in acked)
        deadline = time.monotonic() + 30
        while not any(os.path.getsize(f) > 0 for f in _temp_parquet(broker)):
            assert time.monotonic() < deadline, "the open ledger was not sealed ahead"
            time.sleep(0.05)
        for i in range(500):  # and more after the last step
            body = f"late-{i}".encode()
            sent[str(p.send(body, key="late"))] = body
    broker.kill()
    assert _temp_parquet(broker), "the kill left no half-written file to clean up"
    broker.start(timeout=60)
    got = {str(m.message_id): m.payload for m in read_all(broker.url, topic)}
    assert got == sent
    with Client(broker.url, timeout=20) as c:  # the topic loaded: its ledger recovered
        ledgers = c.admin.internal_stats(topic)["ledgers"]
    assert ledgers[0]["state"] == "SEALED" and int(ledgers[0]["entries"]) == len(sent)
    assert _temp_parquet(broker) == []


def _open_wal(client: Client, broker, topic: str) -> str:
    st = client.admin.internal_stats(topic)
    open_ledgers = [l for l in st["ledgers"] if l["state"] == "OPEN"]
    assert len(open_ledgers) == 1
    return os.path.join(broker.data_dir, "storage", open_ledgers[0]["path"])


@pytest.mark.slow
@pytest.mark.parametrize("tail", ["partial-frame", "garbage", "cut-last-frame"])
@pytest.mark.own_broker
def test_torn_wal_tail_is_truncated_on_recovery(broker, client, topic, tail):
    """F2: recovery cuts the WAL at the last valid frame and serves nothing past it."""
    client.admin.create_topic(topic)
    with client.create_producer(topic) as p:
        ids = [p.send(f"m{i}".encode(), key="k") for i in range(20)]
    wal = _open_wal(client, broker, topic)
    broker.kill()
    size = os.path.getsize(wal)
    expected = 20
    with open(wal, "r+b") as f:
        if tail == "partial-frame":   # a frame header promising more bytes than were written
            f.seek(0, 2)
            f.write((4096).to_bytes(4, "little") + b"\x01\x02\x03\x04" + b"\x00" * 50)
        elif tail == "garbage":
            f.seek(0, 2)
            f.write(os.urandom(333))
        else:                         # the last frame (one send = one frame) torn in half
            f.truncate(size - 7)
            expected = 19
    broker.start(timeout=60)
    messages = read_all(broker.url, topic)
    assert [m.payload for m in messages] == [f"m{i}".encode() for i in range(expected)]
    assert [m.message_id for m in messages] == ids[:expected]
    with Client(broker.url) as c:
        st = c.admin.internal_stats(topic)
        sealed = [l for l in st["ledgers"] if l["state"] == "SEALED"]
        assert [int(l["entries"]) for l in sealed] == [expected]
        with c.create_producer(topic) as p:
            new_id = p.send(b"next")
    assert new_id.ledger_id > ids[-1].ledger_id
    assert [m.payload for m in read_all(broker.url, topic)][-1] == b"next"


@pytest.mark.slow
@pytest.mark.own_broker
def test_flipped_byte_in_sealed_ledger_is_data_loss_and_others_keep_working(
        broker, client, topic):
    """F3: a corrupt sealed ledger gives DATA_LOSS ChecksumError; other topics are unaffected."""
    other = topic + "-other"
    client.admin.create_topic(topic)
    client.admin.create_topic(other)
    with client.create_producer(topic) as p:
        for i in range(3000):
            p.send_async(b"x" * 100, key=f"k{i}")
        p.flush()
    with client.create_producer(other) as p:
        p.send(b"fine")
    sealed = client.admin.roll_ledger(topic)
    path = os.path.join(broker.data_dir, "storage", sealed["path"])
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(errors.ChecksumError) as info:
        read_all(broker.url, topic)
    assert info.value.code.name == "DATA_LOSS"
    # the broker keeps serving: other topics read and write, the same topic still takes writes
    assert [m.payload for m in read_all(broker.url, other)] == [b"fine"]
    with Client(broker.url) as c:
        with c.create_producer(other) as p:
            assert p.send(b"still-fine") > MessageId(0, 0)
        with c.create_producer(topic) as p:
            assert p.send(b"new-data").ledger_id > int(sealed["ledgerId"])
        assert broker.proc.poll() is None


@pytest.mark.slow
@pytest.mark.own_broker
def test_sigterm_under_load_exits_promptly_and_loses_nothing_acknowledged(
        broker, client, topic, tmp_path):
    """F9: graceful stop under produce load: in-flight writes are fsynced and acked or not
    acked at all; the broker exits within its bound; a restart serves every ack."""
    client.admin.create_topic(topic)
    procs, outs = start_load(broker, client, topic, tmp_path)
    t = time.monotonic()
    assert broker.terminate(timeout=30) == 0
    assert time.monotonic() - t < 12, "graceful shutdown took too long"
    acked = acked_by_producer(procs, outs)
    assert sum(map(len, acked.values())) >= 20_000
    broker.start(timeout=60)
    got: dict[int, dict[int, str]] = {pid: {} for pid in range(4)}
    for m in read_all(broker.url, topic):
        pid, seq = map(int, m.payload.decode().split(":"))
        got[pid][seq] = str(m.message_id)
    for pid in range(4):
        lost = {s for s in acked[pid] if got[pid].get(s) != acked[pid][s]}
        assert not lost, f"producer {pid}: {len(lost)} acknowledged messages lost or moved"


def test_kill9_between_a_seal_and_its_publish_loses_nothing(etcd_server, tmp_path, topic):
    """F1 at the seal: the broker dies (failpoint `ledger.seal.before_publish`) after a
    ledger's Parquet file is written and fsynced but before the ledger list says SEALED.
    The next start seals that ledger again from its WAL: every acknowledged message is read
    back once with its id, the ledger is SEALED with all its entries, and produce goes on."""
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "data"), free_port(),
                      extra_args=["--lease-ttl", "3"],
                      env=failpoints.env({"ledger.seal.before_publish": "kill"}))
    b.start(timeout=60)
    try:
        with Client(b.url, timeout=10) as c:
            c.admin.create_topic(topic)
            with c.create_producer(topic) as p:
                ids = [p.send(f"m{i}".encode(), key=f"k{i % 7}") for i in range(300)]
            with pytest.raises(errors.ShadowTopicError):
                c.admin.roll_ledger(topic)          # the broker dies sealing ledger 1
        assert b.proc.wait(30) == -signal.SIGKILL
        b.env = None
        b.start(timeout=60)
        messages = read_all(b.url, topic)
        assert [m.message_id for m in messages] == ids
        assert [m.payload for m in messages] == [f"m{i}".encode() for i in range(300)]
        with Client(b.url, timeout=20) as c:
            ledgers = c.admin.internal_stats(topic)["ledgers"]
            first = [l for l in ledgers if int(l["ledgerId"]) == ids[0].ledger_id]
            assert [(l["state"], int(l["entries"])) for l in first] == [("SEALED", 300)]
            with c.create_producer(topic) as p:
                assert p.send(b"after") > ids[-1]
    finally:
        b.kill()
