"""Disk policies over the subscription engine, in-process: message TTL, backlog quota
(measurement and consumer_backlog_eviction), subscription expiry (source/subscriptions/
expiry.py), the produce gate of the backlog quota (source/broker/quota.py), the policy
fields and their CLI flags. On the in-memory view and, where publish times matter, on the
source's ManagedLedger."""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import subscriptions_harness
from support.fakes import Outbox

from shadowtopic.broker import quota
from shadowtopic.cli import commands
from shadowtopic.cli.main import build_parser
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.core.policies import DEFAULTS, BacklogQuotaAction, Policies
from shadowtopic.ledger.memory_view import MemoryView
from shadowtopic.ledger.view import LedgerRange
from shadowtopic.pb.v1 import common_pb2
from shadowtopic.read.positions import EARLIEST, Start
from shadowtopic.subscriptions import EXCLUSIVE, expiry

TOPIC = TopicName.parse("persistent://t/ns/disk-policies")
ENTRY = 100  # bytes each entry counts for in SizedView


class SizedView(MemoryView):
    """A MemoryView whose ledgers report their size (ENTRY bytes an entry), as the
    managed ledger's do."""

    def ranges(self) -> list[LedgerRange]:
        return [LedgerRange(r.ledger_id, r.entries, r.sealed, r.entries * ENTRY)
                for r in super().ranges()]

    def age(self, ledger_index: int, seconds: float) -> None:
        """Make the entries of the ledger at `ledger_index` `seconds` old."""
        lid, entries, sealed = self._ledgers[ledger_index]
        old = int((time.time() - seconds) * 1000)
        self._ledgers[ledger_index] = (lid, [(old, r) for _, r in entries], sealed)


def raws(n: int, prefix: str = "m") -> list[bytes]:
    return [common_pb2.Message(payload=f"{prefix}{i}".encode()).SerializeToString()
            for i in range(n)]


class Harness(subscriptions_harness.Harness):
    """The shared harness on this module's topic, with SizedView as its in-memory view and the
    default policies."""

    topic = TOPIC
    memory_view = SizedView

    def __init__(self, kind: str, tmp_path):
        super().__init__(kind, tmp_path)
        self.policies = DEFAULTS


def run(coro):
    return asyncio.run(coro)


def now_ms() -> int:
    return int(time.time() * 1000)


async def attach(ts, handle, name, permits=0):
    c, _, _ = await ts.subscribe(Outbox(), handle, name, EXCLUSIVE, Start(EARLIEST))
    if permits:
        ts.flow(c, permits)
    return c


# ---- message TTL ---------------------------------------------------------------------------

def test_ttl_acknowledges_what_is_older_for_every_durable_subscription(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await ts.create("idle", Start(EARLIEST))
        c = await attach(ts, 1, "busy")
        await h.append(raws(5, "old"))
        await h.roll()
        ts.ack(c, [MessageId(1, 0), MessageId(1, 1)], cumulative=False)
        await asyncio.sleep(0.05)
        cut = now_ms()
        await asyncio.sleep(0.05)
        await h.append(raws(3, "new"))
        assert ts.backlog(ts.get("idle")) == 8 and ts.backlog(ts.get("busy")) == 6
        # now - ttl falls between the two batches: the 5 old messages are past the TTL
        n = await expiry.expire_messages(ts, 10, cut + 10_000)
        assert n == 5 + 3
        assert ts.backlog(ts.get("idle")) == 3 and ts.backlog(ts.get("busy")) == 3
        assert ts.get("idle").expired == 5 and ts.get("busy").expired == 3
        assert ts.oldest_needed() == MessageId(2, 0)  # retention may now drop ledger 1
        assert ts.stats()["idle"]["msg_expired"] == 5
        # TTL off, or nothing old enough: nothing moves
        assert await expiry.expire_messages(ts, 0, cut + 10_000) == 0
        assert await expiry.expire_messages(ts, 3600, now_ms()) == 0
        await ts.flusher.flush_now()
        await h.close(ts)
        if kind == "memory":  # the acknowledgements are saved like any other
            h.executor = ThreadPoolExecutor(1)
            again = await h.open()
            assert again.backlog(again.get("idle")) == 3
            await again.close()
    run(main())


# ---- backlog quota -------------------------------------------------------------------------

def test_quota_is_measured_on_the_slowest_subscription_and_eviction_brings_it_within(tmp_path):
    async def main():
        h = Harness("memory", tmp_path)
        ts = await h.open()
        fast = await attach(ts, 1, "fast")
        await ts.create("slow", Start(EARLIEST))
        for _ in range(3):
            await h.append(raws(10))
            await h.roll()
        ts.ack(fast, [MessageId(lid, i) for lid in (1, 2, 3) for i in range(10)], False)
        slow = ts.get("slow")
        assert expiry.backlog_bytes(slow) == 30 * ENTRY
        assert expiry.backlog_bytes(ts.get("fast")) == 0
        check = await expiry.check_quota(ts, 25 * ENTRY, -1, now_ms())
        assert check.exceeded and check.subscription == "slow"
        assert check.backlog_bytes == 30 * ENTRY
        assert slow.over_quota and not ts.get("fast").over_quota
        assert ts.stats()["slow"]["backlog_quota_exceeded"]
        assert not (await expiry.check_quota(ts, 30 * ENTRY, -1, now_ms())).exceeded
        assert not (await expiry.check_quota(ts, -1, -1, now_ms())).exceeded
        await expiry.check_quota(ts, 25 * ENTRY, -1, now_ms())
        n = await expiry.evict(ts, 25 * ENTRY, -1, now_ms())
        assert n == 5 and slow.evicted == 5
        assert expiry.backlog_bytes(slow) <= 25 * ENTRY and ts.backlog(slow) == 25
        assert slow.cursor.read_position(slow.next_after) == MessageId(1, 5)  # oldest skipped
        assert not (await expiry.check_quota(ts, 25 * ENTRY, -1, now_ms())).exceeded
        await ts.close()
    run(main())


def test_quota_by_age_and_its_eviction(tmp_path):
    async def main():
        h = Harness("memory", tmp_path)
        ts = await h.open()
        await ts.create("a", Start(EARLIEST))
        await ts.create("b", Start(EARLIEST))
        await h.append(raws(4))
        await h.roll()
        await h.append(raws(2))
        h.view.age(0, 120)  # ledger 1: two minutes old; ledger 2: new
        check = await expiry.check_quota(ts, -1, 60, now_ms())
        assert check.exceeded and check.oldest_ms is not None
        assert not (await expiry.check_quota(ts, -1, 600, now_ms())).exceeded
        await expiry.check_quota(ts, -1, 60, now_ms())
        assert await expiry.evict(ts, -1, 60, now_ms()) == 8  # 4 old ones, for each of a, b
        assert ts.backlog(ts.get("a")) == ts.backlog(ts.get("b")) == 2
        assert not (await expiry.check_quota(ts, -1, 60, now_ms())).exceeded
        await ts.close()
    run(main())


# ---- subscription expiry -------------------------------------------------------------------

def test_idle_subscriptions_expire_and_connected_ones_stay(kind, tmp_path):
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        await h.append(raws(3))
        await ts.create("idle", Start(EARLIEST))
        c = await attach(ts, 1, "connected")
        left = await attach(ts, 2, "left")
        ts.close_consumer(left)
        assert await expiry.expire_subscriptions(ts, 0, now_ms() + 10**9) == []  # off
        assert await expiry.expire_subscriptions(ts, 60, now_ms()) == []  # not idle long enough
        gone = await expiry.expire_subscriptions(ts, 60, now_ms() + 61_000)
        assert sorted(gone) == ["idle", "left"]
        assert sorted(ts.subs) == ["connected"] and not c.closed
        await h.close(ts)
        h.executor = ThreadPoolExecutor(1)
        again = await h.open()  # the deletes are stored
        assert sorted(again.subs) == ["connected"]
        await again.close()
        if kind != "memory":
            await h.view.close()
        h.executor.shutdown()
    run(main())


def test_last_active_follows_consumers(tmp_path):
    async def main():
        h = Harness("memory", tmp_path)
        ts = await h.open()
        await ts.create("s", Start(EARLIEST))
        created = ts.get("s").last_active
        await asyncio.sleep(0.02)
        c = await attach(ts, 1, "s")
        assert ts.get("s").last_active > created
        await asyncio.sleep(0.02)
        assert ts.stats()["s"]["last_active"] >= now_ms() - 5  # now, while connected
        ts.close_consumer(c)
        left = ts.get("s").last_active
        await asyncio.sleep(0.02)
        assert ts.stats()["s"]["last_active"] == left
        await ts.close()
    run(main())


def test_last_active_is_persisted_with_the_cursor(kind, tmp_path):
    """A crash and reload (a new owner, the old one never closed): a subscription whose
    consumer left keeps the detach time (saved with its cursor), one saved with a consumer
    attached counts from the reload, and the expiry judges by them."""
    async def main():
        h = Harness(kind, tmp_path)
        ts = await h.open()
        gone = await attach(ts, 1, "left")
        await attach(ts, 2, "attached")
        await asyncio.sleep(0.02)
        ts.close_consumer(gone)
        left = ts.get("left").last_active
        for _ in range(500):                       # the detach is saved by the flusher
            if ts.flusher.pending == 0 and ts.flusher.flushes:
                break
            await asyncio.sleep(0.01)
        assert ts.flusher.pending == 0
        await asyncio.sleep(0.1)
        reloaded_ms = now_ms()
        again = await h.open()                     # no close: a crash, then a new owner
        assert again.get("left").last_active == left < reloaded_ms
        assert again.get("attached").last_active >= reloaded_ms
        assert again.stats()["left"]["last_active"] == left
        # one second after the detach (well before a second after the reload): expired
        assert await expiry.expire_subscriptions(again, 1, left + 1000) == ["left"]
        assert sorted(again.subs) == ["attached"]
        # the reload's time is saved for the one loaded without a time: a second crash and
        # reload keeps counting from the first reload
        first_load = again.get("attached").last_active
        for _ in range(500):
            if again.flusher.pending == 0 and again.flusher.flushes:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        third = await h.open()
        assert third.get("attached").last_active == first_load < now_ms()
        await ts.close()                           # the crashed owners: fenced, save nothing
        await again.close()
        await h.close(third)
    run(main())


# ---- the produce gate ----------------------------------------------------------------------

def test_hold_gate_waits_and_releases_in_arrival_order():
    async def main():
        gate = quota.QuotaGate("t")
        assert gate.admit() is None
        gate.update(expiry.QuotaCheck(True, "s", 10), BacklogQuotaAction.PRODUCER_REQUEST_HOLD)
        order = []

        async def produce(i):
            held = gate.admit()
            assert held is not None
            await held
            order.append(i)
        tasks = [asyncio.create_task(produce(i)) for i in range(3)]
        await asyncio.sleep(0.05)
        assert order == []
        gate.update(expiry.QuotaCheck(False), BacklogQuotaAction.PRODUCER_REQUEST_HOLD)
        late = asyncio.create_task(produce(3))  # queues behind the held ones
        await asyncio.gather(*tasks, late)
        assert order == [0, 1, 2, 3]
        assert gate.admit() is None
    run(main())


def test_hold_gate_lets_requests_through_once_a_recheck_finds_the_quota_met(monkeypatch):
    monkeypatch.setattr(quota, "RECHECK_S", 0.01)

    async def main():
        gate = quota.QuotaGate("t")
        gate.update(expiry.QuotaCheck(True, "s", 10), BacklogQuotaAction.PRODUCER_REQUEST_HOLD)
        state = {"over": True}

        async def recheck():
            return state["over"]
        gate.recheck = recheck
        task = asyncio.create_task(gate.admit())
        await asyncio.sleep(0.05)
        assert not task.done()
        state["over"] = False  # a consumer caught up
        await asyncio.wait_for(task, 5)
    run(main())


def test_hold_gate_fails_a_request_held_too_long(monkeypatch):
    monkeypatch.setattr(quota, "MAX_HOLD_S", 0.05)

    async def main():
        gate = quota.QuotaGate("t")
        gate.update(expiry.QuotaCheck(True, "s", 10), BacklogQuotaAction.PRODUCER_REQUEST_HOLD)
        with pytest.raises(errors.ProducerBlockedQuotaExceeded):
            await gate.admit()
    run(main())


def test_exception_gate_refuses_at_once_and_eviction_never_blocks():
    async def main():
        gate = quota.QuotaGate("t")
        gate.update(expiry.QuotaCheck(True, "s", 10), BacklogQuotaAction.PRODUCER_EXCEPTION)
        with pytest.raises(errors.ProducerBlockedQuotaExceeded) as info:
            gate.admit()
        assert "subscription s" in info.value.message
        assert info.value.reason == "ProducerBlockedQuotaExceeded"
        gate.update(expiry.QuotaCheck(True, "s", 10),
                    BacklogQuotaAction.CONSUMER_BACKLOG_EVICTION)
        assert gate.admit() is None
    run(main())


# ---- policy fields and flags ---------------------------------------------------------------

def test_disk_policy_fields_defaults_and_round_trip():
    assert DEFAULTS.message_ttl_seconds == 0 and DEFAULTS.subscription_expiration_seconds == 0
    assert DEFAULTS.backlog_quota_size_bytes == -1 and DEFAULTS.backlog_quota_age_seconds == -1
    assert DEFAULTS.backlog_quota_action == BacklogQuotaAction.PRODUCER_REQUEST_HOLD
    p = Policies(message_ttl_seconds=3600, backlog_quota_size_bytes=10 << 30,
                 backlog_quota_age_seconds=86400,
                 backlog_quota_action=BacklogQuotaAction.CONSUMER_BACKLOG_EVICTION,
                 subscription_expiration_seconds=7 * 86400)
    back = Policies.from_pb(p.to_pb())
    assert back == p and back.backlog_quota_action.label == "consumer_backlog_eviction"
    with pytest.raises(errors.InvalidPolicies):
        Policies(backlog_quota_action=7).to_pb()
    with pytest.raises(errors.InvalidPolicies):
        Policies(message_ttl_seconds=-1).to_pb()
    assert Policies.from_pb(common_pb2.Policies(backlog_quota_action=0)).effective() \
        .backlog_quota_action == BacklogQuotaAction.PRODUCER_REQUEST_HOLD


def test_set_policies_flags_map_to_the_disk_policies():
    args = build_parser().parse_args([
        "topics", "set-policies", "t", "--message-ttl", "1h", "--backlog-quota-size", "10G",
        "--backlog-quota-age", "1d", "--backlog-quota-action", "producer_exception",
        "--subscription-expiration", "7d"])
    assert commands._policies(args) == Policies(
        message_ttl_seconds=3600, backlog_quota_size_bytes=10 << 30,
        backlog_quota_age_seconds=86400,
        backlog_quota_action=BacklogQuotaAction.PRODUCER_EXCEPTION,
        subscription_expiration_seconds=7 * 86400)
    out = commands._policies_out(commands._policies(args))
    assert out["backlog_quota_action"] == "producer_exception"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["topics", "set-policies", "t",
                                   "--backlog-quota-action", "drop_everything"])
