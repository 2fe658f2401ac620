"""Retention and ledger rolls of the source topics this broker owns.

Retention runs after every seal of a topic and, for every owned source topic, once a
`retention_interval` (with a roll of its open ledger when it is past its age). A pass keeps
the oldest entry some durable subscription has not acknowledged, and what each feature asks
to keep (`BrokerFeature.retention_keep`: what shadows' subscriptions still need, what
compaction has not read yet); the rule itself is source/ledger/retention.py. After a pass
each feature hears of it (`after_retention`: the compaction threshold trigger). A topic that
reads another's ledgers (a shadow) has nothing to retain here. Each interval also seals the
ledgers a full or read-only disk kept open (`ManagedLedger.retry_seals`), before and
independently of retention (which may be what frees the disk). With the WAL on object
storage, each interval also sweeps the WAL objects no commit names
(source/ledger/object_wal.py).

Disk policies (source/broker/quota.py: message TTL, subscription expiry, the backlog quota)
run once an interval for every loaded topic, a shadow's too (its subscriptions are its own),
and before each retention pass of a source, so retention deletes what TTL and backlog
eviction acknowledged. `--retention-interval` sets the interval.
"""
from __future__ import annotations

import asyncio
import logging

from shadowtopic.broker import quota
from shadowtopic.broker.feature import BrokerFeature
from shadowtopic.broker.topic import Topic, effective
from shadowtopic.broker.topics import TopicManager
from shadowtopic.ledger import retention
from shadowtopic.ledger.object_wal import ObjectWal
from shadowtopic.ledger.wal_restore import drop_stale_everywhere

log = logging.getLogger(__name__)


class Maintenance:
    def __init__(self, topics: TopicManager, features: list[BrokerFeature],
                 interval: float = 60.0, wal_objects: ObjectWal | None = None,
                 wal_grace_s: float = 600.0):
        self.topics = topics
        self.wal_objects = wal_objects
        self.wal_grace_s = wal_grace_s
        self.features = features
        self.interval = interval
        self._task: asyncio.Task | None = None
        self._passes: set[asyncio.Task] = set()
        topics.on_sealed(self.schedule)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        tasks = [t for t in (self._task, *self._passes) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def schedule(self, t: Topic) -> None:
        """Run a retention pass of `t` soon (after a seal)."""
        task = asyncio.get_running_loop().create_task(self.retain(t))
        self._passes.add(task)
        task.add_done_callback(self._passes.discard)

    async def retain(self, t: Topic) -> None:
        if self.topics.loaded(t.name) is not t or t.writer is None:
            return
        try:
            p = await self.topics.policies(t.name)
            await self.disk_policies(t, p)
            max_age = effective(p.retention_time_seconds, "retention_time_seconds")
            max_size = effective(p.retention_size_bytes, "retention_size_bytes")
            if max_age >= 0 or max_size >= 0:
                keep = t.subscriptions.oldest_needed() if t.subscriptions is not None else None
                for f in self.features:  # a failed read skips this pass
                    keep = retention.earliest(keep, await f.retention_keep(t, p))
                n, entries = await t.write_ledger().apply_retention(max_age, max_size, keep)
                if n:
                    log.info("%s: retention deleted %d ledgers (%d entries)", t.name, n, entries)
        except Exception as exc:  # noqa: BLE001 - retention is retried by the loop
            log.warning("%s: retention skipped: %s", t.name, exc)
        for f in self.features:
            await f.after_retention(t)

    async def disk_policies(self, t: Topic, p=None) -> None:
        """Message TTL, subscription expiry and the backlog quota of `t` (quota.py)."""
        if self.topics.loaded(t.name) is not t:
            return
        try:
            p = p if p is not None else await self.topics.policies(t.name)
            t.set_policies(p)  # also a change the watches missed (another broker's set-policies)
            await quota.apply(t, p)
        except Exception as exc:  # noqa: BLE001 - applied again next interval
            log.warning("%s: disk policies not applied: %s", t.name, exc)

    async def _loop(self) -> None:
        """Once an `interval`: roll quiet ledgers past their age, apply the disk policies
        and retention."""
        while True:
            await asyncio.sleep(self.interval)
            if self.wal_objects is not None:
                try:
                    n = await drop_stale_everywhere(self.topics.store)
                    if n:
                        log.info("deleted the WAL commits of %d ledgers no longer open", n)
                    n = await self.wal_objects.sweep(self.wal_grace_s)
                    if n:
                        log.info("deleted %d WAL objects no commit names", n)
                except Exception as exc:  # noqa: BLE001 - swept again next interval
                    log.warning("WAL objects not swept: %s", exc)
            for t in self.topics.loaded_topics():
                if t.writer is None:
                    await self.disk_policies(t)  # a shadow's ledgers are its source's
                    continue
                try:
                    await t.writer.retry_seals()
                except Exception as exc:  # noqa: BLE001 - retried next interval
                    log.warning("%s: ledgers kept open are not sealed yet: %s", t.name, exc)
                try:
                    await t.writer.roll_if_aged()
                    await self.retain(t)
                except Exception as exc:  # noqa: BLE001 - one topic never stops the loop
                    log.warning("%s: maintenance failed: %s", t.name, exc)
