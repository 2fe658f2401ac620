"""Load shedding: a broker serving clearly more topics of a role than the least loaded live
broker of that role gives one up, so a broker that joins the cluster takes its share (as
Pulsar's brokers shed bundles; here by topic count, the measure placement uses:
source/metadata/placement.py).

Every `--load-shedding-interval` seconds (0, the default: off), per role the broker sheds
for (shadow/feature.py: shadows on a shadow broker; source/broker/server.py: source topics
on a source broker with the WAL on object storage, among such brokers, since only they can
take each other's open ledgers):

- count, from etcd alone, the topics each live broker owns (its ownership records);
- when this broker owns at least SHED_MARGIN more than the least loaded other broker of the
  role (`peer` says which count), unload the `victims()` topic with the fewest durable
  subscriptions (ties: by name). Its cursors are flushed and its ledger closed as at any
  unload; its clients hear `TopicNotOwned` and look it up again;
- hold it (the session's `HeldTopics`, source/broker/held.py): for HOLD_S this broker
  neither opens it again nor names itself for it in a lookup, so a client (or a shadow's
  replicator) that still comes here goes to another broker.

One topic per interval at most, and none while the last one given up is not served
elsewhere yet: the loads are read again before the next one moves.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from shadowtopic.broker.feature import BrokerHost
from shadowtopic.broker.topic import Topic
from shadowtopic.core import errors
from shadowtopic.core.names import TopicName
from shadowtopic.metadata import keys
from shadowtopic.metadata.placement import owned_by_broker
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

log = logging.getLogger(__name__)

SHED_MARGIN = 2    # owned topics above the least loaded other broker of the role


class Shedder:
    def __init__(self, host: BrokerHost, role: str, interval: float,
                 victims: Callable[[], list[Topic]],
                 peer: Callable[[mpb.BrokerInfo], bool] = lambda b: True,
                 margin: int = SHED_MARGIN):
        self.host = host
        self.role = role
        self.interval = interval
        self.margin = margin
        self.shed = 0  # topics given up (stats, tests)
        self._victims = victims
        self._peer = peer
        self._mine: set[TopicName] = set()  # what this shedder gave up (its role's)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.interval > 0:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"load shedding ({self.role})")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

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
        """One pass: the topic given up, if any."""
        session, store = self.host.session, self.host.store
        held = session.held
        snap = await store.get_prefix(keys.brokers_prefix(session.cluster))
        peers = [b.broker_id for b in (mpb.BrokerInfo.FromString(kv.value) for kv in snap.items)
                 if self.role in b.roles and b.broker_id != session.broker_id and self._peer(b)]
        if not peers:
            return None
        owners = await store.get_prefix(keys.ownership_prefix(session.cluster))
        owned_keys = {kv.key for kv in owners.items}
        self._mine &= set(held.held())
        for topic in self._mine:
            if keys.ownership(session.cluster, topic) not in owned_keys:
                return None  # the last one given up is not served elsewhere yet: wait
        owned = owned_by_broker(owners.items)
        mine, least = owned[session.broker_id], min(owned[b] for b in peers)
        if mine - least < self.margin:
            return None
        victims = self._victims()
        if not victims:
            return None
        victim = min(victims, key=lambda t: (
            len(t.subscriptions.subs) if t.subscriptions is not None else 0, str(t.name)))
        held.hold(victim.name)
        self._mine.add(victim.name)
        log.info("load shedding: %s leaves this broker (it owns %d topics, the least loaded "
                 "%s broker %d)", victim.name, mine, self.role, least,
                 extra={"topic": str(victim.name)})
        await self.host.topics.unload(victim.name, errors.TopicNotOwned(
            f"{victim.name} moved to a less loaded {self.role} broker; look it up again"))
        self.shed += 1
        return victim.name
