"""`shadowtopic` command line: a thin layer over the client library.

    shadowtopic standalone [--data-dir ./data] [--wipe-data]
    shadowtopic topics create|delete|list|stats|stats-internal|truncate|get-policies|
                       set-policies|lookup|last-message-id|roll-ledger ...
    shadowtopic produce <topic> -m MSG [-k KEY] [-n N] [-p k=v ...]
    shadowtopic read <topic> [--start earliest|latest|L:E] [-n N | --until-end]

Every command that prints data takes `-o table` (default) or `-o json`; the broker is
`--url` / $SHADOWTOPIC_URL (default localhost:6650). Errors print one line and exit 1.
"""
from __future__ import annotations

import argparse
import sys

from source.cli import commands
from source.cli.output import fail
from source.cli.parse import boolean, duration, key_value, size
from source.core import errors


def _common(p: argparse.ArgumentParser, output: bool = True) -> None:
    p.add_argument("--url", default=None, help="broker URL (default $SHADOWTOPIC_URL or "
                                               "localhost:6650)")
    if output:
        p.add_argument("-o", "--output", choices=["table", "json"], default="table")


def _policy_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("policies")
    g.add_argument("--retention-time", type=duration, help="e.g. 7d, 12h, -1 = forever")
    g.add_argument("--retention-size", type=size, help="e.g. 10G, -1 = unlimited")
    g.add_argument("--max-message-size", type=size)
    g.add_argument("--compaction-threshold", type=size)
    g.add_argument("--retain-null-key", type=boolean)
    g.add_argument("--replicator-auto-reset-backlog-entries", type=int)
    g.add_argument("--ledger-max-entries", type=int)
    g.add_argument("--ledger-max-bytes", type=size)
    g.add_argument("--ledger-max-age", type=duration)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shadowtopic", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("standalone", help="run etcd and a broker on one data dir")
    p.add_argument("--data-dir", default="./data")
    p.add_argument("--wipe-data", action="store_true", help="delete the data dir first")
    p.add_argument("--port", type=int, default=6650)
    p.add_argument("--etcd-port", type=int, default=2379)
    p.set_defaults(func=commands.standalone)

    p = sub.add_parser("broker", help="run one broker process (see --help)", add_help=False)
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=commands.broker)

    topics = sub.add_parser("topics", help="manage topics").add_subparsers(dest="action",
                                                                           required=True)
    p = topics.add_parser("create", help="create a topic")
    p.add_argument("topic")
    p.add_argument("--partitions", type=int, default=0)
    p.add_argument("-p", "--property", type=key_value, action="append", default=[])
    _policy_flags(p)
    _common(p)
    p.set_defaults(func=commands.topics_create)

    p = topics.add_parser("delete", help="delete a topic and its data")
    p.add_argument("topic")
    p.add_argument("-f", "--force", action="store_true")
    _common(p, output=False)
    p.set_defaults(func=commands.topics_delete)

    p = topics.add_parser("list", help="list topics")
    p.add_argument("namespace", nargs="?", default="", help="tenant/namespace")
    _common(p)
    p.set_defaults(func=commands.topics_list)

    for name, func, text in [
            ("stats", commands.topics_stats, "topic stats (Pulsar field names)"),
            ("stats-internal", commands.topics_stats_internal, "ledgers and internal state"),
            ("truncate", commands.topics_truncate, "delete every sealed ledger"),
            ("get-policies", commands.topics_get_policies, "effective policies"),
            ("lookup", commands.topics_lookup, "which broker owns the topic"),
            ("last-message-id", commands.topics_last_message_id, "id of the newest message"),
            ("roll-ledger", commands.topics_roll_ledger, "seal the open ledger now")]:
        p = topics.add_parser(name, help=text)
        p.add_argument("topic")
        _common(p)
        p.set_defaults(func=func)

    p = topics.add_parser("set-policies", help="change some policies of a topic")
    p.add_argument("topic")
    _policy_flags(p)
    _common(p)
    p.set_defaults(func=commands.topics_set_policies)

    p = sub.add_parser("produce", help="produce messages")
    p.add_argument("topic")
    p.add_argument("-m", "--message", action="append", required=True,
                   help="payload (repeat for several messages; '' is a tombstone)")
    p.add_argument("-k", "--key", default=None)
    p.add_argument("-n", "--num-produce", type=int, default=1,
                   help="send the messages N times")
    p.add_argument("-p", "--property", type=key_value, action="append", default=[])
    _common(p)
    p.set_defaults(func=commands.produce)

    p = sub.add_parser("read", help="read messages with a non-durable reader")
    p.add_argument("topic")
    p.add_argument("-s", "--start", default="earliest", help="earliest | latest | L:E")
    p.add_argument("--inclusive", action="store_true", help="include the start message id")
    p.add_argument("-n", "--num-messages", type=int, default=None,
                   help="stop after N messages (default 1 without --until-end; 0 = follow)")
    p.add_argument("--until-end", action="store_true", help="stop at the end of the topic")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds to wait for the next message")
    _common(p)
    p.set_defaults(func=commands.read)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except errors.ShadowTopicError as exc:
        fail(f"{exc.reason}: {exc.message}")
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        code = 0
    sys.exit(code or 0)


if __name__ == "__main__":
    main()
