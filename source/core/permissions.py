"""Permissions as users name them (docs/SECURITY.md, "Authorization"): the actions a role
can be granted on a namespace or a topic.

- `produce`: publish to the topic.
- `consume`: read it (readers and subscriptions), and manage its subscriptions (create,
  delete, reset, skip, clear a backlog, peek).
- `shadow`: create and delete shadows of this source (a shadow's own permissions are its
  own: consuming a source grants nothing on its shadows, nor the reverse).
- `replicate`: open replication streams to the topic's shadows and read its ledgers
  through `Storage` (brokers do; neither Pulsar nor Kafka has such a separate action).

A grant sets a role's actions on a target to exactly the ones given (as Pulsar's
`grant-permission`); a revoke removes every action of the role there.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable

from shadowtopic.core.errors import InvalidArgument
from shadowtopic.core.names import TopicName, parse_namespace


class Action(enum.StrEnum):
    PRODUCE = "produce"
    CONSUME = "consume"
    SHADOW = "shadow"
    REPLICATE = "replicate"


ALL = frozenset(Action)
MAX_ROLE = 256  # characters of a role name


def parse_actions(names: Iterable[str]) -> frozenset[Action]:
    """The actions `names` name (`InvalidArgument` for an unknown or empty list)."""
    out = set()
    for name in names:
        try:
            out.add(Action(name.strip().lower()))
        except ValueError:
            raise InvalidArgument(f"unknown action {name!r}: expected one of "
                                  f"{', '.join(a.value for a in Action)}") from None
    if not out:
        raise InvalidArgument("no action given: expected one or more of "
                              f"{', '.join(a.value for a in Action)}")
    return frozenset(out)


def check_role(role: str) -> str:
    """A role name as it can be granted (`InvalidArgument` otherwise)."""
    if not isinstance(role, str) or not role or len(role) > MAX_ROLE or \
            any(c in role for c in "\n\r\0"):
        raise InvalidArgument(f"a role must be 1 to {MAX_ROLE} characters without line "
                              f"breaks, got {role[:40]!r}")
    return role


def sorted_names(actions: Iterable[Action]) -> list[str]:
    return sorted(a.value for a in actions)


def parse_target(text: str) -> str | TopicName:
    """A grant's target as named: "tenant/namespace" (one slash, no scheme), else a topic
    (`InvalidTopicName` when it is neither)."""
    if isinstance(text, str) and "://" not in text and text.count("/") == 1:
        return parse_namespace(text)
    return TopicName.parse(text)
