"""A broker started with `--log-format json` writes only JSON lines (ts, level, logger, msg,
fields), and the line about a topic it loads carries the topic as a field; `--log-level
WARNING` keeps INFO lines out; a compaction that fails is one ERROR line with its cause, and
the worker's log holds none of Spark's own output."""
from __future__ import annotations

import json
import uuid

from support.compaction_support import WORKER_ARGS, produce, wait_done

from shadowtopic import failpoints
from shadowtopic.broker.server import free_port
from shadowtopic.client import Client
from shadowtopic.standalone import BrokerProcess


def json_lines(path: str) -> list[dict]:
    with open(path) as f:
        text = f.read()
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "the broker logged nothing"
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    return out


def test_json_log_lines_carry_the_topic(etcd_server, tmp_path, topic):
    log_path = str(tmp_path / "broker.log")
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "data"), free_port(),
                      log_path=log_path, extra_args=["--lease-ttl", "3", "--log-format", "json"])
    b.start(timeout=60)
    try:
        with Client(b.url, timeout=20) as c:
            c.admin.create_topic(topic)
            with c.create_producer(topic) as p:
                p.send(b"hello", timeout=10)
    finally:
        assert b.terminate() == 0
    records = json_lines(log_path)
    for r in records:
        assert {"ts", "level", "logger", "msg"} <= r.keys(), r
    loaded = [r for r in records if r["msg"].startswith("loaded ") and r.get("topic") == topic]
    assert len(loaded) == 1, records
    assert (loaded[0]["level"], loaded[0]["logger"]) == ("INFO", "shadowtopic.broker.builder")
    assert isinstance(loaded[0]["epoch"], int)
    assert any(r["msg"].startswith("broker ") and "listening on" in r["msg"] for r in records)


def test_log_level_keeps_lower_levels_out(etcd_server, tmp_path, topic):
    log_path = str(tmp_path / "broker.log")
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "data"), free_port(),
                      log_path=log_path, extra_args=["--lease-ttl", "3", "--log-format", "json",
                                                     "--log-level", "warning"])
    b.start(timeout=60)
    try:
        with Client(b.url, timeout=20) as c:
            c.admin.create_topic(topic)
    finally:
        assert b.terminate() == 0
    with open(log_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    assert all(r["level"] in ("WARNING", "ERROR", "CRITICAL") for r in records), records


def test_a_failed_compaction_is_logged_once_with_its_cause(etcd_server, tmp_path):
    """The worker (json logs through its SHADOWTOPIC_CFG__ variable) logs a job that fails
    as one ERROR line with the topic, the job and the cause as fields."""
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "broker"), free_port(),
                      extra_args=["--lease-ttl", "3", "--cluster", cluster])
    w = BrokerProcess(etcd_server.endpoint, str(tmp_path / "worker"), free_port(),
                      module="shadowtopic.compaction.worker",
                      extra_args=[*WORKER_ARGS, "--cluster", cluster],
                      env={**failpoints.env({"compaction.before_publish": "error(disk on fire)"}),
                           "SHADOWTOPIC_CFG__WORKER__LOG_FORMAT": "json"})
    try:
        b.start(timeout=60)
        w.start(timeout=180)
        with Client(b.url, timeout=30) as c:
            produce(c, topic, [(f"k{i % 5}", f"v{i}") for i in range(50)])
            job = c.admin.compact(topic)
            assert wait_done(c, topic, job).phase == "failed"
    finally:
        b.kill()
        w.kill()
    records = json_lines(w.log_path)
    failed = [r for r in records if r["level"] == "ERROR"]
    assert len(failed) == 1, failed
    assert (failed[0]["topic"], failed[0]["job"]) == (topic, job)
    assert "disk on fire" in failed[0]["error"] and "disk on fire" in failed[0]["msg"]
    # every line of the worker's log was JSON (json_lines): Spark's output went elsewhere
    assert (tmp_path / "worker" / "logs" / "spark.log").exists()
    assert (tmp_path / "worker" / "logs" / "spark-log4j2.properties").read_text().count(
        "rootLogger.level = warn") == 1
