"""shadowtopic: shadow-topic read replicas (Pulsar PIP-180) with Spark compaction and etcd metadata.

    from shadowtopic import Client, errors

The client's public names (`shadowtopic.client.__all__`) are importable from here. They load
on first use, so `import shadowtopic` costs nothing, and the server's parts (`shadowtopic.broker`,
`shadowtopic.shadow`, `shadowtopic.compaction`) load only where a process asks for them.

This package's folders: source/ is `shadowtopic`, shadow/ is `shadowtopic.shadow` and compaction/
is `shadowtopic.compaction` (pyproject.toml, [tool.setuptools]).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> the module that defines it (kept equal to shadowtopic.client.__all__ by test_public_api)
_PUBLIC = {
    "Admin": "shadowtopic.client.admin",
    "AsyncAdmin": "shadowtopic.client.aio.admin",
    "AsyncClient": "shadowtopic.client.aio.client",
    "AsyncConsumer": "shadowtopic.client.aio.consumer",
    "AsyncProducer": "shadowtopic.client.aio.producer",
    "AsyncReader": "shadowtopic.client.aio.reader",
    "AsyncTableView": "shadowtopic.client.aio.table_view",
    "Client": "shadowtopic.client.client",
    "CompactionStatus": "shadowtopic.client.admin",
    "Consumer": "shadowtopic.client.consumer",
    "DeadLetterPolicy": "shadowtopic.client.dead_letter",
    "EARLIEST": "shadowtopic.core.message_id",
    "LATEST": "shadowtopic.core.message_id",
    "Message": "shadowtopic.client.message",
    "MessageId": "shadowtopic.core.message_id",
    "Policies": "shadowtopic.core.policies",
    "Producer": "shadowtopic.client.producer",
    "Reader": "shadowtopic.client.reader",
    "SeekResult": "shadowtopic.client.seek",
    "TableView": "shadowtopic.client.table_view",
    "TopicMetadata": "shadowtopic.client.admin",
    "errors": "shadowtopic.core.errors",
}

# spelled out (equal to sorted(_PUBLIC)) so tools see what the lazy imports export
__all__ = ["Admin", "AsyncAdmin", "AsyncClient", "AsyncConsumer", "AsyncProducer", "AsyncReader",
           "AsyncTableView", "Client", "CompactionStatus", "Consumer", "DeadLetterPolicy",
           "EARLIEST", "LATEST", "Message", "MessageId", "Policies", "Producer", "Reader",
           "SeekResult", "TableView", "TopicMetadata", "errors"]

if TYPE_CHECKING:
    from shadowtopic.client.admin import Admin, CompactionStatus, TopicMetadata
    from shadowtopic.client.aio import (
        AsyncAdmin,
        AsyncClient,
        AsyncConsumer,
        AsyncProducer,
        AsyncReader,
        AsyncTableView,
    )
    from shadowtopic.client.client import Client
    from shadowtopic.client.consumer import Consumer
    from shadowtopic.client.dead_letter import DeadLetterPolicy
    from shadowtopic.client.message import Message
    from shadowtopic.client.producer import Producer
    from shadowtopic.client.reader import Reader
    from shadowtopic.client.seek import SeekResult
    from shadowtopic.client.table_view import TableView
    from shadowtopic.core import errors
    from shadowtopic.core.message_id import EARLIEST, LATEST, MessageId
    from shadowtopic.core.policies import Policies


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'shadowtopic' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    value = loaded if name == "errors" else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
