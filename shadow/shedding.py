"""Load shedding: a shadow broker serving clearly more shadows than the least loaded live
shadow broker gives one up, so a shadow broker that joins the cluster takes its share (as
Pulsar's brokers shed bundles; here by topic count, the measure placement uses).

Every `--load-shedding-interval` seconds (0, the default: off), on a broker with the shadow
role:

- count, from etcd alone, the topics each live shadow broker owns (its ownership records:
  source/metadata/placement.py counts the same);
- when this broker owns at least SHED_MARGIN more than the least loaded other shadow broker,
  unload the loaded shadow here with the fewest durable subscriptions (ties: by name). Its
  cursors are flushed as at any unload; its clients hear `TopicNotOwned` and look it up
  again, and the source's replicator places it again (the least loaded broker);
- refuse to take that shadow back for HOLD_S: its opener here raises `TopicNotOwned`, so a
  replication stream or a client that still comes here goes elsewhere.

One shadow per interval at most, and none while the last one given up is not served
elsewhere yet: the loads are read again before the next one moves.
"""
from __future__ import annotations

import asyncio
import logging
import time

from shadowtopic.broker.feature import BrokerHost
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.metadata import keys
from shadowtopic.metadata.placement import owned_by_broker
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.shadow.ledger import ShadowLedger

log = logging.getLogger(__name__)

SHED_MARGIN = 2    # owned topics above the least loaded other shadow broker
HOLD_S = 30.0      # a shed shadow is not taken back here for this long


class Shedder:
    def __init__(self, host: BrokerHost, role: str, interval: float,
                 margin: int = SHED_MARGIN, hold_s: float = HOLD_S):
        self.host = host
        self.role = role
        self.interval = interval
        self.margin = margin
        self.hold_s = hold_s
        self.shed = 0  # shadows given up (stats, tests)
        self._held: dict[TopicName, float] = {}  # shadow -> when it was given up
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="load shedding")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def refuses(self, topic: TopicName) -> bool:
        """Whether `topic` was given up here less than `hold_s` ago."""
        at = self._held.get(topic)
        if at is None:
            return False
        if time.monotonic() - at >= self.hold_s:
            del self._held[topic]
            return False
        return True

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.once()
            except asyncio.CancelledError:
                raise
            except errors.ShadowTopicError as exc:  # etcd away: the next pass tries again
                log.info("load shedding skipped: %s", exc)
            except Exception:  # noqa: BLE001 - a bug here must not stop the loop
                log.exception("load shedding failed")

    async def once(self) -> TopicName | None:
        """One pass: the shadow given up, if any."""
        session, store = self.host.session, self.host.store
        snap = await store.get_prefix(keys.brokers_prefix(session.cluster))
        peers = [b.broker_id for b in (mpb.BrokerInfo.FromString(kv.value) for kv in snap.items)
                 if self.role in b.roles and b.broker_id != session.broker_id]
        if not peers:
            return None
        owners = await store.get_prefix(keys.ownership_prefix(session.cluster))
        owned_keys = {kv.key for kv in owners.items}
        for topic in [t for t in self._held if self.refuses(t)]:
            if keys.ownership(session.cluster, topic) not in owned_keys:
                return None  # the last one given up is not served elsewhere yet: wait
        owned = owned_by_broker(owners.items)
        mine, least = owned[session.broker_id], min(owned[b] for b in peers)
        if mine - least < self.margin:
            return None
        shadows = [t for t in self.host.topics.loaded_topics()
                   if isinstance(t.ledger, ShadowLedger)]
        if not shadows:
            return None
        victim = min(shadows, key=lambda t: (
            len(t.subscriptions.subs) if t.subscriptions is not None else 0, str(t.name)))
        self._held[victim.name] = time.monotonic()
        log.info("load shedding: %s leaves this broker (it owns %d topics, the least loaded "
                 "shadow broker %d)", victim.name, mine, least,
                 extra={"topic": str(victim.name)})
        await self.host.topics.unload(victim.name, errors.TopicNotOwned(
            f"{victim.name} moved to a less loaded shadow broker; look it up again"))
        self.shed += 1
        return victim.name
