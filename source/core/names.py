"""Topic names: `persistent://tenant/namespace/topic`, partitions `<topic>-partition-<i>`.

A bare `topic` means `persistent://public/default/topic` (as in Pulsar). Only persistent
topics exist; `non-persistent://` names are refused with `InvalidTopicName`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from source.core.errors import InvalidTopicName

DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "default"
_PART = re.compile(r"^[A-Za-z0-9_\-=.]+$")
_LOCAL = re.compile(r"^[A-Za-z0-9_\-=.:]+$")
_PARTITION = re.compile(r"^(?P<base>.+)-partition-(?P<index>\d+)$")
MAX_NAME = 512


@dataclass(frozen=True, order=True)
class TopicName:
    tenant: str
    namespace: str
    local: str

    @classmethod
    def parse(cls, text: str) -> "TopicName":
        if not isinstance(text, str) or not text:
            raise InvalidTopicName("topic name is empty")
        if len(text) > MAX_NAME:
            raise InvalidTopicName(f"topic name longer than {MAX_NAME} characters")
        if "://" in text:
            scheme, _, rest = text.partition("://")
            if scheme != "persistent":
                raise InvalidTopicName(
                    f"'{text}': only persistent:// topics are supported (got {scheme}://)")
            parts = rest.split("/")
            if len(parts) != 3:
                raise InvalidTopicName(
                    f"'{text}': expected persistent://tenant/namespace/topic")
        else:
            parts = text.split("/")
            if len(parts) == 1:
                parts = [DEFAULT_TENANT, DEFAULT_NAMESPACE, parts[0]]
            elif len(parts) != 3:
                raise InvalidTopicName(f"'{text}': expected topic or tenant/namespace/topic")
        tenant, namespace, local = parts
        if not _PART.match(tenant) or not _PART.match(namespace):
            raise InvalidTopicName(f"'{text}': invalid tenant or namespace")
        if not _LOCAL.match(local):
            raise InvalidTopicName(f"'{text}': invalid characters in topic name")
        return cls(tenant, namespace, local)

    def __str__(self) -> str:
        return f"persistent://{self.tenant}/{self.namespace}/{self.local}"

    @property
    def namespace_name(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    @property
    def path(self) -> str:
        """Path form used in etcd keys and storage paths: persistent/tenant/ns/topic."""
        return f"persistent/{self.tenant}/{self.namespace}/{self.local}"

    def partition(self, index: int) -> "TopicName":
        return TopicName(self.tenant, self.namespace, f"{self.local}-partition-{index}")

    @property
    def partition_index(self) -> int:
        """i for `<t>-partition-<i>`, else -1."""
        m = _PARTITION.match(self.local)
        return int(m.group("index")) if m else -1

    @property
    def partitioned_parent(self) -> "TopicName | None":
        m = _PARTITION.match(self.local)
        return TopicName(self.tenant, self.namespace, m.group("base")) if m else None


def canonical(text: str) -> str:
    """The full `persistent://...` form of a topic name (validating it)."""
    return str(TopicName.parse(text))
