"""The one logging setup (source/logs.py): JSON lines with ts, level, logger, msg and the
record's fields, a topic taken from a record's first argument, the console line; and the
data dir lock (source/dirlock.py): a held dir is refused with its holder named, and the
refused one writes nothing."""
from __future__ import annotations

import io
import json
import logging
import os

import pytest

from shadowtopic import dirlock, logs
from shadowtopic.core.names import TopicName


@pytest.fixture
def logged():
    """setup() on a buffer; the root logger's handlers and level are put back after."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    buf = io.StringIO()

    def use(fmt: str, level: str = "INFO") -> io.StringIO:
        logs.setup(fmt, level, buf)
        return buf

    yield use
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in saved[0]:
        root.addHandler(h)
    root.setLevel(saved[1])


def test_json_lines_carry_the_fields(logged):
    buf = logged("json")
    log = logging.getLogger("shadowtopic.test")
    topic = TopicName.parse("persistent://public/default/t")
    log.info("loaded %s (epoch %d)", topic, 3, extra={"epoch": 3, "level": "x"})
    log.warning("job %s failed", "j1", extra={"topic": "persistent://a/b/c", "job": "j1"})
    log.debug("not logged at INFO")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("%s: compaction failed", "persistent://a/b/d")
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert len(lines) == 3
    first, second, third = lines
    assert first["msg"] == "loaded persistent://public/default/t (epoch 3)"
    assert (first["level"], first["logger"], first["topic"], first["epoch"]) == (
        "INFO", "shadowtopic.test", "persistent://public/default/t", 3)
    assert first["field_level"] == "x" and first["ts"].endswith("Z")
    assert (second["topic"], second["job"], second["level"]) == (
        "persistent://a/b/c", "j1", "WARNING")
    assert third["topic"] == "persistent://a/b/d" and "ValueError: boom" in third["exc"]


def test_console_lines_add_only_what_the_message_does_not_say(logged):
    buf = logged("console", "debug")
    log = logging.getLogger("shadowtopic.test")
    log.debug("loaded %s", "persistent://a/b/c", extra={"epoch": 7})
    log.info("ledger %d sealed", 17, extra={"topic": "persistent://a/b/d", "ledger": 17})
    first, second = buf.getvalue().splitlines()
    assert first.endswith("DEBUG shadowtopic.test: loaded persistent://a/b/c  epoch=7"), first
    assert second.endswith("INFO shadowtopic.test: ledger 17 sealed  topic=persistent://a/b/d "
                           "ledger=17"), second


def test_a_held_dir_is_refused_naming_its_holder_and_left_alone(tmp_path):
    data = str(tmp_path / "data")
    held = dirlock.acquire(data, "shadowtopic standalone")
    lock_file = os.path.join(data, dirlock.STANDALONE)
    before = (open(lock_file).read(), os.stat(lock_file).st_mtime_ns, sorted(os.listdir(data)))
    with pytest.raises(dirlock.DataDirInUse) as e:
        dirlock.acquire(data, "another")
    assert str(e.value) == (f"data dir {data} is in use by pid {os.getpid()} (shadowtopic "
                            f"standalone) (it holds {lock_file})")
    assert (open(lock_file).read(), os.stat(lock_file).st_mtime_ns,
            sorted(os.listdir(data))) == before
    # another lock name in the same dir is another holder's (a broker under a standalone)
    with dirlock.acquire(data, "broker", dirlock.BROKER):
        pass
    held.release()
    with dirlock.acquire(data, "again") as again:
        assert open(again.path).read() == f"pid {os.getpid()} (again)\n"
