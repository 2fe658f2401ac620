"""The managed ledger on a disk that takes no writes (F14 at the ledger): a topic opens
read-only, serves every entry, fails writes typed, and takes writes again afterwards."""
from __future__ import annotations

import errno
import os

import pytest
from support.ledger_env import TOPIC, Env
from support.ledger_env import append as _append
from support.ledger_env import read_all as _read_all

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.ledger import disk, sealing, wal
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb


def _read_only(monkeypatch, err=errno.EROFS) -> None:
    """Every write the ledger makes fails with `err` (the probe's too)."""
    def refuse(*args, **kwargs):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(wal.WalFile, "create", classmethod(refuse))
    monkeypatch.setattr(wal.WalFile, "write_sync", refuse)
    monkeypatch.setattr(sealing, "seal_wal", refuse)
    monkeypatch.setattr(disk, "probe_write", lambda directory: OSError(err, os.strerror(err)))


@pytest.mark.parametrize("err,cls", [(errno.EROFS, errors.StorageReadOnly),
                                     (errno.ENOSPC, errors.StorageFull)])
def test_topic_opens_read_only_then_takes_writes_again(tmp_path, arun, monkeypatch, err, cls):
    async def main():
        env = Env(tmp_path)
        ml = await env.open()
        await _append(ml, 30)
        await ml.roll()
        open_lid, _ = await _append(ml, 10, 30)  # left open: the owner dies
        expected = [f"m{i}".encode() for i in range(40)]

        _read_only(monkeypatch, err)
        ro = await env.open()
        assert [e.raw for e in await _read_all(ro)] == expected
        states = [(i.ledger_id, i.state) for i in ro.ledgers()]
        assert states[-1] == (open_lid, mpb.OPEN) and len(states) == 2
        assert ro.next_position() == MessageId(open_lid, 10)
        assert ro.storage.disk.error is not None
        with pytest.raises(cls):
            await _append(ro, 1, 99)
        with pytest.raises(cls):
            await ro.roll()
        assert [e.raw for e in await _read_all(ro)] == expected  # nothing of them stored

        monkeypatch.undo()
        lid, first = await _append(ro, 1, 40)
        assert lid > open_lid and first == 0
        await ro.roll()  # seals the ledger the disk kept open, then the new one
        assert all(i.state == mpb.SEALED for i in ro.ledgers()[:-1])
        assert not os.path.exists(env.storage.wal_path(env.storage.wal_rel(TOPIC, open_lid)))
        assert [e.raw for e in await _read_all(ro)] == expected + [b"m40"]
        await ro.close()

    arun(main())


def test_torn_tail_on_a_read_only_disk_is_not_served(tmp_path, arun, monkeypatch):
    async def main():
        env = Env(tmp_path)
        ml = await env.open()
        lid, _ = await _append(ml, 5)
        path = env.storage.wal_path(env.storage.wal_rel(TOPIC, lid))
        with open(path, "ab") as f:
            f.write(b"\x07torn")
        size = os.path.getsize(path)
        _read_only(monkeypatch)
        real_open = open

        def no_write_open(file, mode="r", *args, **kwargs):
            if file == path and mode != "rb":
                raise OSError(errno.EROFS, "Read-only file system")
            return real_open(file, mode, *args, **kwargs)

        monkeypatch.setattr("builtins.open", no_write_open)
        ro = await env.open()
        assert os.path.getsize(path) == size  # left as it was
        assert [e.raw for e in await _read_all(ro)] == [f"m{i}".encode() for i in range(5)]
        monkeypatch.undo()
        await ro.close()

    arun(main())


def test_a_seal_the_object_store_or_etcd_failed_is_retried(tmp_path, arun):
    """A seal that fails for another reason than the disk (an S3 outage, etcd away while
    the list is marked) keeps its ledger open and readable, and the next `retry_seals` (the
    broker's maintenance pass) seals it; before, it stayed OPEN until a restart."""
    from shadowtopic import failpoints

    async def main():
        env = Env(tmp_path)
        ml = await env.open()
        lid, _ = await _append(ml, 20)
        with failpoints.enabled({"ledger.seal.before_publish": "1*error(S3 is away)"}):
            with pytest.raises(Exception, match="S3 is away"):
                await ml.roll()
        states = {i.ledger_id: i.state for i in ml.ledgers()}
        assert states[lid] == mpb.OPEN
        assert [e.raw for e in await _read_all(ml)] == [f"m{i}".encode() for i in range(20)]
        await ml.retry_seals()
        states = {i.ledger_id: i.state for i in ml.ledgers()}
        assert states[lid] == mpb.SEALED
        assert not os.path.exists(env.storage.wal_path(env.storage.wal_rel(TOPIC, lid)))
        assert [e.raw for e in await _read_all(ml)] == [f"m{i}".encode() for i in range(20)]
        await ml.close()

    arun(main())
