"""What each CLI command does, through the client library (source.client)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from source.cli.output import emit, fail, message_line
from source.client import Client, Policies
from source.core import errors
from source.core.names import canonical
from source.core.policies import BacklogQuotaAction

_POLICY_FLAGS = {
    "retention_time": "retention_time_seconds", "retention_size": "retention_size_bytes",
    "max_message_size": "max_message_size", "compaction_threshold": "compaction_threshold_bytes",
    "retain_null_key": "retain_null_key",
    "replicator_auto_reset_backlog_entries": "replicator_auto_reset_backlog_entries",
    "ledger_max_entries": "ledger_max_entries", "ledger_max_bytes": "ledger_max_bytes",
    "ledger_max_age": "ledger_max_age_seconds",
    "max_producers": "max_producers", "max_subscriptions": "max_subscriptions",
    "max_consumers": "max_consumers",
    "retention_keeps_shadow_backlog": "retention_keeps_shadow_backlog",
    "delete_retention": "delete_retention_seconds",
    "message_ttl": "message_ttl_seconds", "backlog_quota_size": "backlog_quota_size_bytes",
    "backlog_quota_age": "backlog_quota_age_seconds",
    "backlog_quota_action": "backlog_quota_action",
    "subscription_expiration": "subscription_expiration_seconds",
}


def _policies_out(p: Policies) -> dict:
    """Policies as printed: the backlog quota action by its name."""
    out = p.as_dict()
    action = out.get("backlog_quota_action")
    if action is not None:
        try:
            out["backlog_quota_action"] = BacklogQuotaAction(action).label
        except ValueError:
            pass
    return out


def _policies(args: argparse.Namespace) -> Policies:
    return Policies(**{field: getattr(args, flag) for flag, field in _POLICY_FLAGS.items()
                       if getattr(args, flag, None) is not None})


#: how long a CLI call retries temporary errors (the library's default is 30 s)
OPERATION_TIMEOUT_S = 10.0


def _client(args: argparse.Namespace) -> Client:
    return Client(args.url, operation_timeout=args.operation_timeout)


def standalone(args) -> int:
    from source import standalone as sa
    return sa.run(args.data_dir, args.wipe_data, args.port, args.etcd_port,
                  etcd_peer_port=args.etcd_peer_port, shadow_port=args.shadow_port,
                  compaction_port=args.compaction_port,
                  worker_args=["--spark-master", args.spark_master] if args.spark_master else [],
                  broker_args=[] if args.entry_cache_bytes is None
                  else ["--entry-cache-bytes", str(args.entry_cache_bytes)])


def broker(args) -> int:
    """`shadowtopic broker ...` becomes `python -m source.broker.server ...` (exec, same pid):
    the CLI is a client and imports no server code."""
    os.execv(sys.executable, [sys.executable, "-m", "source.broker.server", *args.args])
    return 1  # not reached: execv returns only by raising


def topics_create(args) -> int:
    with _client(args) as c:
        meta = c.admin.create_topic(args.topic, args.partitions, _policies(args),
                                    dict(args.property))
    emit(meta.to_dict(), args.output)
    return 0


def topics_delete(args) -> int:
    with _client(args) as c:
        c.admin.delete_topic(args.topic, args.force)
    print(f"deleted {args.topic}")
    return 0


def topics_create_shadow_topic(args) -> int:
    with _client(args) as c:
        meta = c.admin.create_shadow_topic(args.topic, args.source, dict(args.property))
    emit(meta.to_dict(), args.output)
    return 0


def topics_get_shadow_topics(args) -> int:
    with _client(args) as c:
        shadows = c.admin.get_shadow_topics(args.topic)
    if args.output == "json":
        emit(shadows, "json")
    else:
        emit([{"shadow": s} for s in shadows], "table", ["shadow"])
    return 0


def topics_get_shadow_source(args) -> int:
    with _client(args) as c:
        source = c.admin.get_shadow_source(args.topic)
    if args.output == "json":
        emit({"topic": canonical(args.topic), "source": source}, "json")
    else:
        print(source)
    return 0


def topics_delete_shadow_topic(args) -> int:
    with _client(args) as c:
        c.admin.delete_shadow_topic(args.topic)
    print(f"deleted shadow topic {args.topic}")
    return 0


def topics_compact(args) -> int:
    with _client(args) as c:
        job_id = c.admin.compact(args.topic)
    if args.output == "json":
        emit({"topic": canonical(args.topic), "job_id": job_id}, "json")
    else:
        print(job_id)
    return 0


def _job_failed(status) -> int:
    if status.phase == "failed":
        err = status.error
        fail(f"compaction job {status.job_id} failed: "
             f"{err.reason if err else 'Internal'}: {err.message if err else ''}")
    return 0


def topics_compaction_status(args) -> int:
    """The newest compaction job; with -w, follow it to its end: a progress bar with ETA on
    a terminal, one JSON object per change otherwise. Exits 1 when the job failed."""
    with _client(args) as c:
        if not args.wait:
            status = c.admin.compaction_status(args.topic)
            emit(status.to_dict(), args.output)
            return _job_failed(status)
        if sys.stdout.isatty() and args.output != "json":
            from source.cli.output import compaction_progress
            status = compaction_progress(c.admin.watch_compaction(args.topic))
        else:
            status = None
            for status in c.admin.watch_compaction(args.topic):
                print(json.dumps(status.to_dict()), flush=True)
    return _job_failed(status) if status is not None else 1


def topics_list(args) -> int:
    with _client(args) as c:
        topics = c.admin.list_topics(args.namespace)
    rows = [{"topic": t.topic, "kind": t.kind, "partitions": t.partitions, "source": t.source}
            for t in topics]
    if args.output == "json":
        emit(rows, "json")
    else:
        emit(rows, "table", ["topic", "kind", "partitions", "source"])
    return 0


def topics_stats(args) -> int:
    with _client(args) as c:
        emit(c.admin.stats(args.topic), args.output)
    return 0


def topics_stats_internal(args) -> int:
    with _client(args) as c:
        meta = c.admin.get_topic(args.topic)
        if meta.partitions:
            data = {f"{meta.topic}-partition-{i}":
                    c.admin.internal_stats(f"{meta.topic}-partition-{i}")
                    for i in range(meta.partitions)}
        else:
            data = c.admin.internal_stats(args.topic)
    if args.output == "table" and not meta.partitions:
        ledgers = data.pop("ledgers", [])
        emit(data, "table")
        if ledgers:
            emit(ledgers, "table", ["ledgerId", "state", "entries", "size", "path"])
    else:
        emit(data, args.output)
    return 0


def topics_truncate(args) -> int:
    with _client(args) as c:
        emit(c.admin.truncate(args.topic), args.output)
    return 0


def topics_get_policies(args) -> int:
    with _client(args) as c:
        emit(_policies_out(c.admin.get_policies(args.topic)), args.output)
    return 0


def topics_set_policies(args) -> int:
    update = _policies(args)
    if not update.as_dict():
        fail("set-policies needs at least one policy flag (see --help)")
    with _client(args) as c:
        emit(_policies_out(c.admin.set_policies(args.topic, update)), args.output)
    return 0


def topics_lookup(args) -> int:
    with _client(args) as c:
        emit(c.admin.lookup(args.topic), args.output)
    return 0


def topics_last_message_id(args) -> int:
    with _client(args) as c:
        meta = c.admin.get_topic(args.topic)
        names = ([f"{meta.topic}-partition-{i}" for i in range(meta.partitions)]
                 if meta.partitions else [meta.topic])
        data = {n: (str(m) if (m := c.admin.last_message_id(n)) else None) for n in names}
    emit(data if meta.partitions else {"message_id": data[meta.topic]}, args.output)
    return 0


def topics_roll_ledger(args) -> int:
    with _client(args) as c:
        emit(c.admin.roll_ledger(args.topic), args.output)
    return 0


def produce(args) -> int:
    """Send the messages -n times; stop at the first failure and say how many of them were
    acknowledged before it (receipts come in send order, so: the first N)."""
    props = dict(args.property)
    payloads = [m.encode() for m in args.message]
    total = args.num_produce * len(payloads)
    sent = acked = 0
    first = last = None
    failure: list[errors.ShadowTopicError] = []

    def done(mid, exc):  # on the producer's receipt thread
        nonlocal first, last, acked
        if exc is not None:
            failure.append(exc)
        elif not failure:
            acked += 1
            first = first or mid
            last = mid

    try:
        with _client(args) as c:
            with c.create_producer(args.topic, producer_name="cli") as p:
                for _ in range(args.num_produce):
                    if failure:
                        break
                    for payload in payloads:
                        p.send_async(payload, key=args.key, properties=props, callback=done)
                        sent += 1
                    if sent % 100_000 == 0:
                        p.flush()
                p.flush()
    except errors.ShadowTopicError as exc:
        failure.append(exc)
    if failure:
        err = failure[0]
        if sent:
            err = type(err)(f"{err.message} ({acked} of {total} messages acknowledged before "
                            f"the error)")
        raise err
    result = {"produced": sent, "first_message_id": str(first), "last_message_id": str(last)}
    if args.output == "json":
        emit(result, "json")
    else:
        print(f"{sent} messages produced to {args.topic} ({first} .. {last})")
    return 0


def read(args) -> int:
    limit = args.num_messages
    if limit is None:
        limit = 0 if args.until_end else 1
    count = 0
    with _client(args) as c:
        with c.create_reader(args.topic, start=args.start, inclusive=args.inclusive,
                             read_compacted=args.compacted) as r:
            while limit == 0 or count < limit:
                if args.until_end and not r.has_message_available():
                    break
                try:
                    msg = r.read_next(timeout=args.timeout)
                except errors.Timeout:
                    if args.until_end:
                        break
                    raise
                message_line(msg, args.output)
                count += 1
    sys.stdout.flush()
    if args.output == "table":
        print(f"# {count} messages", file=sys.stderr)
    return 0


def consume(args) -> int:
    """Receive -n messages (0: until Ctrl-C) from a durable subscription, print each as
    `read` does and acknowledge the messages once they are printed and flushed (unless
    --no-ack): at least once on stdout."""
    limit = args.num_messages
    count = 0
    with _client(args) as c:
        with c.subscribe(args.topic, args.subscription, consumer_type=args.type,
                         initial_position=args.position,
                         consumer_name=args.consumer_name) as consumer:
            while limit == 0 or count < limit:
                try:
                    batch = [consumer.receive(timeout=args.timeout)]
                except errors.Timeout:
                    raise errors.Timeout(f"no message within {args.timeout:g}s ({count} "
                                         f"messages consumed)") from None
                more = 1000 if limit == 0 else min(1000, limit - count - 1)
                if more > 0:
                    batch += consumer.batch_receive(more, timeout=0)
                for msg in batch:
                    message_line(msg, args.output)
                sys.stdout.flush()
                if not args.no_ack:
                    for msg in batch:
                        consumer.acknowledge(msg)
                count += len(batch)
    if args.output == "table":
        print(f"# {count} messages", file=sys.stderr)
    return 0


def topics_subscriptions(args) -> int:
    with _client(args) as c:
        subs = c.admin.list_subscriptions(args.topic)
    if args.output == "json":
        emit(subs, "json")
    else:
        emit([{"subscription": s} for s in subs], "table", ["subscription"])
    return 0


def topics_create_subscription(args) -> int:
    with _client(args) as c:
        c.admin.create_subscription(args.topic, args.subscription, args.position)
    print(f"created subscription {args.subscription} on {args.topic}")
    return 0


def topics_unsubscribe(args) -> int:
    with _client(args) as c:
        change = c.admin.delete_subscription(args.topic, args.subscription, args.force,
                                             args.dry_run)
    if args.output == "json":
        emit(change, "json")
    else:
        verb = "would delete" if args.dry_run else "deleted"
        print(f"{verb} subscription {args.subscription} on {args.topic}")
        emit(change, "table")
    return 0


def topics_reset_cursor(args) -> int:
    position = args.time if args.time is not None else args.message_id
    with _client(args) as c:
        landed, clamped = c.admin.reset_cursor(args.topic, args.subscription, position,
                                               args.dry_run)
    if args.output == "json":
        emit({"message_id": str(landed), "clamped": clamped, "dry_run": args.dry_run}, "json")
    else:
        verb = "would reset" if args.dry_run else "reset"
        print(f"{verb} the cursor of {args.subscription} on {args.topic} to {landed}"
              + (" (clamped)" if clamped else ""))
    return 0


def topics_skip(args) -> int:
    with _client(args) as c:
        emit(c.admin.skip(args.topic, args.subscription, args.count, args.dry_run), args.output)
    return 0


def topics_clear_backlog(args) -> int:
    with _client(args) as c:
        emit(c.admin.clear_backlog(args.topic, args.subscription, args.dry_run), args.output)
    return 0


def topics_peek_messages(args) -> int:
    with _client(args) as c:
        msgs = c.admin.peek_messages(args.topic, args.subscription, args.count)
    for msg in msgs:
        message_line(msg, args.output)
    sys.stdout.flush()
    if args.output == "table":
        print(f"# {len(msgs)} messages", file=sys.stderr)
    return 0
