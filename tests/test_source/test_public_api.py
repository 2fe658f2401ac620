"""The curated public API of the client is pinned: changing it is a decision, not an accident."""
from __future__ import annotations

import inspect

import source.client as client


def test_public_names_are_pinned():
    assert sorted(client.__all__) == ["Admin", "Client", "EARLIEST", "LATEST", "Message",
                                      "MessageId", "Policies", "Producer", "Reader",
                                      "TopicMetadata", "errors"]
    for name in client.__all__:
        assert getattr(client, name) is not None


def test_client_methods_are_pinned():
    public = {n for n, _ in inspect.getmembers(client.Client) if not n.startswith("_")}
    assert public == {"close", "create_producer", "create_reader"}
    producer = {n for n, _ in inspect.getmembers(client.Producer) if not n.startswith("_")}
    assert producer == {"close", "flush", "send", "send_async", "stats"}
    reader = {n for n, _ in inspect.getmembers(client.Reader) if not n.startswith("_")}
    assert reader == {"close", "has_message_available", "read_next"}
