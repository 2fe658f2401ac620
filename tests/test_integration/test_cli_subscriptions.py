"""The subscription commands of the CLI against a real broker, as a user types them. They
run in this process (`cli`: the console script's `main`, support/cli_inprocess.py), but
for the last test's: the installed script (`binary_cli`), as in test_cli_finish.py."""
from __future__ import annotations

import json

import pytest
from support.cli_inprocess import runner


@pytest.fixture
def cli(broker):
    """The CLI in this process, against the test broker."""
    return runner(broker.url)


def test_consume_and_the_topics_subscription_commands(cli, client, topic):
    cli("topics", "create", topic, check=True)
    res = cli("topics", "create-subscription", topic, "-s", "s", "--messageId", "earliest",
              check=True)
    cli("produce", topic, "-m", "hello", "-n", "5", check=True)
    assert cli("topics", "subscriptions", topic, "-o", "json", check=True).stdout.count('"s"') == 1

    res = cli("consume", topic, "-s", "s", "-n", "2", check=True)
    assert [line.split("\t")[2] for line in res.stdout.splitlines()] == ["hello", "hello"]
    stats = json.loads(cli("topics", "stats", topic, "-o", "json", check=True).stdout)
    assert stats["subscriptions"]["s"]["msgBacklog"] == 3

    res = cli("topics", "skip", topic, "-s", "s", "-n", "2", "--dry-run", check=True)
    stats = json.loads(cli("topics", "stats", topic, "-o", "json", check=True).stdout)
    assert stats["subscriptions"]["s"]["msgBacklog"] == 3      # a dry run changes nothing
    cli("topics", "skip", topic, "-s", "s", "-n", "2", check=True)
    peek = cli("topics", "peek-messages", topic, "-s", "s", "-n", "5", check=True)
    assert len(peek.stdout.splitlines()) == 1

    first = client.admin.peek_messages(topic, "s", 1)[0].message_id
    res = cli("topics", "reset-cursor", topic, "-s", "s", "-m", "0:0", check=True)
    assert "clamped" in res.stdout
    stats = json.loads(cli("topics", "stats", topic, "-o", "json", check=True).stdout)
    assert stats["subscriptions"]["s"]["msgBacklog"] == 5
    cli("topics", "clear-backlog", topic, "-s", "s", check=True)
    stats = json.loads(cli("topics", "stats", topic, "-o", "json", check=True).stdout)
    assert stats["subscriptions"]["s"]["msgBacklog"] == 0 and first is not None

    res = cli("topics", "unsubscribe", topic, "-s", "nope")
    assert res.returncode == 1 and res.stderr.startswith("error: SubscriptionNotFound")
    assert len(res.stderr.splitlines()) == 1
    cli("topics", "unsubscribe", topic, "-s", "s", check=True)
    assert client.admin.list_subscriptions(topic) == []
    res = cli("consume", topic, "-s", "x", "-t", "sideways")
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1


def test_create_subscription_at_latest_starts_after_the_newest_message(binary_cli, topic):
    """`topics create-subscription -m latest` as Pulsar's `MessageId.latest` (and as
    `consume -p latest`): the messages already there are not in its backlog; one produced
    afterwards is."""
    cli = binary_cli
    cli("topics", "create", topic, check=True)
    cli("produce", topic, "-m", "old", "-n", "3", check=True)
    cli("topics", "create-subscription", topic, "-s", "at-latest", "--messageId", "latest",
        check=True)

    def backlog() -> dict[str, int]:
        stats = json.loads(cli("topics", "stats", topic, "-o", "json", check=True).stdout)
        return {name: s["msgBacklog"] for name, s in stats["subscriptions"].items()}
    first = backlog()
    assert first["at-latest"] == 0, first
    cli("produce", topic, "-m", "new", "-n", "1", check=True)
    assert backlog()["at-latest"] == 1
    res = cli("consume", topic, "-s", "at-latest", "-n", "1", check=True)
    assert [line.split("\t")[2] for line in res.stdout.splitlines()] == ["new"]
