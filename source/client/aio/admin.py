"""The asyncio admin: every call of the core's `Admin` (source/client/admin.py: the
checks, the retries within the operation timeout, the typed errors), awaited on the
client's threads (bridge.py). Written from `Admin`'s signatures, which
tests/test_source/client/test_async_api.py checks it against: a call added there is
added here too.

    async with AsyncClient() as client:
        await client.admin.create_topic("orders", partitions=4)
        await client.admin.create_shadow_topic("orders-replica", "orders")
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from functools import partial
from typing import Any, ParamSpec, TypeVar

from shadowtopic.client.admin import Admin, CompactionStatus, TopicMetadata
from shadowtopic.client.aio.bridge import run_blocking
from shadowtopic.client.message import Message
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.policies import Policies

P = ParamSpec("P")
T = TypeVar("T")


def _collect(watch: Callable[[str, float | None], Iterable[CompactionStatus]], topic: str,
             timeout: float | None) -> list[CompactionStatus]:
    return list(watch(topic, timeout))


class AsyncAdmin:
    """`AsyncClient.admin`. Each method is `Admin`'s, awaited; see there for what it does."""

    def __init__(self, core: Admin, pool: Executor):
        self._core = core
        self._pool = pool

    async def _run(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await run_blocking(self._pool, partial(call, *args, **kwargs))

    async def clear_backlog(self, topic: str, subscription: str, dry_run: bool = False
                           ) -> dict[str, Any]:
        """As `Admin.clear_backlog`."""
        return await self._run(self._core.clear_backlog, topic, subscription, dry_run)

    async def compact(self, topic: str) -> str:
        """As `Admin.compact`."""
        return await self._run(self._core.compact, topic)

    async def compaction_status(self, topic: str) -> CompactionStatus:
        """As `Admin.compaction_status`."""
        return await self._run(self._core.compaction_status, topic)

    async def create_shadow_topic(self, shadow: str, source: str,
                                  properties: dict[str, str] | None = None
                                 ) -> TopicMetadata:
        """As `Admin.create_shadow_topic`."""
        return await self._run(self._core.create_shadow_topic, shadow, source, properties)

    async def create_subscription(self, topic: str, subscription: str,
                                  start: str | MessageId | int = "latest"
                                 ) -> None:
        """As `Admin.create_subscription`."""
        return await self._run(self._core.create_subscription, topic, subscription, start)

    async def create_topic(self, topic: str, partitions: int = 0, policies: Policies | None = None,
                           properties: dict[str, str] | None = None
                          ) -> TopicMetadata:
        """As `Admin.create_topic`."""
        return await self._run(self._core.create_topic, topic, partitions, policies, properties)

    async def delete_shadow_topic(self, shadow: str) -> None:
        """As `Admin.delete_shadow_topic`."""
        return await self._run(self._core.delete_shadow_topic, shadow)

    async def delete_subscription(self, topic: str, subscription: str, force: bool = False,
                                  dry_run: bool = False
                                 ) -> dict[str, Any]:
        """As `Admin.delete_subscription`."""
        return await self._run(self._core.delete_subscription, topic, subscription, force, dry_run)

    async def delete_topic(self, topic: str, force: bool = False) -> None:
        """As `Admin.delete_topic`."""
        return await self._run(self._core.delete_topic, topic, force)

    async def get_namespace_policies(self, namespace: str) -> Policies:
        """As `Admin.get_namespace_policies`."""
        return await self._run(self._core.get_namespace_policies, namespace)

    async def get_policies(self, topic: str) -> Policies:
        """As `Admin.get_policies`."""
        return await self._run(self._core.get_policies, topic)

    async def get_shadow_source(self, shadow: str) -> str:
        """As `Admin.get_shadow_source`."""
        return await self._run(self._core.get_shadow_source, shadow)

    async def get_shadow_topics(self, source: str) -> list[str]:
        """As `Admin.get_shadow_topics`."""
        return await self._run(self._core.get_shadow_topics, source)

    async def get_topic(self, topic: str) -> TopicMetadata:
        """As `Admin.get_topic`."""
        return await self._run(self._core.get_topic, topic)

    async def internal_stats(self, topic: str) -> dict[str, Any]:
        """As `Admin.internal_stats`."""
        return await self._run(self._core.internal_stats, topic)

    async def last_message_id(self, topic: str, read_compacted: bool = False) -> MessageId | None:
        """As `Admin.last_message_id`."""
        return await self._run(self._core.last_message_id, topic, read_compacted)

    async def list_subscriptions(self, topic: str) -> list[str]:
        """As `Admin.list_subscriptions`."""
        return await self._run(self._core.list_subscriptions, topic)

    async def list_topics(self, namespace: str = "") -> list[TopicMetadata]:
        """As `Admin.list_topics`."""
        return await self._run(self._core.list_topics, namespace)

    async def lookup(self, topic: str) -> dict[str, Any]:
        """As `Admin.lookup`."""
        return await self._run(self._core.lookup, topic)

    async def peek_messages(self, topic: str, subscription: str, count: int = 1) -> list[Message]:
        """As `Admin.peek_messages`."""
        return await self._run(self._core.peek_messages, topic, subscription, count)

    async def reset_cursor(self, topic: str, subscription: str, position: str | MessageId | int,
                           dry_run: bool = False
                          ) -> tuple[MessageId, bool]:
        """As `Admin.reset_cursor`."""
        return await self._run(self._core.reset_cursor, topic, subscription, position, dry_run)

    async def roll_ledger(self, topic: str) -> dict[str, Any]:
        """As `Admin.roll_ledger`."""
        return await self._run(self._core.roll_ledger, topic)

    async def set_namespace_policies(self, namespace: str, policies: Policies | None = None,
                                     remove: Iterable[str] = ()
                                    ) -> Policies:
        """As `Admin.set_namespace_policies`."""
        return await self._run(self._core.set_namespace_policies, namespace, policies, remove)

    async def set_policies(self, topic: str, policies: Policies) -> Policies:
        """As `Admin.set_policies`."""
        return await self._run(self._core.set_policies, topic, policies)

    async def skip(self, topic: str, subscription: str, count: int, dry_run: bool = False
                  ) -> dict[str, Any]:
        """As `Admin.skip`."""
        return await self._run(self._core.skip, topic, subscription, count, dry_run)

    async def stats(self, topic: str) -> dict[str, Any]:
        """As `Admin.stats`."""
        return await self._run(self._core.stats, topic)

    async def truncate(self, topic: str) -> dict[str, Any]:
        """As `Admin.truncate`."""
        return await self._run(self._core.truncate, topic)

    async def watch_compaction(self, topic: str, timeout: float | None = None
                              ) -> list[CompactionStatus]:
        """Every record of the newest job until it ends (`Admin.watch_compaction`'s, collected)."""
        return await self._run(_collect, self._core.watch_compaction, topic, timeout)

    async def create_tenant(self, tenant: str, admin_roles: Iterable[str] = ()) -> None:
        """As `Admin.create_tenant`."""
        await self._run(self._core.create_tenant, tenant, list(admin_roles))

    async def delete_tenant(self, tenant: str) -> None:
        """As `Admin.delete_tenant`."""
        await self._run(self._core.delete_tenant, tenant)

    async def list_tenants(self) -> dict[str, list[str]]:
        """As `Admin.list_tenants`."""
        return await self._run(self._core.list_tenants)

    async def create_namespace(self, namespace: str) -> None:
        """As `Admin.create_namespace`."""
        await self._run(self._core.create_namespace, namespace)

    async def delete_namespace(self, namespace: str) -> None:
        """As `Admin.delete_namespace`."""
        await self._run(self._core.delete_namespace, namespace)

    async def list_namespaces(self, tenant: str) -> list[str]:
        """As `Admin.list_namespaces`."""
        return await self._run(self._core.list_namespaces, tenant)

    async def grant_permission(self, target: str, role: str, actions: Iterable[str]) -> None:
        """As `Admin.grant_permission`."""
        await self._run(self._core.grant_permission, target, role, list(actions))

    async def revoke_permission(self, target: str, role: str) -> None:
        """As `Admin.revoke_permission`."""
        await self._run(self._core.revoke_permission, target, role)

    async def get_permissions(self, target: str) -> dict[str, list[str]]:
        """As `Admin.get_permissions`."""
        return await self._run(self._core.get_permissions, target)
