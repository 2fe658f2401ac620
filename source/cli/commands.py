"""What the `topics` and `namespaces` commands and `standalone` / `broker` do, through the
client library (shadowtopic.client). The commands that move messages are in
source/cli/messages.py, `brokers` in source/cli/brokers.py. main.py imports a command's
module only when it runs.

Every command that prints takes `-o json`: a command that changes something and has no
data of its own to show prints what it did, e.g. `{"topic": ..., "deleted": true}`."""
from __future__ import annotations

import argparse
import json
import os
import sys

from shadowtopic.cli.output import emit, fail, message_line
from shadowtopic.client import Client, CompactionStatus, Policies
from shadowtopic.core.names import canonical
from shadowtopic.core.policies import BacklogQuotaAction

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


def connect(args: argparse.Namespace) -> Client:
    """The client of every command: `--url`, `--operation-timeout`, the `--tls-` files,
    `--auth-token`."""
    return Client(args.url, operation_timeout=args.operation_timeout,
                  tls_trust_certs_file=args.tls_trust_certs_file,
                  tls_cert_file=args.tls_cert_file, tls_key_file=args.tls_key_file,
                  auth_token=args.auth_token)


def standalone(args) -> int:
    from shadowtopic import standalone as sa
    return sa.run(args.data_dir, args.wipe_data, args.port, args.etcd_port,
                  etcd_peer_port=args.etcd_peer_port, shadow_port=args.shadow_port,
                  compaction_port=args.compaction_port,
                  worker_args=["--spark-master", args.spark_master] if args.spark_master else [],
                  broker_args=[] if args.entry_cache_bytes is None
                  else ["--entry-cache-bytes", str(args.entry_cache_bytes)])


def broker(args) -> int:
    """`shadowtopic broker ...` becomes `python -m shadowtopic.broker ...` (exec, same pid):
    the CLI is a client and imports no server code."""
    os.execv(sys.executable, [sys.executable, "-m", "shadowtopic.broker", *args.args])
    return 1  # not reached: execv returns only by raising


def topics_create(args) -> int:
    with connect(args) as c:
        meta = c.admin.create_topic(args.topic, args.partitions, _policies(args),
                                    dict(args.property))
    emit(meta.to_dict(), args.output)
    return 0


def topics_delete(args) -> int:
    with connect(args) as c:
        c.admin.delete_topic(args.topic, args.force)
    done({"topic": canonical(args.topic), "deleted": True}, args.output,
          f"deleted {args.topic}")
    return 0


def done(result: dict, fmt: str, text: str) -> None:
    """What a command that changes something did: `result` as JSON, or one line of text."""
    if fmt == "json":
        emit(result, "json")
    else:
        print(text)


def topics_create_shadow_topic(args) -> int:
    with connect(args) as c:
        meta = c.admin.create_shadow_topic(args.topic, args.source, dict(args.property))
    emit(meta.to_dict(), args.output)
    return 0


def topics_get_shadow_topics(args) -> int:
    with connect(args) as c:
        shadows = c.admin.get_shadow_topics(args.topic)
    if args.output == "json":
        emit(shadows, "json")
    else:
        emit([{"shadow": s} for s in shadows], "table", ["shadow"])
    return 0


def topics_get_shadow_source(args) -> int:
    with connect(args) as c:
        source = c.admin.get_shadow_source(args.topic)
    if args.output == "json":
        emit({"topic": canonical(args.topic), "source": source}, "json")
    else:
        print(source)
    return 0


def topics_delete_shadow_topic(args) -> int:
    with connect(args) as c:
        c.admin.delete_shadow_topic(args.topic)
    done({"topic": canonical(args.topic), "deleted": True}, args.output,
          f"deleted shadow topic {args.topic}")
    return 0


def topics_compact(args) -> int:
    with connect(args) as c:
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
    with connect(args) as c:
        if not args.wait:
            status = c.admin.compaction_status(args.topic)
            emit(status.to_dict(), args.output)
            return _job_failed(status)
        last: CompactionStatus | None = None
        if sys.stdout.isatty() and args.output != "json":
            from shadowtopic.cli.output import compaction_progress
            last = compaction_progress(c.admin.watch_compaction(args.topic))
        else:
            for last in c.admin.watch_compaction(args.topic):
                print(json.dumps(last.to_dict()), flush=True)
    return _job_failed(last) if last is not None else 1


def topics_list(args) -> int:
    with connect(args) as c:
        topics = c.admin.list_topics(args.namespace)
    rows = [{"topic": t.topic, "kind": t.kind, "partitions": t.partitions, "source": t.source}
            for t in topics]
    if args.output == "json":
        emit(rows, "json")
    else:
        emit(rows, "table", ["topic", "kind", "partitions", "source"])
    return 0


def topics_stats(args) -> int:
    with connect(args) as c:
        emit(c.admin.stats(args.topic), args.output)
    return 0


def topics_stats_internal(args) -> int:
    with connect(args) as c:
        meta = c.admin.get_topic(args.topic)
        if meta.partitions:
            data = {f"{meta.topic}-partition-{i}":
                    c.admin.internal_stats(f"{meta.topic}-partition-{i}")
                    for i in range(meta.partitions)}
        else:
            data = c.admin.internal_stats(args.topic)
    if args.output == "table" and not meta.partitions:
        ledgers: object = data.pop("ledgers", [])
        emit(data, "table")
        if ledgers:
            emit(ledgers, "table", ["ledgerId", "state", "entries", "size", "path"])
    else:
        emit(data, args.output)
    return 0


def topics_truncate(args) -> int:
    with connect(args) as c:
        emit(c.admin.truncate(args.topic), args.output)
    return 0


def topics_get_policies(args) -> int:
    with connect(args) as c:
        emit(_policies_out(c.admin.get_policies(args.topic)), args.output)
    return 0


def topics_set_policies(args) -> int:
    update = _policies(args)
    if not update.as_dict():
        fail("set-policies needs at least one policy flag (see --help)")
    with connect(args) as c:
        emit(_policies_out(c.admin.set_policies(args.topic, update)), args.output)
    return 0


def namespaces_get_policies(args) -> int:
    with connect(args) as c:
        emit(_policies_out(c.admin.get_namespace_policies(args.namespace)), args.output)
    return 0


def _policy_field(name: str) -> str:
    """A policy named by its flag (message-ttl) or its field (message_ttl_seconds)."""
    key = name.strip().lstrip("-").replace("-", "_")
    if key in _POLICY_FLAGS.values():
        return key
    if key in _POLICY_FLAGS:
        return _POLICY_FLAGS[key]
    fail(f"--remove {name}: no such policy (one of "
         f"{', '.join(f.replace('_', '-') for f in _POLICY_FLAGS)})")


def namespaces_set_policies(args) -> int:
    update = _policies(args)
    remove = [_policy_field(n) for n in args.remove]
    if not update.as_dict() and not remove:
        fail("set-policies needs at least one policy flag or --remove (see --help)")
    with connect(args) as c:
        emit(_policies_out(c.admin.set_namespace_policies(args.namespace, update, remove)),
             args.output)
    return 0


def topics_lookup(args) -> int:
    with connect(args) as c:
        emit(c.admin.lookup(args.topic), args.output)
    return 0


def topics_last_message_id(args) -> int:
    """The newest message's id (per partition of a partitioned topic); with --compacted, the
    newest one a compacted reader reads."""
    with connect(args) as c:
        meta = c.admin.get_topic(args.topic)
        names = ([f"{meta.topic}-partition-{i}" for i in range(meta.partitions)]
                 if meta.partitions else [meta.topic])
        data = {n: (str(m) if (m := c.admin.last_message_id(n, args.compacted)) else None)
                for n in names}
    emit(data if meta.partitions else {"message_id": data[meta.topic]}, args.output)
    return 0


def topics_roll_ledger(args) -> int:
    with connect(args) as c:
        emit(c.admin.roll_ledger(args.topic), args.output)
    return 0


def topics_subscriptions(args) -> int:
    with connect(args) as c:
        subs = c.admin.list_subscriptions(args.topic)
    if args.output == "json":
        emit(subs, "json")
    else:
        emit([{"subscription": s} for s in subs], "table", ["subscription"])
    return 0


def topics_create_subscription(args) -> int:
    with connect(args) as c:
        c.admin.create_subscription(args.topic, args.subscription, args.position)
    done({"topic": canonical(args.topic), "subscription": args.subscription,
           "position": args.position, "created": True}, args.output,
          f"created subscription {args.subscription} on {args.topic}")
    return 0


def topics_unsubscribe(args) -> int:
    with connect(args) as c:
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
    with connect(args) as c:
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
    with connect(args) as c:
        emit(c.admin.skip(args.topic, args.subscription, args.count, args.dry_run), args.output)
    return 0


def topics_clear_backlog(args) -> int:
    with connect(args) as c:
        emit(c.admin.clear_backlog(args.topic, args.subscription, args.dry_run), args.output)
    return 0


def topics_peek_messages(args) -> int:
    with connect(args) as c:
        msgs = c.admin.peek_messages(args.topic, args.subscription, args.count)
    for msg in msgs:
        message_line(msg, args.output)
    sys.stdout.flush()
    if args.output == "table":
        print(f"# {len(msgs)} messages", file=sys.stderr)
    return 0
