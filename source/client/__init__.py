"""The shadowtopic client: `Client` (sync) and `AsyncClient` (asyncio) over one core
(source/client/aio/bridge.py says how). The public names are pinned by
tests/test_source/client/test_public_api.py and test_async_api.py."""
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

__all__ = ["Admin", "AsyncAdmin", "AsyncClient", "AsyncConsumer", "AsyncProducer", "AsyncReader",
           "AsyncTableView", "Client", "CompactionStatus", "Consumer", "DeadLetterPolicy",
           "EARLIEST", "LATEST", "Message", "MessageId", "Policies", "Producer", "Reader",
           "SeekResult", "TableView", "TopicMetadata", "errors"]
