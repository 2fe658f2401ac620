"""The curated public API of the client is pinned: changing it is a decision, not an accident."""
from __future__ import annotations

import inspect

import shadowtopic.client as client


def test_public_names_are_pinned():
    assert sorted(client.__all__) == ["Admin", "AsyncAdmin", "AsyncClient", "AsyncConsumer",
                                      "AsyncProducer", "AsyncReader", "AsyncTableView",
                                      "Client", "CompactionStatus", "Consumer",
                                      "DeadLetterPolicy", "EARLIEST", "LATEST",
                                      "Message", "MessageId", "Policies", "Producer", "Reader",
                                      "SeekResult", "TableView", "TopicMetadata", "errors"]
    for name in client.__all__:
        assert getattr(client, name) is not None


def test_client_methods_are_pinned():
    public = {n for n, _ in inspect.getmembers(client.Client) if not n.startswith("_")}
    assert public == {"close", "create_producer", "create_reader", "subscribe", "subscribe_many",
                      "table_view", "read_table"}
    producer = {n for n, _ in inspect.getmembers(client.Producer) if not n.startswith("_")}
    assert producer == {"close", "flush", "flush_nowait", "full", "queue_message",
                        "receipt_wait_s", "send", "send_async", "settle_batches_with", "stats",
                        "wait_for_room"}
    reader = {n for n, _ in inspect.getmembers(client.Reader) if not n.startswith("_")}
    assert reader == {"close", "has_message_available", "last_message_ids", "poll", "read_batch",
                      "read_next",
                      "seek"}
    table = {n for n, _ in inspect.getmembers(client.TableView) if not n.startswith("_")}
    assert table == {"close", "for_each", "for_each_and_listen", "get", "items", "keys",
                     "listen", "refresh"}
    consumer = {n for n, _ in inspect.getmembers(client.Consumer) if not n.startswith("_")}
    assert consumer == {"ack_receipt", "acknowledge", "acknowledge_async", "acknowledge_cumulative",
                        "acknowledge_cumulative_async", "batch_receive", "close",
                        "consumer_type", "has_buffered", "is_active", "negative_acknowledge",
                        "partitions", "poll", "poll_batch", "read_positions", "receive",
                        "reconsume_later", "redeliver_unacknowledged_messages", "seek",
                        "unsubscribe"}
    admin = {n for n, _ in inspect.getmembers(client.Admin) if not n.startswith("_")}
    assert {"create_subscription", "delete_subscription", "list_subscriptions", "reset_cursor",
            "skip", "clear_backlog", "peek_messages", "last_message_id", "create_shadow_topic",
            "get_shadow_topics", "get_shadow_source", "delete_shadow_topic", "compact",
            "compaction_status", "watch_compaction"} <= admin


def test_seek_returns_one_type_everywhere():
    for cls in (client.Reader, client.Consumer):
        assert inspect.signature(cls.seek).return_annotation in ("SeekResult", client.SeekResult)
    assert client.SeekResult._fields == ("message_id", "clamped")


def test_shadow_admin_signatures_are_pinned():
    params = {name: list(inspect.signature(getattr(client.Admin, name)).parameters)
              for name in ("create_shadow_topic", "get_shadow_topics", "get_shadow_source",
                           "delete_shadow_topic")}
    assert params == {"create_shadow_topic": ["self", "shadow", "source", "properties"],
                      "get_shadow_topics": ["self", "source"],
                      "get_shadow_source": ["self", "shadow"],
                      "delete_shadow_topic": ["self", "shadow"]}
    create = inspect.signature(client.Admin.create_shadow_topic)
    assert create.parameters["properties"].default is None


def test_client_signatures_are_pinned():
    sig = inspect.signature(client.Client.subscribe)
    assert list(sig.parameters) == [
        "self", "topic", "subscription_name", "consumer_type", "initial_position",
        "consumer_name", "receiver_queue_size", "priority", "negative_ack_redelivery_delay_ms",
        "on_active_change", "read_compacted", "ack_timeout_ms", "dead_letter_policy",
        "ack_receipt", "retry_enable"]
    assert sig.parameters["read_compacted"].default is False
    assert sig.parameters["ack_receipt"].default is False
    assert sig.parameters["ack_timeout_ms"].default == 0
    assert sig.parameters["dead_letter_policy"].default is None
    assert sig.parameters["retry_enable"].default is False
    policy = inspect.signature(client.DeadLetterPolicy)
    assert list(policy.parameters) == ["max_redeliver_count", "dead_letter_topic",
                                       "retry_letter_topic"]
    assert policy.parameters["dead_letter_topic"].default is None
    assert policy.parameters["retry_letter_topic"].default is None
    reconsume = inspect.signature(client.Consumer.reconsume_later)
    assert list(reconsume.parameters) == ["self", "message", "delay_s", "properties"]
    assert reconsume.parameters["properties"].default is None
    reader = inspect.signature(client.Client.create_reader)
    assert list(reader.parameters) == ["self", "topic", "start", "inclusive",
                                       "receiver_queue_size", "read_compacted"]
    assert sig.parameters["consumer_type"].default == "exclusive"
    assert sig.parameters["initial_position"].default == "latest"
    assert sig.parameters["receiver_queue_size"].default == 1000
    assert sig.parameters["negative_ack_redelivery_delay_ms"].default == 1000
