"""The key schema (source/metadata/keys.py): a topic's one-value keys are never a prefix of
another key, so a follower of one of them (it watches its key as a prefix) is woken only by
writes to that key."""
from __future__ import annotations

from shadowtopic.core.names import TopicName
from shadowtopic.metadata import keys

TOPICS = [TopicName("t", "ns", "a"), TopicName("t", "ns", "a-partition-0"),
          TopicName("t", "ns", "ab"), TopicName("t", "ns", "compaction")]


def _one_value_keys(t: TopicName) -> list[str]:
    return [keys.topic_info(t), keys.ledgers(t), keys.epoch_counter(t), keys.shadows(t),
            keys.compaction(t), keys.cursors(t)]


def _all_keys(t: TopicName) -> list[str]:
    other = TOPICS[1]
    return _one_value_keys(t) + [
        keys.replicator(t, other), keys.shadow_needs(t, other), keys.compaction_job(t, "1"),
        keys.compaction_job(t, "jobs"), keys.subscription(t, "compaction"),
        keys.subscription(t, "s")]


def test_one_value_keys_prefix_no_other_key():
    every = [k for t in TOPICS for k in _all_keys(t)]
    for t in TOPICS:
        for followed in _one_value_keys(t):
            longer = [k for k in every if k != followed and k.startswith(followed)]
            assert longer == [], f"{followed} is a prefix of {longer}"


def test_compaction_jobs():
    t = TOPICS[0]
    job = keys.compaction_job(t, "00000042")
    assert job.startswith(keys.compaction_jobs_prefix(t))
    assert job.startswith(keys.topic_prefix(t))  # deleted with the topic
    assert not job.startswith(keys.compaction(t))  # progress writes wake no pointer follower
    assert job == "/shadowtopic/topics/persistent/t/ns/a/jobs/compaction/00000042"
