"""The shadow feature's Prometheus series, on the broker that owns a source (read at scrape
time from its `ShadowReplicator`s: shadow/replicator.py).

Labels: Pulsar's `cluster`, `namespace`, `topic` (the source) plus `shadow` (the shadow
topic, where Pulsar's geo-replication series have `remote_cluster`):

    pulsar_replication_backlog            entries of the source not yet sent to the shadow
    pulsar_replication_delay_in_seconds   how long the shadow has been behind (0: caught up)
    pulsar_replication_connected_count    1 while the replicator's stream is up
    shadowtopic_replication_out_messages_total   entries the shadow has acknowledged
    shadowtopic_replication_auto_resets_total    jumps to the tail past the policy's backlog
"""
from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from shadowtopic.broker.metrics import TOPIC_LABELS, topic_labels
from shadowtopic.shadow.replicators import TopicReplicators

LABELS = [*TOPIC_LABELS, "shadow"]


def replication_metrics(cluster: str, replicators: Iterable[TopicReplicators]
                        ) -> Iterable[Metric]:
    backlog = GaugeMetricFamily("pulsar_replication_backlog",
                                "entries not yet replicated to the shadow", labels=LABELS)
    delay = GaugeMetricFamily("pulsar_replication_delay_in_seconds",
                              "seconds the shadow has been behind", labels=LABELS)
    connected = GaugeMetricFamily("pulsar_replication_connected_count",
                                  "1 while the replication stream is up", labels=LABELS)
    out = CounterMetricFamily("shadowtopic_replication_out_messages",
                              "entries replicated to the shadow", labels=LABELS)
    resets = CounterMetricFamily("shadowtopic_replication_auto_resets",
                                 "jumps to the tail past replicator_auto_reset_backlog_entries",
                                 labels=LABELS)
    now = time.monotonic()
    for reps in replicators:
        base = topic_labels(cluster, reps.topic)
        for shadow, r in reps.replicators.items():
            labels = [*base, str(shadow)]
            n, behind = r.backlog(now)
            backlog.add_metric(labels, n)
            delay.add_metric(labels, behind)
            connected.add_metric(labels, 1 if r.connected else 0)
            out.add_metric(labels, r.msg_out)
            resets.add_metric(labels, r.auto_resets)
    return [backlog, delay, connected, out, resets]
