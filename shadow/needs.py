"""What the durable subscriptions of each loaded shadow still need, published in etcd for
the source's retention (policy `retention_keeps_shadow_backlog`, source/ledger/retention.py).

One `NeedsPublisher` per shadow broker; one task, not one per topic or per subscription.
Every `interval` (2 s, at least the cursor flush interval) it walks the shadow topics this
broker serves and, for each, computes `TopicSubscriptions.oldest_needed()` (the first entry
some durable subscription has not acknowledged; None without one). What it publishes is
`to_publish(previous, now)`: the earlier of this tick's value and the last tick's, so

- a need that moves back (a new subscription at `earliest`, a cursor reset) is published
  at once;
- a need that moves forward is published one tick later, once the acknowledgements it
  follows from are in a cursor flush: a shadow broker that crashes restores cursors at
  most one flush old, and what they still need has not been deleted meanwhile.

It is written only when it changes, as ascii "L:E" under `keys.shadow_needs(source,
shadow)` (the source's prefix: deleting the source deletes it; partition i of a shadow
under partition i of its source), and deleted when no durable subscription is left (and
at a topic's first tick when it has none: an older owner may have left one). Each write is
one etcd txn comparing the shadow's ownership value (a deposed owner writes nothing) and
the shadow's info key present (a deleted shadow writes nothing). A refused or failed write
is tried again at the next tick. A need stays in etcd while the shadow is not loaded
anywhere (its subscriptions are durable); it goes with the shadow (shadow/broker.py
removes it when it sees the shadow deleted; the source's retention ignores, and removes,
the needs of shadows it no longer lists).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Protocol

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.ledger.retention import earliest, encode_need
from shadowtopic.metadata import keys
from shadowtopic.metadata.base import Compare, Delete, MetadataStore, MetadataUnavailable, Put

log = logging.getLogger(__name__)

INTERVAL_S = 2.0
WRITES_AT_ONCE = 32   # txns in flight per tick


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: nothing computed / published yet
UNSET = _Unset()


class Subscriptions(Protocol):
    """What a need is computed from (`shadowtopic.subscriptions.TopicSubscriptions`)."""

    @property
    def closed(self) -> errors.ShadowTopicError | None:
        """Why the subscriptions closed (None while open): a closed one publishes nothing."""

    def oldest_needed(self) -> MessageId | None: ...


def to_publish(previous: MessageId | None | _Unset, now: MessageId | None
               ) -> MessageId | None:
    """The need to publish after a tick that computed `now`; `previous` is what the tick
    before computed (UNSET at the first): the earlier of the two (module docstring)."""
    if isinstance(previous, _Unset):
        return now
    return earliest(previous, now)


def must_write(published: MessageId | None | _Unset, value: MessageId | None) -> bool:
    """Whether `value` differs from what is in etcd (UNSET: not known, write it)."""
    return isinstance(published, _Unset) or published != value


@dataclass(eq=False)
class ShadowNeed:
    """One served shadow topic's need."""
    shadow: TopicName
    source: TopicName                     # the shadow's source (partition i for partition i)
    ownership: tuple[str, bytes]          # the shadow's ownership key and value (fence)
    subscriptions: Subscriptions
    previous: MessageId | None | _Unset = UNSET   # computed at the last tick
    published: MessageId | None | _Unset = UNSET  # in etcd, as last written here
    writes: int = 0
    failures: int = 0
    key: str = field(init=False)

    def __post_init__(self) -> None:
        self.key = keys.shadow_needs(self.source, self.shadow)

    def step(self) -> tuple[bool, MessageId | None]:
        """Compute this tick's need: (whether to write, the value to publish)."""
        now = self.subscriptions.oldest_needed()
        value = to_publish(self.previous, now)
        self.previous = now
        return must_write(self.published, value), value


class NeedsPublisher:
    def __init__(self, store: MetadataStore, interval: float = INTERVAL_S):
        self.store = store
        self.interval = interval
        self.needs: dict[TopicName, ShadowNeed] = {}
        self._task: asyncio.Task | None = None

    def track(self, shadow: TopicName, source: TopicName, ownership: tuple[str, bytes],
              subscriptions: Subscriptions) -> ShadowNeed:
        """Publish the need of `shadow` (loaded here) from the next tick on."""
        need = self.needs[shadow] = ShadowNeed(shadow, source, ownership, subscriptions)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                 name="shadow needs")
        return need

    def untrack(self, need: ShadowNeed) -> None:
        """Stop publishing (the topic unloads here; what is in etcd stays)."""
        if self.needs.get(need.shadow) is need:
            del self.needs[need.shadow]

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def tick(self) -> int:
        """One pass over the tracked shadows; returns how many needs were written."""
        todo = []
        for need in list(self.needs.values()):
            if need.subscriptions.closed is not None:
                continue
            write, value = need.step()
            if write:
                todo.append((need, value))
        written = 0
        for i in range(0, len(todo), WRITES_AT_ONCE):
            done = await asyncio.gather(*(self.write(n, v) for n, v in
                                          todo[i:i + WRITES_AT_ONCE]))
            written += sum(done)
        return written

    async def write(self, need: ShadowNeed, value: MessageId | None) -> bool:
        """Put (or delete, None) the need, fenced; True when written."""
        own_key, own_value = need.ownership
        op = Put(need.key, encode_need(value)) if value is not None else Delete(need.key)
        try:
            res = await self.store.txn(
                [Compare(own_key, "value", "==", own_value),
                 Compare(keys.topic_info(need.shadow), "version", ">", 0)], [op])
        except MetadataUnavailable as exc:
            need.failures += 1
            log.info("%s: need not published: %s", need.shadow, exc)
            return False
        if not res.succeeded:  # not owned here any more, or deleted: it unloads soon
            need.failures += 1
            log.info("%s: need not published (ownership moved or shadow deleted)",
                     need.shadow)
            return False
        need.published = value
        need.writes += 1
        return True

    async def _run(self) -> None:
        while self.needs:
            await asyncio.sleep(self.interval)
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the next tick tries again
                log.exception("publishing shadow needs failed")
        # nothing tracked: `track` starts the task again
