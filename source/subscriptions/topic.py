"""`TopicSubscriptions`: every durable subscription of one topic a broker serves.

It holds the subscriptions by name (subscription.py), the topic's dispatch groups for them
(a `TopicReaders` of the read engine, owned here), the cursor flusher (one task per topic:
changed cursors are saved in one batch per interval, source/cursors/) and the subscription
metadata writer (meta.py). It is built over a `LedgerView`, so a shadow broker uses it
unchanged over its own view. Everything a consumer or an admin does to a subscription
comes through here: subscribe, flow, ack, nack, seek, unsubscribe; create, delete, reset,
skip, clear-backlog, peek, stats; and what retention must keep (`oldest_needed`).

`read_compacted` (Exclusive and Failover only, as in Pulsar; Shared and Key_Shared are
refused with `InvalidArgument`): such a subscription reads the topic's `CompactedView`
(compaction/view.py) through a second `TopicReaders` (its `Reading`: `reading(True)`). The
first consumer to attach decides how a subscription reads; one that reads the other way is
refused (`ConsumerBusy`) while consumers are attached. Its cursor moves by the compacted
view (its sparse `next_after`: ids compacted away count as absent, so acknowledging each
survivor leaves no holes), raw trims do not move it, and retention keeps for it only the raw
ledgers after the horizon. The flag is stored in the SubscriptionMeta (written again when a
first consumer reads the other way), so a subscription without consumers keeps reading the
compacted view across a reload: `load` opens that view when a stored subscription needs it.

Restart (C4, docs/BEHAVIOURS.md): `load` reads the subscription metas and the cursor snapshot; a
subscription resumes at its first unacknowledged entry, skipping entries acknowledged
individually above it. At most one flush interval of acknowledgements is lost to a crash:
those entries are delivered again; nothing unacknowledged is skipped. A change whose answer
says it is done is durable before that answer (C4a, issue 29): reset-cursor (by id or time),
a consumer's seek, skip and clear-backlog write the one cursor at once (`_persist`:
`CursorFlusher.persist`, concurrent ones share a write); a created subscription is durable
with its meta (its starting position), a deleted one with its meta's deletion. A consumer
attaching or the last one detaching marks the cursor changed too (its `last_active`,
subscription.py), so a subscription left without consumers keeps its detach time across
restarts and moves; one loaded without a persisted time (saved while a consumer was
attached) counts from its first load, saved too.
"""
from __future__ import annotations

import asyncio
import datetime
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import Policies
from shadowtopic.cursors.flusher import CursorFlusher
from shadowtopic.cursors.state import CursorState, NextAfter, next_after_in, pack
from shadowtopic.cursors.store import CursorStore, Fence
from shadowtopic.ledger.view import CompactedReads, LedgerView, ReadEntry, Trimmed
from shadowtopic.metadata.base import MetadataStore
from shadowtopic.read.encodings import EncodingsPool
from shadowtopic.read.engine import Counters, TopicReaders
from shadowtopic.read.positions import MESSAGE_ID, PUBLISH_TIME, Start, resolve
from shadowtopic.subscriptions import expiry
from shadowtopic.subscriptions.cohorts import Cohort, Cohorts
from shadowtopic.subscriptions.consumer import ConsumerOutbox, CursorMoved, SubConsumer
from shadowtopic.subscriptions.dispatcher import EXCLUSIVE
from shadowtopic.subscriptions.meta import MetaWriter, SubscriptionMeta
from shadowtopic.subscriptions.subscription import DISPATCHERS, Reading, Subscription

log = logging.getLogger(__name__)
#: a consumer of one of a topic's subscriptions
Consumer = SubConsumer[Subscription]

STATS_CACHE_SUBS = 1000   # past this many subscriptions, stats are reused ...
STATS_MAX_AGE_S = 1.0     # ... for this long


def _iso(epoch_s: float) -> str:
    return datetime.datetime.fromtimestamp(epoch_s, datetime.UTC).isoformat()


@dataclass(frozen=True)
class Change:
    """What a destructive call did, or with `dry_run` would do."""
    mark_delete: MessageId
    backlog: int
    acked: int
    consumers: int
    dry_run: bool


class TopicSubscriptions:
    def __init__(self, topic: TopicName, view: LedgerView, metadata: MetadataStore,
                 cursors: CursorStore, fence: Fence, policies: Callable[[], Policies],
                 counters: Counters, flush_interval: float = 1.0,
                 encodings: EncodingsPool | None = None):
        self.topic = topic
        self.view = view
        self.policies = policies
        self.out = counters
        self.next_after: NextAfter = next_after_in(view)
        self.encodings = encodings if encodings is not None else EncodingsPool()
        self.readers: TopicReaders[Subscription] = TopicReaders(self, topic, view,
                                                                self.encodings)
        self._reading: Reading[LedgerView] = Reading(view, self.next_after, self.readers)
        #: the compacted view, how ids follow each other in it and its dispatch groups, for
        #: subscriptions read with read_compacted (set by `use_compacted` before the first
        #: such consumer attaches)
        self._compacted: Reading[CompactedReads] | None = None
        self.flusher = CursorFlusher(cursors, topic, fence, flush_interval)
        self.metas = MetaWriter(metadata, topic, fence)
        self.cursors = cursors
        self.subs: dict[str, Subscription] = {}
        #: subscriptions whose cursors are equal share one (cohorts.py)
        self.cohorts: Cohorts[Subscription] = Cohorts()
        self._creating: dict[str, asyncio.Future] = {}
        self._seq = itertools.count(1)
        self._rates: dict[str, tuple[float, int, int]] = {}
        self._stats: tuple[float, dict[str, dict]] | None = None  # (when, figures)
        #: names without a subscription whose cursor the store may still hold (deleted
        #: ones; not every live name: 100,000 of them would cost ~100 bytes each)
        self._stored: set[str] = set()
        self.closed: errors.ShadowTopicError | None = None
        view.add_listener(self)

    async def load(self, compacted: Callable[[], Awaitable[CompactedReads]] | None = None
                   ) -> TopicSubscriptions:
        """Read the subscriptions and their cursors. `compacted` opens the topic's compacted
        view, asked for only when a stored subscription reads it (without it, such a
        subscription loads as a plain one)."""
        metas = await self.metas.load()
        if compacted is not None and any(m.read_compacted for m in metas.values()):
            self.use_compacted(await compacted())
        states = await self.cursors.load(self.topic)
        # a cursor without a persisted last activity (saved while a consumer was attached,
        # or by an older broker) gets the load time, saved so later loads keep counting
        unknown = []
        loaded_ms = int(time.time() * 1000)  # one time for all: equal cursors stay equal
        for name, meta in metas.items():
            state = states.pop(name, None) or CursorState.starting_at(meta.initial_position)
            if not state.last_active:
                unknown.append(name)
                state.last_active = loaded_ms
            sub = Subscription(self, name, meta.type, state, meta.created_ms)
            sub.compacted = meta.read_compacted and self.compacted is not None
            self.subs[name] = sub
            self.cohorts.settle(sub)  # equal cursors load as one cohort
        self.flusher.start()
        self.flusher.mark_many([(name, self.subs[name].cursor) for name in unknown])
        for name in states:  # a cursor whose subscription was deleted before it was saved
            self.flusher.remove(name)
        self._stored = set(states)
        return self

    # ---- read-engine Owner and ViewListener ------------------------------------------------

    def rehome(self, tr: TopicReaders) -> None:
        """The view closed: consumers hear it (they subscribe again to the reloaded topic)."""
        self._drop_all(errors.TopicNotOwned(f"{self.topic} was unloaded; subscribe again"))

    def fail(self, member: Subscription, error: errors.ShadowTopicError) -> None:
        for c in list(member.consumers):
            member.detach(c)
            c.outbox.send_error(c.handle, error)

    def counters(self, topic: TopicName) -> Counters:
        return self.out

    def on_entries(self) -> None:
        pass  # the dispatch groups listen for themselves

    def on_trimmed(self, trimmed: Trimmed) -> None:
        """Ledgers were deleted (retention, truncate): cursors move past them."""
        gone = {r.ledger_id for r in trimmed.ledgers}
        skipped: dict[int, int] = {}  # a cohort's cursor moves once
        for sub in list(self.subs.values()):
            if sub.compacted:
                continue  # its view serves the compacted prefix without the raw ledgers
            sub.trimmed(trimmed.ledgers, gone, skipped)
            self.changed(sub)

    def on_closed(self, reason: errors.ShadowTopicError) -> None:
        pass  # the dispatch groups call `rehome`

    # ---- consumers -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed is not None:
            raise self.closed

    @property
    def compacted(self) -> CompactedReads | None:
        """The compacted view read_compacted subscriptions read (None until opened)."""
        return self._compacted.view if self._compacted is not None else None

    def use_compacted(self, view: CompactedReads) -> None:
        """Serve `read_compacted` consumers from `view` (the topic's CompactedView)."""
        if self._compacted is None:
            readers: TopicReaders[Subscription] = TopicReaders(self, self.topic, view,
                                                               self.encodings)
            self._compacted = Reading(view, next_after_in(view, sparse=True), readers)

    def reading(self, compacted: bool) -> Reading[LedgerView]:
        """What a subscription reads: the topic's view, or with `compacted` the compacted
        one (a subscription reads it only once `use_compacted` opened it)."""
        return self._compacted_reading() if compacted else self._reading

    def _compacted_reading(self) -> Reading[CompactedReads]:
        if self._compacted is None:
            raise errors.Internal(f"{self.topic}: no compacted view to read")
        return self._compacted

    async def subscribe(self, outbox: ConsumerOutbox, handle: int, name: str, type_: str,
                        start: Start, consumer_name: str = "", priority: int = 0,
                        address: str = "", read_compacted: bool = False
                        ) -> tuple[Consumer, bool, MessageId]:
        """Attach a consumer, creating the subscription at `start` if it does not exist.
        Returns the consumer, whether it was created, and where it will read. A
        `read_compacted` consumer (Exclusive or Failover, as in Pulsar) reads the compacted
        view; consumers of one subscription all read it the same way (the first decides)."""
        self._check_open()
        if read_compacted:
            kind = DISPATCHERS.get(type_)
            if kind is None or not kind.reads_compacted:  # refused before anything is created
                raise errors.InvalidArgument(
                    f"read_compacted needs an Exclusive or Failover subscription, not {type_}")
            if self.compacted is None:
                raise errors.Internal(f"{self.topic}: no compacted view to read")
        sub, created = self.subs.get(name), False
        if sub is None:
            sub, created = await self._create(name, type_, start, must_be_new=False,
                                              compacted=read_compacted)
        elif not sub.consumers and sub.compacted != read_compacted:
            await self._store_compacted(name, read_compacted)  # the first consumer decides
        self._check_open()
        if self.subs.get(name) is not sub:
            raise errors.SubscriptionNotFound(f"subscription {name} was deleted meanwhile")
        sub.check_attach(type_, self.policies().max_consumers or 0, read_compacted)
        c: Consumer = SubConsumer(handle, outbox, consumer_name, priority, next(self._seq),
                                  address)
        if not sub.consumers and sub.compacted != read_compacted:
            self.cohorts.own(sub)  # its cursor moves by the other view from now on
            sub.compacted = read_compacted
            self.changed(sub)
        sub.attach(c, type_)
        return c, created, sub.position

    def flow(self, c: Consumer, permits: int) -> None:
        c.permits += permits
        if c.sub is not None and c.sub.topic is not None:
            c.sub.topic.wake()

    def ack(self, c: Consumer, ids: list[MessageId], cumulative: bool) -> None:
        self.ack_packed(c, [pack(m) for m in ids], cumulative)

    def ack_packed(self, c: Consumer, ps: list[int], cumulative: bool,
                   ranges: list[tuple[int, int]] | tuple[()] = ()) -> None:
        """`ack` of packed positions (`shadowtopic.cursors.state.pack`) and inclusive packed
        `(first, last)` ranges of one ledger each, as the service sends."""
        self._live(c).ack(c, ps, cumulative, ranges)

    async def persist_acks(self, c: Consumer) -> None:
        """Write the cursor of `c`'s subscription now, with the acks applied so far (an
        ack that wants a receipt); concurrent calls share a write (`_persist`). Still
        written when `c` closed after its ack."""
        if c.sub is None:
            raise errors.AlreadyClosed("consumer is closed")
        await self._persist(c.sub)

    def ack_many(self, consumers: list[Consumer], ps: list[int], cumulative: bool,
                 ranges: list[tuple[int, int]] | tuple[()] = ()
                 ) -> list[tuple[Consumer, Exception]]:
        """`ack_packed` of the same positions by many consumers (one broadcast message
        acknowledged by thousands of subscriptions); returns those that failed, with why.
        The common case (Exclusive subscriptions acknowledging one entry, nothing held,
        nothing counted) goes by cohort (cohorts.py): a cohort whose members all
        acknowledge moves its one cursor; the members of a cohort that do, when not all
        do, leave it together on a copy that moves."""
        failed: list[tuple[Consumer, Exception]] = []
        end = pack(self.view.next_position())
        one = (ps[0] if len(ps) == 1 and not cumulative and not ranges and ps[0] < end
               else None)
        lone: list[Subscription] = []
        grouped: dict[Cohort[Subscription], set[Subscription]] = {}
        last: Cohort[Subscription] | None = None  # the cohort of the one before (most often)
        acking: set[Subscription] = set()
        for c in consumers:
            sub = c.sub
            try:
                if c.closed or sub is None:
                    raise errors.AlreadyClosed("consumer is closed")
                d = sub.dispatcher
                if one is not None and not (sub.counts or d.holder or d.redo):
                    co = sub.cohort
                    if co is None:
                        lone.append(sub)
                    else:
                        if co is not last:
                            last = co
                            acking = grouped.setdefault(co, set())
                        acking.add(sub)
                else:
                    sub.ack(c, ps, cumulative, ranges)
            except Exception as exc:  # noqa: BLE001 - per consumer: the others go on
                failed.append((c, exc))
        if one is not None and (lone or grouped):
            self._ack_one(one, lone, grouped)
        return failed

    def _ack_one(self, one: int, lone: list[Subscription],
                 grouped: dict[Cohort[Subscription], set[Subscription]]) -> None:
        """`ack_many`'s common case: every subscription of `lone` (each holding its cursor
        alone) and of `grouped` (by cohort) acknowledges packed position `one`."""
        # how cursors move (by the topic's view, or by the compacted view: `read_compacted`)
        # and the first position after each mark-delete by it: asked once for all the
        # cursors at one mark-delete
        moves = {False: self._reading.next_after}
        if self._compacted is not None:
            moves[True] = self._compacted.next_after
        else:  # (no subscription reads it: none is compacted)
            moves[True] = self._reading.next_after
        after: dict[bool, dict[int, int]] = {False: {}, True: {}}
        cohorts = self.cohorts
        # holders (cohorts or lone subscriptions) whose members are marked changed: those
        # that moved, and those on a new cursor object (rule 2 of cohorts.py)
        changed: list[Cohort[Subscription] | Subscription] = []
        for co, acking in grouped.items():
            holder: Cohort[Subscription] | Subscription
            if acking == co.members:
                holder, state = co, cohorts.moving(co)
            else:
                still = acking & co.members
                lone += acking - still  # (left it meanwhile: each on its own below)
                if not still:
                    continue
                holder = cohorts.split(co, still)
                state = holder.state if isinstance(holder, Cohort) else holder.cursor
                changed.append(holder)
            if state.ack_one(one, moves[co.compacted], after[co.compacted]):
                if holder is co:
                    changed.append(co)
            elif holder is co:
                cohorts.settle(co)  # it did not move: indexed again where it is
        for sub in lone:
            shared = sub.cohort is not None  # (joined one meanwhile: leaves on a copy)
            state = cohorts.own(sub)
            if state.ack_one(one, moves[sub.compacted], after[sub.compacted]) or shared:
                changed.append(sub)
            else:
                cohorts.settle(sub)
        if not changed or self.closed is not None:
            return
        for holder in changed:
            if isinstance(holder, Cohort):
                self.flusher.mark_all([m.name for m in holder.members], holder.state)
            else:
                self.flusher.mark(holder.name, holder.cursor)
            # (members joining another cohort need no mark: the object they leave never
            # moves again, and holds what they hold)
            cohorts.settle(holder)

    def nack(self, c: Consumer, ids: list[MessageId], delay_ms: int) -> None:
        sub = self._live(c)
        if delay_ms <= 0:
            sub.nacked(c, ids)
        else:
            asyncio.get_running_loop().call_later(delay_ms / 1000, sub.nacked, c, ids)

    def redeliver(self, c: Consumer) -> None:
        self._live(c).redeliver_all(c)

    def close_consumer(self, c: Consumer) -> None:
        if c.sub is not None:
            c.sub.detach(c)

    async def seek(self, c: Consumer, start: Start) -> tuple[MessageId, bool]:
        sub = self._live(c)
        return await self._reset(sub, start, dry_run=False, seeker=c)

    async def unsubscribe(self, c: Consumer) -> None:
        sub = self._live(c)
        others = [o for o in sub.consumers if o is not c]
        if others:
            raise errors.ConsumerBusy(f"subscription {sub.name} has {len(others)} other "
                                      "connected consumers")
        await self._delete(sub, leaving=c)

    def _live(self, c: Consumer) -> Subscription:
        if c.closed or c.sub is None:
            raise errors.AlreadyClosed("consumer is closed")
        return c.sub

    def changed(self, sub: Subscription) -> None:
        """`sub`'s cursor changed: it joins a cohort at its new position if there is one;
        saved with the next flush."""
        if self.subs.get(sub.name) is sub and self.closed is None:
            self.flusher.mark(sub.name, sub.cursor)
            self.cohorts.settle(sub)

    async def _persist(self, sub: Subscription) -> None:
        """`sub`'s cursor changed on a call that answers done: write this one cursor now,
        before the answer (not with the next flush; not a flush of the topic's cursors)."""
        self._check_open()
        if self.subs.get(sub.name) is not sub:
            raise errors.SubscriptionNotFound(f"subscription {sub.name} was deleted meanwhile")
        await self.flusher.persist(sub.name, sub.cursor)

    def activity(self, sub: Subscription) -> None:
        """`sub`'s first consumer came or its last one left (its cursor's last_active):
        saved with the next flush like a changed cursor, but never raising: consumers
        detach while a topic closes, and a closed or fenced flusher saves nothing more (the
        next owner counts from its load)."""
        try:
            self.changed(sub)
        except errors.ShadowTopicError:
            pass

    # ---- lifecycle of subscriptions --------------------------------------------------------

    async def _store_compacted(self, name: str, read_compacted: bool) -> None:
        meta = await self.metas.get(name)
        if meta is not None and meta.read_compacted != read_compacted:
            await self.metas.put(replace(meta, read_compacted=read_compacted))

    async def _create(self, name: str, type_: str, start: Start, must_be_new: bool,
                      compacted: bool = False) -> tuple[Subscription, bool]:
        """(`compacted`: for a read_compacted consumer: `start` resolves in the compacted
        view, whose `earliest` is the first compacted entry.)"""
        while name in self._creating:
            await asyncio.shield(self._creating[name])
        sub = self.subs.get(name)
        if sub is not None:
            if must_be_new:
                raise errors.SubscriptionAlreadyExists(
                    f"subscription {name} of {self.topic} already exists")
            return sub, False
        limit = self.policies().max_subscriptions or 0
        if limit and len(self.subs) + len(self._creating) >= limit:
            raise errors.TooManySubscriptions(
                f"{self.topic} has {len(self.subs)} subscriptions (max_subscriptions {limit})")
        done = asyncio.get_running_loop().create_future()
        self._creating[name] = done
        try:
            position = await resolve(self.reading(compacted).view, start)
            created_ms = int(time.time() * 1000)
            await self.metas.put(SubscriptionMeta(name, type_, created_ms, position, compacted))
            self._check_open()
            sub = Subscription(self, name, type_, CursorState.starting_at(position), created_ms)
            self.subs[name] = sub
            self.changed(sub)
            if name in self._stored:
                # a deleted subscription's cursor may still be stored: overwrite it before
                # answering, or a crash now would give the new subscription the old cursor
                await self._persist(sub)
                self._stored.discard(name)
            return sub, True
        finally:
            del self._creating[name]
            done.set_result(None)

    async def create(self, name: str, start: Start) -> Subscription:
        self._check_open()
        sub, _ = await self._create(name, EXCLUSIVE, start, must_be_new=True)
        return sub

    def get(self, name: str) -> Subscription:
        sub = self.subs.get(name)
        if sub is None:
            raise errors.SubscriptionNotFound(f"subscription {name} of {self.topic} "
                                              "does not exist")
        return sub

    async def delete(self, name: str, force: bool, dry_run: bool) -> Change:
        sub = self.get(name)
        n = len(sub.consumers)
        if n and not force:
            raise errors.ConsumerBusy(f"subscription {name} has {n} connected consumers; "
                                      "use force to disconnect them")
        change = Change(sub.cursor.mark_delete, self.backlog(sub), 0, n, dry_run)
        if not dry_run:
            await self._delete(sub)
        return change

    async def _delete(self, sub: Subscription, leaving: Consumer | None = None) -> None:
        """Delete `sub`; its consumers hear it, except `leaving` (it unsubscribed)."""
        await self.metas.delete(sub.name)
        if self.subs.get(sub.name) is sub:
            del self.subs[sub.name]
            self.cohorts.drop(sub)
            self.flusher.remove(sub.name)
            self._stored.add(sub.name)
            self._rates.pop(sub.name, None)
        gone = errors.SubscriptionNotFound(f"subscription {sub.name} was deleted")
        for c in list(sub.consumers):
            sub.detach(c)
            if c is not leaving:
                c.outbox.send_error(c.handle, gone)

    # ---- admin -----------------------------------------------------------------------------

    async def landing(self, start: Start, view: LedgerView | None = None
                      ) -> tuple[MessageId, bool]:
        """Where a reset to `start` lands in `view` (the topic's view by default; a
        read_compacted subscription's is the compacted one), and whether it was clamped
        (before the first entry or after the last)."""
        view = view or self.view
        position = await resolve(view, start)
        first, end = view.first_position(), view.next_position()
        position = min(position, end)
        if start.kind == MESSAGE_ID and start.message_id is not None:  # (resolve refused None)
            asked = start.message_id
            asked = MessageId(asked.ledger_id, asked.entry_id)
            clamped = (first is not None and asked < first) or asked > end
        elif start.kind == PUBLISH_TIME:
            clamped = position == end and start.publish_ms > 0
            if not clamped and first is not None and position == first:
                head = await view.read(first, 1, 1 << 20)
                clamped = bool(head) and start.publish_ms < head[0].publish_ms
        else:
            clamped = False
        return position, clamped

    async def reset_cursor(self, name: str, start: Start, dry_run: bool
                           ) -> tuple[MessageId, bool]:
        return await self._reset(self.get(name), start, dry_run, seeker=None)

    async def _reset(self, sub: Subscription, start: Start, dry_run: bool,
                     seeker: Consumer | None) -> tuple[MessageId, bool]:
        position, clamped = await self.landing(start, sub.view)
        if dry_run:
            return position, clamped
        sub.reset(position)
        await self._persist(sub)
        for c in sub.consumers:
            c.outbox.send_notice(c.handle, CursorMoved(position, clamped, c is not seeker))
        return position, clamped

    async def skip(self, name: str, count: int, dry_run: bool) -> Change:
        sub = self.get(name)
        cursor = sub.own() if not dry_run else sub.cursor.copy()
        next_after = sub.next_after
        ids: list[MessageId] = []
        p, end = cursor.read_position(next_after), self.view.next_position()
        while len(ids) < count and p < end:
            if not cursor.is_acked(p):
                ids.append(p)
            nxt = next_after(p)
            if nxt <= p:
                break
            p = nxt
        cursor.ack(ids, next_after)
        if not dry_run:
            sub.acked_by_admin()
            await self._persist(sub)
        return Change(cursor.mark_delete, self._backlog_of(cursor, sub.view), len(ids),
                      len(sub.consumers), dry_run)

    async def clear_backlog(self, name: str, dry_run: bool) -> Change:
        sub = self.get(name)
        before = self.backlog(sub)
        cursor = sub.own() if not dry_run else sub.cursor.copy()
        last = self.view.last_confirmed()
        if last is not None:
            cursor.ack_cumulative(last, sub.next_after)
        if not dry_run:
            sub.acked_by_admin()
            await self._persist(sub)
        after = self._backlog_of(cursor, sub.view)
        return Change(cursor.mark_delete, after, before - after, len(sub.consumers), dry_run)

    async def peek(self, name: str, count: int) -> list[ReadEntry]:
        """The first `count` unacknowledged entries, without moving anything."""
        sub = self.get(name)
        view = sub.view
        out: list[ReadEntry] = []
        p = sub.cursor.read_position(sub.next_after)
        while len(out) < count and p < view.next_position():
            got = await view.read(p, min(500, count - len(out) + sub.cursor.holes * 64), 4 << 20)
            if not got:
                nxt = view.valid_position(p)
                if nxt <= p:
                    break
                p = nxt
                continue
            out += [e for e in got if not sub.cursor.is_acked(MessageId(e.ledger_id, e.entry_id))]
            p = view.valid_position(MessageId(got[-1].ledger_id, got[-1].entry_id + 1))
        return out[:count]

    # ---- numbers ---------------------------------------------------------------------------

    def _backlog_of(self, cursor: CursorState, view: LedgerView | None = None) -> int:
        view = view or self.view
        return cursor.backlog(view.entries_between, view.next_position())

    def backlog(self, sub: Subscription) -> int:
        return self._backlog_of(sub.cursor, sub.view)

    def connected(self) -> int:
        """Consumers attached to any subscription of the topic."""
        return sum(len(s.consumers) for s in self.subs.values())

    def oldest_needed(self) -> MessageId | None:
        """The first entry some durable subscription has not acknowledged (retention keeps
        its ledger and every later one); None without subscriptions."""
        if not self.subs:
            return None
        raw = [s.cursor.mark_delete for s in self.subs.values() if not s.compacted]
        need = self.next_after(min(raw)) if raw else None
        compacted = [s.cursor.mark_delete for s in self.subs.values() if s.compacted]
        if compacted:  # what the compacted ledger serves needs no raw ledger (K15)
            reading = self._compacted_reading()
            mine = reading.view.raw_needed(reading.next_after(min(compacted)))
            need = mine if need is None else min(need, mine)
        return need

    def stats(self) -> dict[str, dict]:
        """Per subscription, Pulsar's numbers (snake_case of its names). A topic with more
        than STATS_CACHE_SUBS subscriptions answers from the figures computed at most
        STATS_MAX_AGE_S ago (Pulsar serves stats computed on a timer too): stats polled
        by many callers do not walk 100,000 subscriptions each time."""
        now = time.monotonic()
        cached = self._stats
        if cached is not None and len(self.subs) > STATS_CACHE_SUBS \
                and now - cached[0] < STATS_MAX_AGE_S:
            return cached[1]
        out = self._stats_now(now)
        self._stats = (now, out)
        return out

    def _stats_now(self, now: float) -> dict[str, dict]:
        out = {}
        for name, sub in self.subs.items():
            t0, out0, red0 = self._rates.get(name, (now, sub.msg_out, sub.redelivered))
            dt = now - t0
            self._rates[name] = (now, sub.msg_out, sub.redelivered)
            rate = (sub.msg_out - out0) / dt if dt > 0 else 0.0
            consumers: list[dict[str, object]] = []
            d = sub.dispatcher
            unacked = 0
            for c in sub.consumers:
                n = d.unacked(c)
                unacked += n
                consumers.append(dict(
                    consumer_name=c.name, available_permits=max(0, c.permits),
                    unacked_messages=n, address=c.address,
                    connected_since=_iso(c.since), is_active=bool(c.active),
                    key_hash_ranges=[f"[{a}, {b}]" for a, b in d.ranges(c)]))
            out[name] = dict(
                type=sub.type, msg_backlog=self.backlog(sub), msg_rate_out=rate,
                backlog_size=expiry.backlog_bytes(sub),
                msg_rate_redeliver=(sub.redelivered - red0) / dt if dt > 0 else 0.0,
                unacked_messages=unacked, durable=True,
                consumers=consumers, skipped_entries=sub.skipped,
                mark_delete_position=str(sub.cursor.mark_delete),
                read_position=str(sub.position), individually_acked_ranges=sub.cursor.holes,
                msg_out_counter=sub.msg_out, msg_redeliver_counter=sub.redelivered,
                active_consumer=d.active.name if d.active is not None else "",
                msg_expired=sub.expired, msg_evicted=sub.evicted,
                last_active=sub.last_active,
                backlog_quota_exceeded=sub.over_quota)
        return out

    # ---- close -----------------------------------------------------------------------------

    def _drop_all(self, error: errors.ShadowTopicError) -> None:
        for sub in self.subs.values():
            for c in list(sub.consumers):
                sub.detach(c)
                c.outbox.send_error(c.handle, error)

    async def close(self, error: errors.ShadowTopicError | None = None, flush: bool = True
                    ) -> None:
        """Consumers hear `error`; changed cursors are flushed (unless fenced, or not
        `flush`: the topic is being deleted)."""
        if self.closed is not None:
            return
        self.closed = error or errors.TopicNotOwned(f"{self.topic} was unloaded; subscribe again")
        self._drop_all(self.closed)
        self.view.remove_listener(self)
        self.view.remove_listener(self.readers)
        if self._compacted is not None:
            self._compacted.view.remove_listener(self._compacted.readers)
        if not flush:
            self.flusher.discard()
        try:
            await self.flusher.close()
        except errors.ShadowTopicError as exc:
            log.warning("%s: cursors not flushed at close: %s", self.topic, exc)
        self.cursors.forget(self.topic)

