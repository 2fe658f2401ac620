"""Names: topics `persistent://tenant/namespace/topic`, partitions `<topic>-partition-<i>`,
namespaces `tenant/namespace`, subscriptions.

Grammar (every name becomes part of etcd keys; storage paths escape it on top, see
source/ledger/storage.py, so a name that got past this check still cannot leave the root):

    segment      = 1*( ALPHA / DIGIT / "_" / "-" / "." / "=" / ":" ), not starting with "."
    tenant       = segment, at most 64 characters
    namespace    = segment, at most 64 characters
    topic        = segment, at most 200 characters
    subscription = segment, at most 200 characters

So `.`, `..`, hidden names, `/`, NUL, spaces and non-ASCII are refused with
`InvalidTopicName` (topics, namespaces) or `InvalidArgument` (subscriptions), saying what
is allowed. A bare `topic` means `persistent://public/default/topic` and `tenant/ns/topic`
means `persistent://tenant/ns/topic` (as in Pulsar); the canonical form is always the full
`persistent://...` text. Only persistent topics exist: `non-persistent://` is refused. Names
ending in `-partition-<n>` are reserved for the partitions of partitioned topics.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from shadowtopic.core.errors import InvalidArgument, InvalidTopicName, ShadowTopicError

DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "default"
MAX_TENANT = 64
MAX_NAMESPACE = 64
MAX_TOPIC = 200
MAX_SUBSCRIPTION = 200
ALLOWED = "letters, digits, '_', '-', '.', '=' and ':' (not starting with '.')"
_SEGMENT = re.compile(r"[A-Za-z0-9_=:\-][A-Za-z0-9_=:.\-]*")
_PARTITION = re.compile(r"^(?P<base>.+)-partition-(?P<index>0|[1-9][0-9]{0,5})$")
_RESERVED = re.compile(r"-partition-[0-9]+$")


def _check(what: str, value: str, limit: int,
           error: type[ShadowTopicError] = InvalidTopicName) -> str:
    if not value:
        raise error(f"{what} is empty")
    if len(value) > limit:
        raise error(f"{what} is longer than {limit} characters ({len(value)})")
    if not _SEGMENT.fullmatch(value):
        raise error(f"{what} '{_show(value)}' is invalid: use {ALLOWED}")
    return value


def _show(text: str, limit: int = 80) -> str:
    """A name as it can be printed in one error line (no control characters, bounded)."""
    shown = text.encode("unicode_escape").decode("ascii")
    return shown if len(shown) <= limit else shown[:limit] + "..."


@dataclass(frozen=True, order=True)
class TopicName:
    tenant: str
    namespace: str
    local: str

    @classmethod
    def parse(cls, text: str) -> TopicName:
        if not isinstance(text, str) or not text:
            raise InvalidTopicName("topic name is empty")
        limit = len("persistent://") + MAX_TENANT + MAX_NAMESPACE + MAX_TOPIC + 2
        if len(text) > limit:
            raise InvalidTopicName(f"topic name is longer than {limit} characters")
        if "://" in text:
            scheme, _, rest = text.partition("://")
            if scheme != "persistent":
                raise InvalidTopicName(f"'{_show(text)}': only persistent:// topics are "
                                       f"supported (got '{_show(scheme)}://')")
            parts = rest.split("/")
            if len(parts) != 3:
                raise InvalidTopicName(
                    f"'{_show(text)}': expected persistent://tenant/namespace/topic")
        else:
            parts = text.split("/")
            if len(parts) == 1:
                parts = [DEFAULT_TENANT, DEFAULT_NAMESPACE, parts[0]]
            elif len(parts) != 3:
                raise InvalidTopicName(
                    f"'{_show(text)}': expected topic or tenant/namespace/topic")
        tenant, namespace, local = parts
        return cls(_check("tenant", tenant, MAX_TENANT),
                   _check("namespace", namespace, MAX_NAMESPACE),
                   _check("topic", local, MAX_TOPIC + len("-partition-999999")))

    def __str__(self) -> str:
        return f"persistent://{self.tenant}/{self.namespace}/{self.local}"

    @property
    def namespace_name(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    @property
    def path(self) -> str:
        """`persistent/tenant/ns/topic`: the form used in etcd keys. Storage paths escape
        it further (shadowtopic.ledger.storage.topic_dir)."""
        return f"persistent/{self.tenant}/{self.namespace}/{self.local}"

    def partition(self, index: int) -> TopicName:
        return TopicName(self.tenant, self.namespace, f"{self.local}-partition-{index}")

    @property
    def partition_index(self) -> int:
        """i for `<t>-partition-<i>`, else -1."""
        m = _PARTITION.match(self.local)
        return int(m.group("index")) if m else -1

    @property
    def partitioned_parent(self) -> TopicName | None:
        m = _PARTITION.match(self.local)
        return TopicName(self.tenant, self.namespace, m.group("base")) if m else None

    def check_creatable(self) -> TopicName:
        """Refuse names a user may not create: reserved partition names, over-long ones."""
        if _RESERVED.search(self.local):
            raise InvalidTopicName(
                f"{self}: names ending in -partition-<n> are reserved for partitions")
        _check("topic", self.local, MAX_TOPIC)
        return self


def canonical(text: str) -> str:
    """The full `persistent://...` form of a topic name (validating it)."""
    return str(TopicName.parse(text))


def parse_namespace(text: str) -> str:
    """A `tenant/namespace` name, validated."""
    parts = text.split("/") if isinstance(text, str) else []
    if len(parts) != 2:
        raise InvalidTopicName(f"namespace must be tenant/namespace, got '{_show(str(text))}'")
    return f"{_check('tenant', parts[0], MAX_TENANT)}/" \
           f"{_check('namespace', parts[1], MAX_NAMESPACE)}"


def check_tenant(name: str) -> str:
    """A tenant name, validated."""
    return _check("tenant", name if isinstance(name, str) else "", MAX_TENANT)


def check_subscription(name: str) -> str:
    """A subscription name, validated (it becomes an etcd key and a cursor file name)."""
    if not isinstance(name, str):
        raise InvalidArgument("subscription name must be a string")
    return _check("subscription name", name, MAX_SUBSCRIPTION, InvalidArgument)
