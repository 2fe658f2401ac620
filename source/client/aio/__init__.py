"""The asyncio face of the client: `AsyncClient` and what it opens, over the same core as
the sync `Client` (bridge.py says how)."""
from shadowtopic.client.aio.admin import AsyncAdmin
from shadowtopic.client.aio.client import AsyncClient
from shadowtopic.client.aio.consumer import AsyncConsumer
from shadowtopic.client.aio.producer import AsyncProducer
from shadowtopic.client.aio.reader import AsyncReader
from shadowtopic.client.aio.table_view import AsyncTableView

__all__ = ["AsyncAdmin", "AsyncClient", "AsyncConsumer", "AsyncProducer", "AsyncReader",
           "AsyncTableView"]
