"""The shadowtopic client (sync). The public names are pinned by tests/test_source/test_public_api.py."""
from source.client.admin import Admin, CompactionStatus, TopicMetadata
from source.client.client import Client
from source.client.consumer import Consumer
from source.client.message import Message
from source.client.producer import Producer
from source.client.reader import Reader
from source.core import errors
from source.core.message_id import EARLIEST, LATEST, MessageId
from source.core.policies import Policies

__all__ = ["Admin", "Client", "CompactionStatus", "Consumer", "EARLIEST", "LATEST", "Message", "MessageId",
           "Policies", "Producer", "Reader", "TopicMetadata", "errors"]
