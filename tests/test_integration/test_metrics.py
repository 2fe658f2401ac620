"""`/metrics` of every role, scraped from real processes while they work: a source broker
during produce and delivery, a source with a shadow (replication series per shadow, moving
while the shadow broker is paused), a shadow broker's per-subscription series, and the
compaction worker across a compaction. Health endpoints: test_http_health.py; the metrics
URL each role of `shadowtopic standalone` prints: test_standalone.py (its standalone with
every role)."""
from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
from support.compaction_support import produce, wait_done
from support.metrics_support import (
    base_of,
    get,
    logged_metrics_url,
    registered_metrics_url,
    scrape,
    series,
    value,
    wait_value,
)

from shadowtopic.client import Client, Policies, errors
from shadowtopic.core.names import TopicName
from shadowtopic.standalone import BrokerProcess

CREATE = "/shadowtopic.v1.Admin/CreateTopic"


def labels_of(topic: str, cluster: str = "standalone") -> dict[str, str]:
    t = TopicName.parse(topic)
    return dict(cluster=cluster, namespace=t.namespace_name, topic=str(t))


def cluster_of(b: BrokerProcess) -> str:
    return b.extra_args[b.extra_args.index("--cluster") + 1]


def test_source_broker_counts_produce_delivery_and_rpcs(broker, client, etcd_server, topic):
    url = registered_metrics_url(etcd_server, broker)
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    assert logged_metrics_url(broker) == url  # the URL the broker printed when it started
    lab = labels_of(topic)

    before = scrape(url)
    created = value(before, "grpc_server_handled_total", method=CREATE, code="OK") or 0
    exists = value(before, "grpc_server_handled_total", method=CREATE,
                   code="ALREADY_EXISTS") or 0
    client.admin.create_topic(topic)
    with pytest.raises(errors.TopicAlreadyExists):
        client.admin.create_topic(topic)
    client.admin.create_subscription(topic, "s", start="earliest")

    s = scrape(url)
    assert value(s, "grpc_server_handled_total", method=CREATE, code="OK") == created + 1
    assert value(s, "grpc_server_handled_total", method=CREATE,
                 code="ALREADY_EXISTS") == exists + 1
    assert value(s, "grpc_server_handling_seconds_count", method=CREATE) >= 2
    in0 = value(s, "pulsar_in_messages_total", **lab) or 0

    with client.create_producer(topic) as p:
        for i in range(37):
            p.send(f"m{i}".encode())
    s = wait_value(url, "pulsar_in_messages_total", in0 + 37, **lab)
    assert value(s, "pulsar_in_bytes_total", **lab) >= 37 * 2
    assert value(s, "pulsar_msg_backlog", **lab) == 37
    assert value(s, "pulsar_subscriptions_count", **lab) == 1
    assert value(s, "pulsar_storage_size", **lab) == client.admin.stats(topic)["storageSize"]
    assert value(s, "pulsar_storage_size", **lab) > 0
    # per-subscription series are off by default
    assert not series(s, "pulsar_subscription_back_log", topic=lab["topic"])
    assert value(s, "pulsar_ml_cache_used_size", cluster="standalone") >= 0
    assert value(s, "shadowtopic_broker_ready", cluster="standalone") == 1
    assert value(s, "process_resident_memory_bytes") > 0

    c = client.subscribe(topic, "s")
    for _ in range(37):
        c.acknowledge(c.receive(timeout=20))
    s = wait_value(url, "pulsar_msg_backlog", 0, **lab)
    assert value(s, "pulsar_out_messages_total", **lab) == 37
    assert value(s, "pulsar_consumers_count", **lab) == 1
    # the acks' cursor is saved by the topic's flusher (--cursor-flush-interval, 1 s)
    wait_value(url, "shadowtopic_cursor_flush_failures_total", 0, **lab)
    deadline = time.monotonic() + 20
    while not value(scrape(url), "shadowtopic_cursor_flushes_total", **lab):
        assert time.monotonic() < deadline, "no cursor flush counted"
        time.sleep(0.2)
    c.close()


def test_replication_series_per_shadow_and_per_subscription_series(start_pair, etcd_server):
    src, sh = start_pair("--metrics-per-subscription")
    cluster = cluster_of(src)
    src_url = registered_metrics_url(etcd_server, src, cluster)
    sh_url = registered_metrics_url(etcd_server, sh, cluster)
    assert src_url != sh_url
    ns = f"public/ns-{uuid.uuid4().hex[:8]}"
    topic, shadow = f"persistent://{ns}/src", f"persistent://{ns}/shadow"
    lab = dict(labels_of(topic, cluster), shadow=shadow)
    with Client(src.url, timeout=30) as c:
        c.admin.create_topic(topic)
        c.admin.create_shadow_topic(shadow, topic)
        with c.create_producer(topic) as p:
            for i in range(5):
                p.send(f"a{i}".encode())
            wait_value(src_url, "shadowtopic_replication_out_messages_total", 5, **lab)
            s = wait_value(src_url, "pulsar_replication_backlog", 0, **lab)
            assert value(s, "pulsar_replication_connected_count", **lab) == 1

            os.kill(sh.proc.pid, signal.SIGSTOP)  # the shadow acknowledges nothing now
            try:
                for i in range(7):
                    p.send(f"b{i}".encode())
                s = wait_value(src_url, "pulsar_replication_backlog", 7, **lab)
                assert value(s, "shadowtopic_replication_out_messages_total", **lab) == 5
            finally:
                os.kill(sh.proc.pid, signal.SIGCONT)
            s = wait_value(src_url, "pulsar_replication_backlog", 0, **lab)
            assert value(s, "shadowtopic_replication_out_messages_total", **lab) == 12

        c.admin.create_subscription(shadow, "ss", start="earliest")
        sub = dict(labels_of(shadow, cluster), subscription="ss")
        s = wait_value(sh_url, "pulsar_subscription_back_log", 12, **sub)
        assert value(s, "pulsar_msg_backlog", **labels_of(shadow, cluster)) == 12
        assert value(s, "pulsar_subscription_consumers_count", **sub) == 0
        # a shadow stores nothing of its own
        assert value(s, "pulsar_storage_size", **labels_of(shadow, cluster)) == 0
        cons = c.subscribe(shadow, "ss")
        for _ in range(12):
            cons.acknowledge(cons.receive(timeout=20))
        s = wait_value(sh_url, "pulsar_subscription_back_log", 0, **sub)
        assert value(s, "shadowtopic_subscription_out_messages_total", **sub) == 12
        assert value(s, "pulsar_out_messages_total", **labels_of(shadow, cluster)) == 12
        cons.close()


def test_compaction_worker_counts_a_compaction(compacting_source, worker, cluster):
    url = logged_metrics_url(worker)
    assert get(base_of(url) + "/healthz")[:2] == (200, "ok\n")
    assert get(base_of(url) + "/readyz")[:2] == (200, "ready\n")
    topic = f"persistent://public/ns-{uuid.uuid4().hex[:8]}/t"
    lab = labels_of(topic, cluster)
    # (the worker serves the compaction tests of every module of this process: none runs now)
    before = wait_value(url, "shadowtopic_compaction_running", 0, cluster=cluster)
    jobs0 = value(before, "shadowtopic_compaction_jobs_total", cluster=cluster,
                  result="succeeded")
    assert value(before, "pulsar_compaction_succeed_count", **lab) is None
    with Client(compacting_source.url, timeout=30) as c:
        c.admin.create_topic(topic, policies=Policies(delete_retention_seconds=0))
        items = [("a", "a1"), ("b", "b1"), (None, "free1"), ("a", "a2"), ("c", "c1"),
                 ("b", ""), ("a", "a3"), ("d", "d1"), ("d", ""), ("d", "d2")]
        produce(c, topic, items)
        status = wait_done(c, topic, c.admin.compact(topic))
        assert status.phase == "done", status.error
    # the job record is DONE as its pointer is published; the series follow at once after
    s = wait_value(url, "pulsar_compaction_succeed_count", 1, **lab)
    assert value(s, "shadowtopic_compaction_jobs_total", cluster=cluster,
                 result="succeeded") == jobs0 + 1
    assert value(s, "pulsar_compaction_failed_count", **lab) == 0
    assert value(s, "pulsar_compaction_removed_event_count", **lab) == 6  # 10 in, 4 kept
    assert value(s, "pulsar_compaction_compacted_entries_count", **lab) == 4
    assert value(s, "pulsar_compaction_compacted_entries_size", **lab) == \
        status.bytes_written > 0
    assert value(s, "shadowtopic_compaction_bytes_read_total", **lab) == status.bytes_read
    assert value(s, "pulsar_compaction_duration_time_in_millis", **lab) > 0
    assert value(s, "shadowtopic_compaction_duration_seconds_count") >= 1
    # the job prunes old job records after publishing, then ends
    wait_value(url, "shadowtopic_compaction_running", 0, cluster=cluster)
