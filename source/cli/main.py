"""`shadowtopic` command line: a thin layer over the client library.

    shadowtopic standalone [--data-dir ./data] [--wipe-data] [--config FILE] [--port N ...]
    shadowtopic config print [--effective] [--config FILE]
    shadowtopic topics create|delete|list|stats|stats-internal|truncate|get-policies|
                       set-policies|lookup|last-message-id|roll-ledger|compact|
                       compaction-status [-w] ...
    shadowtopic topics create-shadow-topic <shadow> --source SRC [-p k=v ...]
    shadowtopic topics get-shadow-topics <source> | get-shadow-source <shadow> |
                       delete-shadow-topic <shadow>
    shadowtopic topics subscriptions|create-subscription|unsubscribe|reset-cursor|skip|
                       clear-backlog|peek-messages <topic> -s SUB ...
    shadowtopic namespaces get-policies <tenant/ns> | set-policies <tenant/ns> [flags]
                       [--remove POLICY ...]
    shadowtopic tenants create|list|delete ...; namespaces create|list|delete ...;
    shadowtopic namespaces|topics grant-permission|revoke-permission|permissions ...
                       (access_cmd.py)
    shadowtopic produce <topic> -m MSG [-k KEY] [-n N] [-p k=v ...]
    shadowtopic produce <topic> -f FILE|- [-k KEY | --key-separator SEP] [-p k=v ...]
    shadowtopic read <topic> [--start earliest|latest|L:E] [-n N | --until-end] [--compacted]
                       [--parquet FILE]
    shadowtopic consume <topic> -s SUB [-t TYPE] [-p earliest|latest|L:E] [-n N] [--no-ack]
    shadowtopic brokers list|health [--etcd HOST:PORT[,HOST:PORT...]] [--cluster C]
    shadowtopic tokens create-secret-key|create-key-pair|create|validate ...  (tokens_cmd.py)
    shadowtopic etcd-auth setup --root-password-file F --broker-password-file F ...
                       (etcd_auth_cmd.py)
    shadowtopic broker [BROKER FLAGS ...]      (shadowtopic broker --help)
    shadowtopic --version

Every command that prints takes `-o table` (default) or `-o json`; the broker is
`--url` / $SHADOWTOPIC_URL (default localhost:6650); `--operation-timeout` bounds how long a
call retries temporary errors (default 10 s: shorter than the library's 30 s, so a wrong URL
fails soon). These go before or after the subcommand.
Every error, usage errors included, prints one `error:` line on stderr and exits 1; Ctrl-C
exits 130 with no traceback, while the CLI starts too.
"""
from __future__ import annotations

import os
import signal
import sys

# Ctrl-C while the module loads (most of a short command's time: gRPC, protobuf) is held
# until it has loaded (the end of this file), then exits 130 quietly, as Ctrl-C does later:
# an import cut in the middle would print a traceback (or worse: CPython can turn it into a
# TypeError). Each command's module imports only what it needs (rich only to print a table,
# etcd only for `brokers`, no server code). Python's own start-up, before this file runs
# (site, ~20 ms), is out of reach: a Ctrl-C then ends the process as Python does.
_held: list[int] = []
_previous = signal.getsignal(signal.SIGINT)
if _previous is signal.default_int_handler:  # not when SIGINT is ignored or someone's own
    try:
        signal.signal(signal.SIGINT, lambda signum, frame: _held.append(signum))
    except ValueError:  # imported outside the main thread: no handler to set
        _previous = None
else:
    _previous = None
try:
    import argparse
    import os
    from typing import NoReturn

    from shadowtopic import failpoints
    failpoints.hit("cli.loading")
    from shadowtopic.cli import (
        access_cmd,
        brokers,
        commands,
        config_cmd,
        etcd_auth_cmd,
        messages,
        standalone_cmd,
        tables_cmd,
        tokens_cmd,
    )
    from shadowtopic.cli.output import fail
    from shadowtopic.core import errors
    from shadowtopic.core.argtypes import (
        boolean,
        count,
        duration,
        key_value,
        positive,
        seconds,
        size,
        subscription_type,
        time_ms,
    )
    from shadowtopic.core.policies import BacklogQuotaAction
except BaseException:
    if _previous is not None:
        signal.signal(signal.SIGINT, _previous)
    raise

#: how long a CLI call retries temporary errors (the library's default is 30 s)
OPERATION_TIMEOUT_S = 10.0


class Parser(argparse.ArgumentParser):
    """argparse, except that a usage error is one `error:` line and exit code 1 like every
    other CLI error (argparse prints the usage and exits 2). Subparsers are Parsers too."""

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: {message} (see {self.prog} --help)")


#: the client's TLS files and token (each also from its environment variable: `TLS_ENV`)
TLS_FLAGS = {
    "--tls-trust-certs-file": "dial brokers with TLS, trusting these CA certificates "
                              "($SHADOWTOPIC_TLS_TRUST_CERTS_FILE; a shadowtopic+ssl:// URL "
                              "asks for TLS with the system's CAs)",
    "--tls-cert-file": "this client's certificate, for mutual TLS "
                       "($SHADOWTOPIC_TLS_CERT_FILE)",
    "--tls-key-file": "the key of --tls-cert-file ($SHADOWTOPIC_TLS_KEY_FILE)",
    "--auth-token": "the token every call presents ($SHADOWTOPIC_AUTH_TOKEN; "
                    "file:///path reads it from a file)",
}
TLS_ENV = {"tls_trust_certs_file": "SHADOWTOPIC_TLS_TRUST_CERTS_FILE",
           "tls_cert_file": "SHADOWTOPIC_TLS_CERT_FILE",
           "tls_key_file": "SHADOWTOPIC_TLS_KEY_FILE",
           "auth_token": "SHADOWTOPIC_AUTH_TOKEN"}


def _common(p: argparse.ArgumentParser, output: bool = True) -> None:
    """--url and -o, on the main parser and on a subcommand: SUPPRESS keeps a subcommand's
    unset option from overwriting the value given before the subcommand."""
    p.add_argument("--url", default=argparse.SUPPRESS,
                   help="broker URL (default $SHADOWTOPIC_URL or localhost:6650)")
    p.add_argument("--operation-timeout", type=seconds, default=argparse.SUPPRESS,
                   metavar="SECONDS",
                   help="how long a call retries temporary errors (a broker restarting, "
                        f"unreachable) before it fails (default {OPERATION_TIMEOUT_S:g})")
    for flag, text in TLS_FLAGS.items():
        p.add_argument(flag, default=argparse.SUPPRESS,
                       metavar="TOKEN" if flag == "--auth-token" else "PEM", help=text)
    if output:
        p.add_argument("-o", "--output", choices=["table", "json"], default=argparse.SUPPRESS,
                       help="table (default) or json")


def _policy_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("policies")
    g.add_argument("--retention-time", type=duration, help="e.g. 7d, 12h, -1 = forever")
    g.add_argument("--retention-size", type=size, help="e.g. 10G, -1 = unlimited")
    g.add_argument("--max-message-size", type=size)
    g.add_argument("--compaction-threshold", type=size)
    g.add_argument("--delete-retention", type=duration, metavar="DURATION",
                   help="how long compaction keeps a delete (tombstone) in the compacted "
                        "ledger, e.g. 1d (the default), 0 = drop it at once")
    g.add_argument("--retain-null-key", type=boolean)
    g.add_argument("--replicator-auto-reset-backlog-entries", type=int)
    g.add_argument("--ledger-max-entries", type=int)
    g.add_argument("--ledger-max-bytes", type=size)
    g.add_argument("--ledger-max-age", type=duration)
    g.add_argument("--max-producers", type=count, help="0 = no limit")
    g.add_argument("--max-subscriptions", type=count, help="0 = no limit")
    g.add_argument("--max-consumers", type=count, help="per subscription, 0 = no limit")
    g.add_argument("--retention-keeps-shadow-backlog", type=boolean, metavar="true|false",
                   help="retention also keeps the ledgers the shadows' durable subscriptions "
                        "still need (default false; truncate still deletes)")
    g.add_argument("--message-ttl", type=duration, metavar="DURATION",
                   help="acknowledge, for every durable subscription, messages older than "
                        "this, e.g. 1h (0 = off, the default)")
    g.add_argument("--backlog-quota-size", type=size, metavar="SIZE",
                   help="backlog quota of the slowest subscription in bytes, e.g. 10G "
                        "(-1 = no limit, the default)")
    g.add_argument("--backlog-quota-age", type=duration, metavar="DURATION",
                   help="backlog quota: age of the slowest subscription's oldest "
                        "unacknowledged message, e.g. 1d (-1 = no limit, the default)")
    g.add_argument("--backlog-quota-action", type=_quota_action,
                   metavar="producer_request_hold|producer_exception|consumer_backlog_eviction",
                   help="past the quota: produce waits (the default), produce fails, or the "
                        "slowest subscriptions skip their oldest messages")
    g.add_argument("--subscription-expiration", type=duration, metavar="DURATION",
                   help="delete durable subscriptions with no consumer for this long, e.g. "
                        "7d (0 = never, the default)")


def _quota_action(text: str) -> BacklogQuotaAction:
    try:
        return BacklogQuotaAction.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _subscription(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic")
    p.add_argument("-s", "--subscription", required=True, help="subscription name")


class _Version(argparse.Action):
    """`--version`: the installed package's version (read only when asked)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                         nargs=0, help="print the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import PackageNotFoundError, version
        try:
            text = version("shadowtopic")
        except PackageNotFoundError:
            text = "unknown (not installed)"
        print(f"shadowtopic {text}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="shadowtopic", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_Version)
    _common(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("standalone", help="run etcd, a source broker, a shadow broker and a "
                                          "compaction worker on one data dir")
    standalone_cmd.add_arguments(p)  # parsed by standalone_cmd.parse (see parse_args)
    p.set_defaults(func=standalone_cmd.run)

    config_cmd.add_parser(sub)
    tokens_cmd.add_parser(sub)
    tables_cmd.add_parser(sub)
    etcd_auth_cmd.add_parser(sub)

    # every argument after `broker` is the broker's own (`shadowtopic broker --help` lists
    # them): parse_args hands it what this parser does not know
    p = sub.add_parser("broker", help="run one broker process (shadowtopic broker --help)",
                       add_help=False)
    p.set_defaults(func=commands.broker)

    group = sub.add_parser("brokers", help="the brokers registered in etcd").add_subparsers(
        dest="action", required=True)
    for name, func, text in [
            ("list", brokers.list_brokers, "every registered broker: id, url, roles, metrics "
             "URL and load (topics, subscriptions)"),
            ("health", brokers.health, "ask every registered broker its gRPC health, per "
             "service; exit 1 unless all are SERVING")]:
        p = group.add_parser(name, help=text)
        p.add_argument("--etcd", default=None, metavar="HOST:PORT",
                       help="etcd endpoints, comma-separated (default $SHADOWTOPIC_ETCD or "
                            "127.0.0.1:2379)")
        p.add_argument("--cluster", default=None,
                       help="only this cluster's brokers (default: all)")
        p.add_argument("--timeout", type=seconds, default=3.0,
                       help="seconds to wait for etcd (health: and for each broker's answer; "
                            "default 3)")
        etcd_auth_cmd.add_etcd_flags(p)
        p.add_argument("-o", "--output", choices=["table", "json"], default=argparse.SUPPRESS,
                       help="table (default) or json")
        p.set_defaults(func=func)

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
    _common(p)
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
        if name == "last-message-id":
            p.add_argument("--compacted", action="store_true",
                           help="the newest message a compacted reader reads (read --compacted)")
        _common(p)
        p.set_defaults(func=func)

    p = topics.add_parser("create-shadow-topic",
                          help="create a read-only shadow of a source topic (no data copied)")
    p.add_argument("topic", metavar="shadow")
    p.add_argument("-s", "--source", required=True, help="the source topic")
    p.add_argument("-p", "--property", "--properties", dest="property", type=key_value,
                   action="append", default=[], help="k=v (repeat for more)")
    _common(p)
    p.set_defaults(func=commands.topics_create_shadow_topic)

    p = topics.add_parser("get-shadow-topics", help="list the shadow topics of a source topic")
    p.add_argument("topic", metavar="source")
    _common(p)
    p.set_defaults(func=commands.topics_get_shadow_topics)

    p = topics.add_parser("get-shadow-source", help="the source topic of a shadow topic")
    p.add_argument("topic", metavar="shadow")
    _common(p)
    p.set_defaults(func=commands.topics_get_shadow_source)

    p = topics.add_parser("delete-shadow-topic", help="delete a shadow topic, its "
                          "subscriptions and cursors (never its source's data)")
    p.add_argument("topic", metavar="shadow")
    _common(p)
    p.set_defaults(func=commands.topics_delete_shadow_topic)

    p = topics.add_parser("compact", help="compact a source topic (latest value per key); "
                          "prints the job id")
    p.add_argument("topic")
    _common(p)
    p.set_defaults(func=commands.topics_compact)

    p = topics.add_parser("compaction-status", help="the newest compaction job of a topic")
    p.add_argument("topic")
    p.add_argument("-w", "--wait", action="store_true",
                   help="follow the job to its end (progress bar on a terminal, JSON lines "
                        "otherwise); exit 1 if it failed")
    _common(p)
    p.set_defaults(func=commands.topics_compaction_status)

    p = topics.add_parser("set-policies", help="change some policies of a topic")
    p.add_argument("topic")
    _policy_flags(p)
    _common(p)
    p.set_defaults(func=commands.topics_set_policies)

    access_cmd.add_topic_actions(topics, _common)
    access_cmd.add_tenants(sub, _common)
    namespaces = sub.add_parser("namespaces", help="namespaces, their policies (the defaults "
                                "of their topics) and grants").add_subparsers(
                                    dest="action", required=True)
    access_cmd.add_namespace_actions(namespaces, _common)
    p = namespaces.add_parser("get-policies", help="the policies set on a namespace (only "
                              "those: topics get-policies shows a topic's effective ones)")
    p.add_argument("namespace", help="tenant/namespace")
    _common(p)
    p.set_defaults(func=commands.namespaces_get_policies)
    p = namespaces.add_parser("set-policies", help="set or --remove policies of a namespace: "
                              "every topic of it without its own value takes them")
    p.add_argument("namespace", help="tenant/namespace")
    _policy_flags(p)
    p.add_argument("--remove", action="append", default=[], metavar="POLICY",
                   help="unset a policy (its flag name, e.g. message-ttl): its topics fall "
                        "back to the default; repeat for more")
    _common(p)
    p.set_defaults(func=commands.namespaces_set_policies)

    p = topics.add_parser("subscriptions", help="list the subscriptions of a topic")
    p.add_argument("topic")
    _common(p)
    p.set_defaults(func=commands.topics_subscriptions)

    p = topics.add_parser("create-subscription", help="create a durable subscription")
    _subscription(p)
    p.add_argument("-m", "--messageId", "--message-id", "--position", dest="position",
                   default="latest",
                   help="where it starts: earliest | latest (default) | L:E")
    _common(p)
    p.set_defaults(func=commands.topics_create_subscription)

    p = topics.add_parser("unsubscribe", help="delete a subscription")
    _subscription(p)
    p.add_argument("-f", "--force", action="store_true",
                   help="also when consumers are attached (they are disconnected)")
    p.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
    _common(p)
    p.set_defaults(func=commands.topics_unsubscribe)

    p = topics.add_parser("reset-cursor", help="move a subscription's cursor")
    _subscription(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("-m", "--messageId", "--message-id", dest="message_id",
                   help="L:E: the next message delivered is this one (or the next that exists)")
    g.add_argument("-t", "--time", type=time_ms, dest="time",
                   help="the first message published at or after TIME: a duration ago (10m, "
                        "1h, 2d), an ISO 8601 timestamp or ms since the epoch")
    p.add_argument("--dry-run", action="store_true", help="say where it would land, move nothing")
    _common(p)
    p.set_defaults(func=commands.topics_reset_cursor)

    p = topics.add_parser("skip", help="acknowledge the next N messages of a subscription")
    _subscription(p)
    p.add_argument("-n", "--count", type=count, required=True)
    p.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
    _common(p)
    p.set_defaults(func=commands.topics_skip)

    p = topics.add_parser("clear-backlog", help="acknowledge a subscription's whole backlog")
    _subscription(p)
    p.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
    _common(p)
    p.set_defaults(func=commands.topics_clear_backlog)

    p = topics.add_parser("peek-messages", help="show a subscription's next messages, "
                                                "without consuming them")
    _subscription(p)
    p.add_argument("-n", "--count", type=positive, default=1)
    _common(p)
    p.set_defaults(func=commands.topics_peek_messages)

    p = sub.add_parser("produce", help="produce messages")
    p.add_argument("topic")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("-m", "--message", action="append",
                      help="payload (repeat for several messages; '' is a tombstone)")
    what.add_argument("-f", "--file", default=None, metavar="FILE",
                      help="send each line of FILE as a message (- for stdin, read as it "
                           "comes; empty lines skipped)")
    p.add_argument("-k", "--key", default=None, help="the key of every message")
    p.add_argument("--key-separator", default=None, metavar="SEP",
                   help="split each message (each line) at its first SEP into key and "
                        "payload, e.g. ':' sends 'user-1:hello' with key user-1")
    p.add_argument("-n", "--num-produce", type=positive, default=1,
                   help="send the -m messages N times")
    p.add_argument("-p", "--property", type=key_value, action="append", default=[])
    p.add_argument("-z", "--compression", choices=("none", "lz4", "zstd"), default="none",
                   help="compress each payload (readers decompress it)")
    _common(p)
    p.set_defaults(func=messages.produce)

    p = sub.add_parser("read", help="read messages with a non-durable reader")
    p.add_argument("topic")
    p.add_argument("-s", "--start", default="earliest",
                   help="earliest | latest | L:E (the messages after L:E; see --inclusive)")
    p.add_argument("--inclusive", action="store_true", help="include the start message id")
    p.add_argument("-n", "--num-messages", type=count, default=None,
                   help="stop after N messages (default 1 without --until-end; 0 = no limit)")
    p.add_argument("--until-end", action="store_true", help="stop at the end of the topic")
    p.add_argument("--compacted", action="store_true",
                   help="read the compacted view (latest value per key up to the horizon)")
    p.add_argument("--timeout", type=seconds, default=30.0,
                   help="seconds to wait for the next message")
    p.add_argument("--parquet", metavar="FILE", default=None,
                   help="write what is read to FILE as Parquet (the columns of docs/FORMAT.md "
                        "and partition) instead of printing it")
    _common(p)
    p.set_defaults(func=messages.read)

    p = sub.add_parser("consume", help="consume messages from a durable subscription")
    _subscription(p)
    p.add_argument("-t", "--type", "--subscription-type", dest="type", type=subscription_type,
                   default="exclusive",
                   help="exclusive (default) | shared | failover | key_shared")
    p.add_argument("-p", "--position", "--subscription-position", dest="position",
                   default="latest",
                   help="where a new subscription starts: latest (default) | earliest | L:E")
    p.add_argument("-n", "--num-messages", type=count, default=1,
                   help="stop after N messages (default 1; 0 = until Ctrl-C)")
    p.add_argument("--consumer-name", default="")
    p.add_argument("--timeout", type=seconds, default=None,
                   help="fail when no message arrives within this many seconds "
                        "(default: wait for ever)")
    p.add_argument("--no-ack", action="store_true", help="do not acknowledge the messages")
    _common(p)
    p.set_defaults(func=messages.consume)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["standalone"]:  # its flags over the config file and the environment
        return standalone_cmd.parse(argv[1:], Parser)
    if argv[:1] == ["broker"]:  # the rest are the broker's own flags, --help too
        return argparse.Namespace(func=commands.broker, args=argv[1:], url=None,
                                  output="table", operation_timeout=None,
                                  tls_trust_certs_file=None, tls_cert_file=None,
                                  tls_key_file=None, auth_token=None)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.func is commands.broker:  # `shadowtopic -o json broker --help`, say
        args.args = unknown
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.url = getattr(args, "url", None)
    for name, env in TLS_ENV.items():
        setattr(args, name, getattr(args, name, None) or os.environ.get(env) or None)
    args.operation_timeout = getattr(args, "operation_timeout", OPERATION_TIMEOUT_S)
    args.output = getattr(args, "output", "table")
    return args


def main(argv: list[str] | None = None) -> NoReturn:
    """Run one command. Exit 0; or 1 after one `error:` line on stderr, never a traceback;
    130 on Ctrl-C; 0 when whoever read the output stopped reading (`| head`)."""
    try:
        args = parse_args(argv)
        code = args.func(args) or 0
        sys.stdout.flush()  # a closed pipe raises here, not while Python exits
    except errors.ShadowTopicError as exc:
        fail(f"{exc.reason}: {exc.message}")
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        _discard_stdout()
        code = 0
    except Exception as exc:  # noqa: BLE001 - the last resort: one line, not a traceback
        fail(f"internal: {type(exc).__name__}: {exc}")
    sys.exit(code)


def _discard_stdout() -> None:
    """Point stdout at /dev/null: Python flushes it again at exit, and what is still buffered
    would raise BrokenPipeError once more (the fix Python's documentation gives for EPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


# Loaded: Ctrl-C from here on is main()'s (130, quietly). Held until the whole module has
# run, not only its imports: one in the definitions above printed a traceback (make test).
failpoints.hit("cli.loaded")
if _previous is not None:
    signal.signal(signal.SIGINT, _previous)
if _held:
    sys.exit(130)

if __name__ == "__main__":
    main()
