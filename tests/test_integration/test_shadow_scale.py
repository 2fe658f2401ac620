"""A shadow over a source holding 1,000,000 messages (the shadow-topic issue's Done-when):
creating it writes no file, and a reader of the shadow gets all 1,000,000 from Earliest with
the ids the producer got back, out of the source's sealed Parquet ledgers and its open WAL.

Driven as a user drives the service: real etcd, a source broker and a shadow broker
(`python -m shadowtopic.shadow.broker`) on one storage root, the client connected to the source
broker's URL only (Lookup routes the shadow's reader to the shadow broker). No Message object is
kept: ids are compared as runs of consecutive (ledger_id, entry_id)."""
from __future__ import annotations

import hashlib
import os
import time

import pytest
from support.waiting import wait_for

from shadowtopic.client import Client, Policies, errors

N = 1_000_000
LEDGER_MAX_ENTRIES = 300_000   # a batch may overshoot a ledger by < 1 batch: 3 sealed + open

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def pair(start_pair, tmp_path):
    """(source broker, shadow broker, their storage root): see conftest's `start_pair`."""
    src, sh = start_pair()
    return src, sh, str(tmp_path / "shared-storage")


def files(root: str) -> dict[str, str]:
    """relative path -> sha256 of every file under the storage root (a file deleted between
    the listing and its read, as a sealed ledger's WAL is, is not there)."""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            if n.startswith(".disk-probe-"):  # a broker's write probe (source/ledger/disk.py)
                continue
            path = os.path.join(d, n)
            try:
                with open(path, "rb") as f:
                    out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
            except FileNotFoundError:
                continue
    return out


class Runs:
    """A sequence of ids as runs [ledger_id, first_entry, last_entry] of consecutive entries:
    two sequences are equal exactly when their runs are (with the count)."""

    def __init__(self) -> None:
        self.runs: list[list[int]] = []
        self.count = 0

    def add(self, ledger_id: int, entry_id: int) -> None:
        self.count += 1
        runs = self.runs
        if runs:
            last = runs[-1]
            if last[0] == ledger_id and last[2] + 1 == entry_id:
                last[2] = entry_id
                return
        runs.append([ledger_id, entry_id, entry_id])


def produce(client: Client, topic: str, n: int) -> Runs:
    """`n` messages, payload = the message's index as text; the acknowledged ids as runs."""
    acked = Runs()
    failures: list[Exception] = []

    def done(mid, exc):  # on the receipt thread, in send order
        if exc is not None:
            failures.append(exc)
        else:
            acked.add(mid.ledger_id, mid.entry_id)

    with client.create_producer(topic, batch_max_messages=10_000, linger_ms=50,
                                max_inflight=16) as p:
        for i in range(n):
            p.send_async(b"%d" % i, callback=done)
        p.flush(timeout=180)
        stats = p.stats()
    assert not failures, failures[:3]
    assert (stats["acked"], stats["failed"], acked.count) == (n, 0, n), stats
    return acked


def test_a_shadow_of_a_million_message_source_writes_no_file_and_reads_all_with_its_ids(
        pair, topic):
    src, _, root = pair
    shadow = f"{topic}-shadow"
    with Client(src.url, timeout=60) as c:
        c.admin.create_topic(topic, policies=Policies(ledger_max_entries=LEDGER_MAX_ENTRIES))
        acked = produce(c, topic, N)

        # the source at rest: every ledger but the last sealed (seals run in the background),
        # and the files as they were at the previous look (the open ledger's Parquet file,
        # written ahead under its temporary name, no longer growing: seal_ahead.py)
        last: list[dict[str, str]] = [{}]

        def settled():
            ledgers = c.admin.internal_stats(topic)["ledgers"]
            states = [lg["state"] for lg in ledgers]
            on_disk = files(root)
            open_file = f".{ledgers[-1]['ledgerId']}-"
            temps = [p for p in on_disk if p.endswith(".tmp")]
            still, last[0] = on_disk == last[0], on_disk
            if states[:-1] == ["SEALED"] * (len(states) - 1) and states[-1] == "OPEN" and \
                    all(os.path.basename(p).startswith(open_file) for p in temps) and \
                    len([p for p in on_disk if p.endswith(".wal")]) == 1 and still:
                return ledgers
            return None
        ledgers = wait_for(settled, 120, "the source's full ledgers to seal",
                           interval=0.2)
        # what the producer got back is exactly the source's ledgers, entry by entry
        assert acked.runs == [[lg["ledgerId"], 0, int(lg["entries"]) - 1] for lg in ledgers]
        sealed = [lg for lg in ledgers if lg["state"] == "SEALED"]
        assert len(sealed) >= 3 and int(ledgers[-1]["entries"]) > 0, ledgers  # + a WAL tail
        assert sum(int(lg["entries"]) for lg in ledgers) == N

        before = files(root)
        assert sorted(p for p in before if p.endswith(".parquet")) == \
            sorted(lg["path"] for lg in sealed)
        assert [p for p in before if p.endswith(".wal")] == [ledgers[-1]["path"]]
        time.sleep(1.0)
        assert files(root) == before  # nothing else writes meanwhile (the check below means it)

        c.admin.create_shadow_topic(shadow, topic)
        assert c.admin.get_shadow_source(shadow) == topic
        assert files(root) == before  # no ledger, WAL or other file written for the shadow

        # every message from Earliest, through the shadow broker, with the source's ids
        got = Runs()
        bad_payloads = 0
        first_bad = None
        deadline = time.monotonic() + 300
        with c.create_reader(shadow, start="earliest", receiver_queue_size=50_000) as r:
            while got.count < N:
                m = r.read_next(timeout=60)
                mid = m.message_id
                if m.payload != b"%d" % got.count:
                    bad_payloads += 1
                    first_bad = first_bad or (got.count, str(mid), m.payload[:20])
                got.add(mid.ledger_id, mid.entry_id)
                if not got.count % 50_000:
                    assert time.monotonic() < deadline, f"read {got.count} of {N} in 300 s"
            with pytest.raises(errors.Timeout):
                extra = r.read_next(timeout=2)
                pytest.fail(f"a message past the {N}th: {extra.message_id}")
        assert got.runs == acked.runs
        assert (bad_payloads, first_bad) == (0, None)

        # the shadow still owns no file (a reader is not durable); the source's are untouched
        assert files(root) == before

        # a shadow's internal stats list the source's ledgers: the data is shared
        src_stats = c.admin.internal_stats(topic)
        sh_stats = c.admin.internal_stats(shadow)
        assert [lg["ledgerId"] for lg in sh_stats.get("ledgers", [])] == \
            [lg["ledgerId"] for lg in src_stats["ledgers"]], sh_stats
        assert [int(lg.get("entries", 0)) for lg in sh_stats["ledgers"]] == \
            [int(lg["entries"]) for lg in src_stats["ledgers"]]
        assert int(sh_stats.get("numberOfEntries", 0)) == N
        assert sh_stats.get("lastConfirmedEntry") == src_stats["lastConfirmedEntry"]
