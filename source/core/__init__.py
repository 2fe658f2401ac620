"""Pure core types: names, message ids, errors (no I/O)."""
from source.core import errors
from source.core.message_id import EARLIEST, LATEST, MessageId
from source.core.names import TopicName, canonical

__all__ = ["errors", "MessageId", "EARLIEST", "LATEST", "TopicName", "canonical"]
