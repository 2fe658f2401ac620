"""The one logging setup of every process (source broker, shadow broker, compaction worker,
standalone): `--log-format console|json` and `--log-level`, on stderr.

    console:
    2026-11-26 11:08:36,123 INFO shadowtopic.broker: loaded persistent://a/b/t (epoch 3, ...)
    json (one line):
    {"ts": "2026-11-26T11:08:36.123Z", "level": "INFO", "logger": "shadowtopic.broker",
     "msg": "loaded persistent://a/b/t (epoch 3, ...)", "topic": "persistent://a/b/t", "epoch": 3}

A JSON line is one object: `ts` (UTC, ISO 8601, milliseconds), `level`, `logger`, `msg`, then
the line's fields at the top level, then `exc` (a traceback) when there is one. Fields are
what a call passes as `extra={...}`; the names in use are `topic`, `shadow`, `subscription`,
`ledger`, `job`, `epoch` and `error`. A field named like one of the first four keys is
written as `field_<name>`. A record without a `topic` field whose first argument is a topic
(a `TopicName`, or text starting `persistent://`), as in `log.info("%s: ...", topic)`, gets
that topic as its `topic` field. Python warnings go through logging too; py4j's chatter is
kept at WARNING or above.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import UTC, datetime
from typing import IO

FORMATS = ("console", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
CONSOLE = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_BASE = ("ts", "level", "logger", "msg")
#: attributes every LogRecord has: whatever else a record carries came from `extra`
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-format", choices=FORMATS, default="console",
                   help="console (default): one readable line per record; json: one JSON "
                        "object per line (ts, level, logger, msg and the record's fields)")
    p.add_argument("--log-level", type=str.upper, choices=LEVELS, default="INFO",
                   help="the least severe level logged (default INFO)")


def fields_of(record: logging.LogRecord) -> dict:
    """The fields a record was given (`extra=`)."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class TopicField(logging.Filter):
    """Gives a record whose first argument is a topic its `topic` field (see above)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "topic" not in vars(record) and isinstance(record.args, tuple) and record.args:
            first = record.args[0]
            if type(first).__name__ == "TopicName" or (
                    isinstance(first, str) and first.startswith(_TOPIC_PREFIXES)):
                record.topic = str(first)
        return True


_TOPIC_PREFIXES = ("persistent://", "non-persistent://")
#: fields the console line leaves out when the message names them already
_SAID = ("topic", "shadow")


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module's docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": datetime.fromtimestamp(record.created, UTC)
               .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
               "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        for key, value in fields_of(record).items():
            out[f"field_{key}" if key in _BASE else key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class ConsoleFormatter(logging.Formatter):
    """The classic line, with the record's fields appended as key=value (but a topic or
    shadow the message already names)."""

    def __init__(self) -> None:
        super().__init__(CONSOLE)

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        message = record.getMessage()
        extra = [f"{k}={v}" for k, v in fields_of(record).items()
                 if not (k in _SAID and str(v) in message)]
        return line + "  " + " ".join(extra) if extra else line


def setup(fmt: str = "console", level: str = "INFO", stream: IO[str] | None = None) -> None:
    """Route every logger of this process to one handler on `stream` (stderr)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else ConsoleFormatter())
    handler.addFilter(TopicField())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)
    py4j = logging.getLogger("py4j")
    py4j.setLevel(max(logging.WARNING, root.level))


def setup_from(args: argparse.Namespace) -> None:
    """`setup` with the flags `add_arguments` added."""
    setup(getattr(args, "log_format", "console"), getattr(args, "log_level", "INFO"))
