"""A broker's Prometheus series, read from its live state at scrape time.

`BrokerCollector` is a prometheus-client Collector: nothing is updated on the hot path for
it; each scrape reads the counters the topics keep anyway (source/broker/rates.py), the
subscriptions' cursors, the entry cache and the cursor flushers. Counters are the topic's
own monotonic counts: a topic unloaded and loaded again starts from 0 (Prometheus sees a
counter reset, as with Pulsar's). Labels are Pulsar's: `cluster`, `namespace`
(tenant/namespace), `topic` (persistent://...), plus `subscription` on per-subscription
series.

per loaded topic
    pulsar_in_messages_total, pulsar_in_bytes_total          produced to it (a source)
    pulsar_out_messages_total, pulsar_out_bytes_total        delivered to its readers
    pulsar_rate_in, pulsar_rate_out, pulsar_throughput_in, pulsar_throughput_out
                                                             per second, one-minute window
    pulsar_producers_count, pulsar_subscriptions_count, pulsar_consumers_count
    pulsar_storage_size            bytes of its ledgers (0 for a shadow: it stores nothing)
    pulsar_msg_backlog             entries not acknowledged, over all its subscriptions
    shadowtopic_cursor_flushes_total, shadowtopic_cursor_flush_failures_total,
    shadowtopic_cursors_flushed_total, shadowtopic_cursor_flush_last_seconds
                                   the topic's cursor flusher (source/cursors/flusher.py)
per subscription, only with --metrics-per-subscription (100,000 subscriptions would be
100,000 series each; bench/metrics_scrape.py measures both)
    pulsar_subscription_back_log, pulsar_subscription_consumers_count,
    shadowtopic_subscription_out_messages_total, shadowtopic_subscription_redelivered_total
per broker (label `cluster`)
    pulsar_topics_count            loaded topics
    pulsar_ml_cache_used_size      bytes in the entry cache (source/ledger/entry_cache.py)
    shadowtopic_entry_cache_limit_bytes, shadowtopic_entry_cache_peak_bytes,
    shadowtopic_entry_cache_items, shadowtopic_entry_cache_evictions_total,
    shadowtopic_entry_cache_evicted_bytes_total
    shadowtopic_client_memory_bytes, shadowtopic_client_memory_limit_bytes,
    shadowtopic_client_memory_refused_total, shadowtopic_slow_consumer_cuts_total
                                   memory held for clients against its cap
                                   (source/broker/memory.py)
    shadowtopic_broker_ready       1 while /readyz says ready
    shadowtopic_storage_writable   0 while the data disk is full or read-only
with the WAL on object storage (--wal; source/ledger/object_wal.py)
    shadowtopic_wal_object_puts_total, shadowtopic_wal_object_put_bytes_total,
    shadowtopic_wal_object_put_failures_total
                                   WAL objects written (one per flush window)
    shadowtopic_wal_commit_txns_total, shadowtopic_wal_commit_sections_total
                                   etcd transactions committing them, and the open
                                   ledgers' batches they committed
    shadowtopic_wal_object_put_seconds, shadowtopic_wal_commit_seconds
                                   histograms of each PUT's and each transaction's latency
    shadowtopic_wal_objects_deleted_total
                                   objects deleted once nothing needed them
and what each feature adds (`BrokerFeature.metrics`: shadow/metrics.py), the gRPC series
(source/observability/rpc_metrics.py) and prometheus-client's process_* series.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from shadowtopic.broker.config import BrokerConfig
from shadowtopic.broker.feature import BrokerFeature
from shadowtopic.broker.memory import ClientMemory
from shadowtopic.broker.topics import TopicManager
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.object_wal import ObjectWal
from shadowtopic.ledger.storage import Storage

log = logging.getLogger("shadowtopic.broker.metrics")

TOPIC_LABELS = ["cluster", "namespace", "topic"]
SUB_LABELS = [*TOPIC_LABELS, "subscription"]


def topic_labels(cluster: str, topic: TopicName) -> list[str]:
    """The label values of `topic`'s series, in `TOPIC_LABELS` order."""
    return [cluster, topic.namespace_name, str(topic)]


class Scraped(Protocol):
    """What a scrape reads of the broker (source/broker/server.py's `Broker`)."""

    config: BrokerConfig
    topics: TopicManager
    storage: Storage
    features: list[BrokerFeature]
    memory: ClientMemory
    wal_objects: ObjectWal | None

    def not_ready(self) -> list[str]:
        """Why /readyz says 503 ([]: ready)."""


class BrokerCollector(Collector):
    def __init__(self, broker: Scraped):
        self.broker = broker

    def collect(self) -> Iterable[Metric]:
        b = self.broker
        per_sub = b.config.metrics_per_subscription
        c = _Families(per_sub)
        for t in b.topics.loaded_topics():
            c.topic(b.config.cluster, t)
        yield from c.families()
        cache = b.topics.entry_cache.stats()
        cl = [b.config.cluster]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["cluster"])
            g.add_metric(cl, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=["cluster"])
            c.add_metric(cl, value)
            return c

        yield gauge("pulsar_topics_count", "topics loaded on this broker",
                    len(b.topics.loaded_topics()))
        yield gauge("pulsar_ml_cache_used_size", "bytes held in the entry cache",
                    cache["held"])
        yield gauge("shadowtopic_entry_cache_limit_bytes", "the entry cache's budget",
                    cache["limit"])
        yield gauge("shadowtopic_entry_cache_peak_bytes", "most bytes the entry cache held",
                    cache["peak"])
        yield gauge("shadowtopic_entry_cache_items", "entries in the entry cache",
                    cache["items"])
        yield counter("shadowtopic_entry_cache_evictions",
                      "entries dropped from the entry cache", cache["evictions"])
        yield counter("shadowtopic_entry_cache_evicted_bytes",
                      "bytes dropped from the entry cache", cache["evicted_bytes"])
        mem = b.memory
        yield gauge("shadowtopic_client_memory_bytes",
                    "memory held for clients, as counted against --client-memory-bytes",
                    mem.used)
        yield gauge("shadowtopic_client_memory_limit_bytes", "--client-memory-bytes",
                    mem.limit)
        yield counter("shadowtopic_client_memory_refused",
                      "requests refused at the client-memory cap (BrokerMemoryFull)",
                      mem.refused)
        yield counter("shadowtopic_slow_consumer_cuts",
                      "consumer streams cut for taking no data (SlowConsumer)",
                      mem.cut_streams)
        yield gauge("shadowtopic_broker_ready", "1 while /readyz says ready",
                    0 if b.not_ready() else 1)
        yield gauge("shadowtopic_storage_writable",
                    "0 while the data disk is full or read-only (produce refused)",
                    1 if b.storage.disk.writable else 0)
        wal = b.wal_objects
        if wal is not None:  # the WAL on object storage (source/ledger/object_wal.py)
            st = wal.stats
            yield counter("shadowtopic_wal_object_puts", "WAL objects written (one per flush "
                          "window)", st.puts)
            yield counter("shadowtopic_wal_object_put_bytes", "bytes of WAL objects written",
                          st.put_bytes)
            yield counter("shadowtopic_wal_object_put_failures", "WAL object writes that "
                          "failed (their appends failed, nothing acknowledged)", st.failed_puts)
            yield counter("shadowtopic_wal_commit_txns", "etcd transactions committing WAL "
                          "objects", st.txns)
            yield counter("shadowtopic_wal_commit_sections", "open ledgers' batches committed "
                          "(one per topic and flush window)", st.sections)
            yield HistogramMetricFamily(
                "shadowtopic_wal_object_put_seconds", "each WAL object's PUT",
                buckets=st.put_seconds.cumulative(), sum_value=st.put_seconds.total)
            yield HistogramMetricFamily(
                "shadowtopic_wal_commit_seconds", "each etcd transaction committing WAL objects",
                buckets=st.txn_seconds.cumulative(), sum_value=st.txn_seconds.total)
            yield counter("shadowtopic_wal_objects_deleted", "WAL objects deleted once "
                          "nothing needed them", st.deleted_objects)
        for f in b.features:
            try:
                yield from f.metrics()
            except Exception:  # noqa: BLE001 - one feature's failure spoils no scrape
                log.exception("metrics of feature %s failed", f.name)


class _Families:
    """The per-topic (and per-subscription) families of one scrape, filled topic by topic."""

    def __init__(self, per_sub: bool):
        self.per_sub = per_sub
        T = TOPIC_LABELS
        self.counters = {
            "in_msgs": CounterMetricFamily("pulsar_in_messages", "messages produced", labels=T),
            "in_bytes": CounterMetricFamily("pulsar_in_bytes", "bytes produced", labels=T),
            "out_msgs": CounterMetricFamily("pulsar_out_messages", "messages delivered",
                                            labels=T),
            "out_bytes": CounterMetricFamily("pulsar_out_bytes", "bytes delivered", labels=T),
            "flushes": CounterMetricFamily("shadowtopic_cursor_flushes",
                                           "cursor snapshots saved", labels=T),
            "flush_failures": CounterMetricFamily("shadowtopic_cursor_flush_failures",
                                                  "cursor snapshots that failed", labels=T),
            "cursors_flushed": CounterMetricFamily("shadowtopic_cursors_flushed",
                                                   "cursor states written", labels=T),
        }
        self.gauges = {
            "rate_in": GaugeMetricFamily("pulsar_rate_in", "messages in per second", labels=T),
            "rate_out": GaugeMetricFamily("pulsar_rate_out", "messages out per second",
                                          labels=T),
            "tp_in": GaugeMetricFamily("pulsar_throughput_in", "bytes in per second",
                                       labels=T),
            "tp_out": GaugeMetricFamily("pulsar_throughput_out", "bytes out per second",
                                        labels=T),
            "producers": GaugeMetricFamily("pulsar_producers_count", "producers", labels=T),
            "subs": GaugeMetricFamily("pulsar_subscriptions_count", "durable subscriptions",
                                      labels=T),
            "consumers": GaugeMetricFamily("pulsar_consumers_count",
                                           "consumers of its subscriptions", labels=T),
            "storage": GaugeMetricFamily("pulsar_storage_size", "bytes of its ledgers",
                                         labels=T),
            "backlog": GaugeMetricFamily("pulsar_msg_backlog",
                                         "entries not acknowledged, all subscriptions",
                                         labels=T),
            "flush_last": GaugeMetricFamily("shadowtopic_cursor_flush_last_seconds",
                                            "duration of the last cursor snapshot",
                                            labels=T),
        }
        S = SUB_LABELS
        self.subs: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "backlog": GaugeMetricFamily("pulsar_subscription_back_log",
                                         "entries not acknowledged", labels=S),
            "consumers": GaugeMetricFamily("pulsar_subscription_consumers_count",
                                           "consumers attached", labels=S),
            "out": CounterMetricFamily("shadowtopic_subscription_out_messages",
                                       "messages delivered", labels=S),
            "redelivered": CounterMetricFamily("shadowtopic_subscription_redelivered",
                                               "messages redelivered", labels=S),
        } if per_sub else {}

    def topic(self, cluster: str, t) -> None:
        labels = topic_labels(cluster, t.name)
        c, g = self.counters, self.gauges
        k = t.counters
        c["in_msgs"].add_metric(labels, k.msg_in)
        c["in_bytes"].add_metric(labels, k.bytes_in)
        c["out_msgs"].add_metric(labels, k.msg_out)
        c["out_bytes"].add_metric(labels, k.bytes_out)
        rin, tin, rout, tout = k.rates()
        g["rate_in"].add_metric(labels, rin)
        g["tp_in"].add_metric(labels, tin)
        g["rate_out"].add_metric(labels, rout)
        g["tp_out"].add_metric(labels, tout)
        g["producers"].add_metric(labels, len(t.producers))
        size = sum(i.size_bytes for i in t.ledger.ledgers()) if t.writer is not None else 0
        g["storage"].add_metric(labels, size)
        ts = t.subscriptions
        backlog = consumers = 0
        if ts is not None:
            same: dict = {}  # (view, mark-delete) -> backlog, of cursors without holes
            for name, sub in ts.subs.items():
                cur = sub.cursor
                if cur.holes:
                    n = ts.backlog(sub)
                else:  # 100,000 broadcast subscriptions sit at a few positions
                    at = (sub.view, cur.mark_delete)
                    n = same.get(at)
                    if n is None:
                        n = same[at] = ts.backlog(sub)
                backlog += n
                consumers += len(sub.consumers)
                if self.per_sub:
                    sl = [*labels, name]
                    self.subs["backlog"].add_metric(sl, n)
                    self.subs["consumers"].add_metric(sl, len(sub.consumers))
                    self.subs["out"].add_metric(sl, sub.msg_out)
                    self.subs["redelivered"].add_metric(sl, sub.redelivered)
            fl = ts.flusher
            c["flushes"].add_metric(labels, fl.flushes)
            c["flush_failures"].add_metric(labels, fl.failures)
            c["cursors_flushed"].add_metric(labels, fl.cursors_flushed)
            g["flush_last"].add_metric(labels, fl.last_flush_s)
        g["subs"].add_metric(labels, len(ts.subs) if ts is not None else 0)
        g["consumers"].add_metric(labels, consumers)
        g["backlog"].add_metric(labels, backlog)

    def families(self) -> Iterable[Metric]:
        yield from self.counters.values()
        yield from self.gauges.values()
        yield from self.subs.values()
