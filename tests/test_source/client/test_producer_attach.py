"""A producer's first attach (source/client/producer.py `_connect`): it waits for the answer
to every attach it sent, however early the broker answers. The receiver thread counts the
stream's outstanding attaches down as their answers arrive; a producer that read how many to
wait for from that count after sending got none when the answers came first, and went on
without the name the broker gave it and without resuming its sequence ids after those the
broker had stored. The failpoint holds the producer after it sent its attaches, so the
broker's answers (sent as the stream opens) are counted before it waits."""
from __future__ import annotations

import pytest

from shadowtopic import failpoints

TOPIC = "persistent://t/ns/attach"


@pytest.mark.parametrize("partitions", [0, 3])
def test_a_producer_answered_before_it_waits_takes_the_brokers_name_and_sequence(
        fake, client, partitions):
    fake.partitions[TOPIC] = partitions
    fake.producer_name, fake.last_sequence_id = "broker-named-7", 41
    fake.attach_answers_first = max(partitions, 1)  # every attach answered as the stream opens
    with failpoints.enabled({"producer.attach_sent": "1*sleep(1)"}):
        producer = client.create_producer(TOPIC)
    try:
        assert producer.producer_name == "broker-named-7"
        for i in range(max(partitions, 1)):  # keyless: one to each partition in turn
            producer.send(f"m{i}")
    finally:
        producer.close()
    batches = list(fake.produced)
    assert len(batches) == max(partitions, 1)
    topics = ([TOPIC] if not partitions
              else [f"{TOPIC}-partition-{p}" for p in range(partitions)])
    assert sorted(b.topic for b in batches) == topics
    for b in batches:  # each goes on after what the broker stored
        assert (b.producer_name, b.sequence_id) == ("broker-named-7", 42), b
        assert [(m.producer_name, m.sequence_id) for m in b.messages] == \
            [("broker-named-7", 42)]
