"""The compaction worker's Prometheus series (served on its HTTP port by compaction/worker.py
through source/observability/http.py).

Per topic, with Pulsar's names and labels (`cluster`, `namespace`, `topic`), so Pulsar's
compaction panels work; like Pulsar's they are typed gauge, and the counts among them only
grow while the worker runs:

    pulsar_compaction_succeed_count          jobs that published a compacted ledger (or
                                             found nothing new to compact)
    pulsar_compaction_failed_count           jobs recorded FAILED
    pulsar_compaction_removed_event_count    entries read minus entries written, all jobs
    pulsar_compaction_duration_time_in_millis  time in succeeded jobs, claim to publish
    pulsar_compaction_read_throughput        bytes read per second, last job
    pulsar_compaction_write_throughput       bytes written per second, last job
    pulsar_compaction_compacted_entries_count  entries in the last compacted ledger
    pulsar_compaction_compacted_entries_size   bytes of the last compacted ledger

and the worker's own Prometheus-style series:

    shadowtopic_compaction_bytes_read_total, shadowtopic_compaction_bytes_written_total
    shadowtopic_compaction_jobs_total{cluster, result="succeeded"|"failed"}
    shadowtopic_compaction_duration_seconds (histogram, every job)
    shadowtopic_compaction_running{cluster}  the jobs running now (0 or 1 unless
                                             --max-concurrent-jobs is more)
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from shadowtopic.core.names import TopicName

LABELS = ["cluster", "namespace", "topic"]
BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, float("inf"))


@dataclass
class _Topic:
    succeeded: int = 0
    failed: int = 0
    removed: int = 0
    duration_ms: float = 0.0
    read_bps: float = 0.0
    write_bps: float = 0.0
    entries: int = 0
    size: int = 0
    bytes_read: int = 0
    bytes_written: int = 0


class CompactionMetrics(Collector):
    """The worker's job counts, per topic; register it (and its histogram) in `registry`."""

    def __init__(self, cluster: str, registry: CollectorRegistry | None = None):
        self.cluster = cluster
        self.topics: dict[TopicName, _Topic] = {}
        self.running = 0
        self.duration = Histogram("shadowtopic_compaction_duration_seconds",
                                  "compaction job duration, claim to publish or failure",
                                  buckets=BUCKETS, registry=registry)
        if registry is not None:
            registry.register(self)

    def succeeded(self, topic: TopicName, seconds: float, entries_read: int = 0,
                  entries_written: int = 0, bytes_read: int = 0, bytes_written: int = 0,
                  spark_seconds: float = 0.0) -> None:
        t = self.topics.setdefault(topic, _Topic())
        t.succeeded += 1
        t.removed += max(0, entries_read - entries_written)
        t.duration_ms += seconds * 1000
        t.bytes_read += bytes_read
        t.bytes_written += bytes_written
        if entries_read or entries_written:  # a job that compacted something
            t.entries, t.size = entries_written, bytes_written
            t.read_bps = bytes_read / spark_seconds if spark_seconds > 0 else 0.0
            t.write_bps = bytes_written / spark_seconds if spark_seconds > 0 else 0.0
        self.duration.observe(seconds)

    def failed(self, topic: TopicName, seconds: float) -> None:
        self.topics.setdefault(topic, _Topic()).failed += 1
        self.duration.observe(seconds)

    def collect(self) -> Iterable[Metric]:
        def gauge(name, doc):
            return GaugeMetricFamily(name, doc, labels=LABELS)
        fams = {
            "succeeded": gauge("pulsar_compaction_succeed_count", "compactions succeeded"),
            "failed": gauge("pulsar_compaction_failed_count", "compactions failed"),
            "removed": gauge("pulsar_compaction_removed_event_count",
                             "entries removed by compaction"),
            "duration_ms": gauge("pulsar_compaction_duration_time_in_millis",
                                 "milliseconds spent in succeeded compactions"),
            "read_bps": gauge("pulsar_compaction_read_throughput",
                              "bytes read per second, last compaction"),
            "write_bps": gauge("pulsar_compaction_write_throughput",
                               "bytes written per second, last compaction"),
            "entries": gauge("pulsar_compaction_compacted_entries_count",
                             "entries in the compacted ledger"),
            "size": gauge("pulsar_compaction_compacted_entries_size",
                          "bytes of the compacted ledger"),
        }
        read = CounterMetricFamily("shadowtopic_compaction_bytes_read",
                                   "bytes compaction jobs read", labels=LABELS)
        written = CounterMetricFamily("shadowtopic_compaction_bytes_written",
                                      "bytes compaction jobs wrote", labels=LABELS)
        jobs = CounterMetricFamily("shadowtopic_compaction_jobs", "compaction jobs finished",
                                   labels=["cluster", "result"])
        for topic, t in self.topics.items():
            labels = [self.cluster, topic.namespace_name, str(topic)]
            for key, fam in fams.items():
                fam.add_metric(labels, getattr(t, key))
            read.add_metric(labels, t.bytes_read)
            written.add_metric(labels, t.bytes_written)
        jobs.add_metric([self.cluster, "succeeded"],
                        sum(t.succeeded for t in self.topics.values()))
        jobs.add_metric([self.cluster, "failed"], sum(t.failed for t in self.topics.values()))
        running = GaugeMetricFamily("shadowtopic_compaction_running", "the jobs running now",
                                    labels=["cluster"])
        running.add_metric([self.cluster], self.running)
        yield from fams.values()
        yield from (read, written, jobs, running)


class WorkerState(Protocol):
    """What readiness reads of the running worker (compaction/jobs.py `Worker`)."""

    @property
    def lost(self) -> asyncio.Event: ...   # set once Spark's JVM is gone

    @property
    def etcd_ok(self) -> bool: ...         # False while its lease refreshes fail


class WorkerReadiness:
    """What the worker's `/readyz` says: ready once Spark is warm and the worker holds its
    etcd lease; not while etcd does not answer its lease refreshes, nor once Spark's JVM is
    gone (the worker then exits for its supervisor to start a new one)."""

    def __init__(self) -> None:
        self.worker: WorkerState | None = None  # the running `Worker`, once started
        self.stopping = False

    def not_ready(self) -> list[str]:
        w = self.worker
        if self.stopping:
            return ["shutting down"]
        if w is None:
            return ["starting (Spark warming up, etcd lease)"]
        reasons = []
        if w.lost.is_set():
            reasons.append("Spark's JVM exited")
        if not w.etcd_ok:
            reasons.append("etcd unreachable (lease refresh failed)")
        return reasons
