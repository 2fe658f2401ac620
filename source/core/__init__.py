"""Pure core types: names, message ids, errors (no I/O)."""
from shadowtopic.core import errors
from shadowtopic.core.message_id import EARLIEST, LATEST, MessageId
from shadowtopic.core.names import TopicName, canonical

__all__ = ["errors", "MessageId", "EARLIEST", "LATEST", "TopicName", "canonical"]
