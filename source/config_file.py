"""The config file: one TOML file for every process, environment overrides, and how both
meet a process's command line.

    [broker]                      # the source broker (python -m shadowtopic.broker)
    port = 6650
    client_memory_bytes = "2G"

    [shadow]                      # the shadow broker (python -m shadowtopic.shadow.broker)
    [worker]                      # the compaction worker (python -m shadowtopic.compaction.worker)
    [standalone]                  # shadowtopic standalone

A section's keys are its process's flags, spelled with `_` (or `-`): `--client-memory-bytes`
is `client_memory_bytes`. They are read from the process's argparse parser, so every flag is
a key without a list kept here. Values take TOML types (`port = 6650`, `lease_ttl = 10`,
`spark_conf = ["k=v"]`) or the flag's own text (`"2G"`, `"30s"`); a flag that is a
comma-separated list also takes a TOML array. A flag without a value (`--wipe-data`) is a
boolean key. Each section stands alone: the shadow broker reads [shadow], not [broker].

Environment: `SHADOWTOPIC_CFG__<SECTION>__<KEY>` (upper case, two underscores around the
section), e.g. `SHADOWTOPIC_CFG__BROKER__CLIENT_MEMORY_BYTES=2G`. Its value is the flag's text
(a list in TOML array syntax). The prefix `SHADOWTOPIC_CFG__` is shared by no other variable
(`SHADOWTOPIC_URL`, `SHADOWTOPIC_ETCD`, `SHADOWTOPIC_FAILPOINTS`). `SHADOWTOPIC_ETCD` still
sets `etcd`, below its `SHADOWTOPIC_CFG__` variable.

Precedence: a flag, then the environment, then the file (`--config FILE`), then the flag's
default. An unknown section or key (in the file or the environment) is an error naming the
file (or variable), the section and key and, for the file, the line. `--print-config` prints
the process's effective section as TOML and exits (`shadowtopic config print --effective`
collects them); keys named like *password*, *token* or *secret* print as "<redacted>".
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from collections.abc import Mapping
from typing import Any

SECTIONS = ("broker", "shadow", "worker", "standalone")
ENV_PREFIX = "SHADOWTOPIC_CFG__"
#: older variables that set one key, below the key's SHADOWTOPIC_CFG__ variable
LEGACY_ENV = {"etcd": "SHADOWTOPIC_ETCD"}
SECRET = re.compile(r"password|token|secret", re.I)
REDACTED = "<redacted>"
#: flags that are not keys: they say which file to read and what to do with it
_NOT_KEYS = {"help", "config", "print_config"}


class ConfigError(ValueError):
    """A config file or variable that cannot be used (the message is one line)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`--config FILE` and `--print-config` on a process's parser."""
    p.add_argument("--config", default=None, metavar="FILE",
                   help="a TOML config file (flags win over the environment, the "
                        "environment over the file)")
    p.add_argument("--print-config", action="store_true",
                   help="print this process's effective config as TOML and exit")


def keys_of(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The config keys of a parser: every `--flag` (its dest) but --help and --config."""
    # argparse lists a parser's actions only in this attribute
    return {a.dest: a for a in p._actions  # noqa: SLF001
            if a.dest not in _NOT_KEYS and any(s.startswith("--") for s in a.option_strings)}


def parse(p: argparse.ArgumentParser, section: str, argv: list[str] | None,
          environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Parse `argv` with the file (--config) and the environment under the flags. A config
    error exits with one `error:` line (status 1); `--print-config` prints and exits 0."""
    environ = os.environ if environ is None else environ
    argv = sys.argv[1:] if argv is None else argv
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    path = pre.parse_known_args(argv)[0].config
    try:
        values = layered(p, section, path, environ)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    p.set_defaults(**values)
    ns = p.parse_args(argv)
    if getattr(ns, "print_config", False):
        sys.stdout.write(to_toml({section: effective(p, ns)}))
        raise SystemExit(0)
    return ns


def layered(p: argparse.ArgumentParser, section: str, path: str | None,
            environ: Mapping[str, str]) -> dict[str, Any]:
    """The values the file and then the environment give `section` (each converted by its
    flag's type), which become the parser's defaults; raises ConfigError."""
    keys = keys_of(p)
    values: dict[str, Any] = {}
    if path is not None:
        doc, text = read_file(path)
        for key, value in doc.get(section, {}).items():
            name = key.replace("-", "_")
            where = f"{path}:{_line_of(text, section, key)}: [{section}] {key}"
            if name not in keys:
                raise ConfigError(f"{where}: unknown key (known: {', '.join(sorted(keys))})")
            values[name] = convert(keys[name], value, where)
    for name, var in LEGACY_ENV.items():
        if name in keys and var in environ:
            values[name] = convert(keys[name], environ[var], var, from_env=True)
    for var, raw in environ.items():
        if not var.startswith(ENV_PREFIX):
            continue
        sec, _, key = var[len(ENV_PREFIX):].partition("__")
        if sec.lower() not in SECTIONS or not key:
            raise ConfigError(f"{var}: expected {ENV_PREFIX}<SECTION>__<KEY> with SECTION one "
                              f"of {', '.join(s.upper() for s in SECTIONS)}")
        if sec.lower() != section:
            continue
        name = key.lower()
        if name not in keys:
            raise ConfigError(f"{var}: unknown key {name!r} of [{section}]")
        values[name] = convert(keys[name], raw, var, from_env=True)
    return values


def read_file(path: str) -> tuple[dict[str, Any], str]:
    """The parsed file and its text; every top-level entry must be a known section."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    for name, value in doc.items():
        if not isinstance(value, dict):
            raise ConfigError(f"{path}:{_line_of(text, None, name)}: key {name!r} is outside "
                              f"a section (sections: {', '.join(SECTIONS)})")
        if name not in SECTIONS:
            raise ConfigError(f"{path}:{_line_of(text, name, None)}: unknown section "
                              f"[{name}] (sections: {', '.join(SECTIONS)})")
    return doc, text


def convert(action: argparse.Action, value: Any, where: str, from_env: bool = False) -> Any:
    """A file or environment value as the flag's dest would hold it (raises ConfigError)."""
    try:
        if action.nargs == 0:                      # store_true / store_false
            if isinstance(value, str):
                value = _boolean(value)
            if not isinstance(value, bool):
                raise ValueError(f"expected true or false, not {value!r}")
            return value
        # argparse names its append action's class only privately
        if isinstance(action, argparse._AppendAction):  # noqa: SLF001
            if from_env:
                value = _toml_value(value) if value.lstrip().startswith("[") else [value]
            items = value if isinstance(value, list) else [value]
            return [_one(action, item) for item in items]
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        return _one(action, value)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _one(action: argparse.Action, value: Any) -> Any:
    convert = action.type
    out: object
    if convert is None:
        out = value if isinstance(value, str) else str(value)
    elif not callable(convert):  # a name registered with the parser: none of ours is
        raise ValueError(f"--{action.dest.replace('_', '-')}: type {convert!r} is not callable")
    elif isinstance(value, bool):
        raise ValueError(f"expected a value for --{action.dest.replace('_', '-')}, "
                         f"not {str(value).lower()}")
    elif isinstance(value, str) or convert in (int, float):
        out = convert(value)
    else:
        out = convert(str(value))
    if action.choices is not None and out not in action.choices:
        raise ValueError(f"{out!r} is not one of {', '.join(map(str, action.choices))}")
    return out


def _boolean(text: str) -> bool:
    t = text.strip().lower()
    if t in ("true", "yes", "1", "on"):
        return True
    if t in ("false", "no", "0", "off"):
        return False
    raise ValueError(f"expected true or false, not {text!r}")


def _toml_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"not a TOML array: {exc}") from None


def _line_of(text: str, section: str | None, key: str | None) -> int | str:
    """The line of `[section]` (key None) or of `key` in `section` (None: before any
    section); '?' when it is not found (a dotted or inline table)."""
    current = None
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        m = re.fullmatch(r"\[\s*([\w.-]+|\"[^\"]*\")\s*\](\s*#.*)?", s)
        if m:
            current = m.group(1).strip('"')
            if key is None and current == section:
                return n
            continue
        if key is not None and current == section:
            m = re.match(r"""(["']?)([\w-]+)\1\s*=""", s)
            if m and m.group(2) == key:
                return n
    return "?"


# ---- printing ------------------------------------------------------------------------------

def effective(p: argparse.ArgumentParser, ns: argparse.Namespace) -> dict[str, Any]:
    """Every key of `p` with its value in `ns`."""
    return {name: getattr(ns, name, None) for name in keys_of(p)}


def to_toml(sections: Mapping[str, Mapping[str, Any]]) -> str:
    """TOML for sections of values (secrets redacted; an unset value as a comment)."""
    out = []
    for section, values in sections.items():
        out.append(f"[{section}]")
        for key, value in values.items():
            if value is not None and SECRET.search(key):
                value = REDACTED
            out.append(f"# {key} is not set" if value is None else f"{key} = {_toml(value)}")
        out.append("")
    return "\n".join(out)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if value == value and abs(value) != float("inf") else \
            ("nan" if value != value else ("inf" if value > 0 else "-inf"))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    text = str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
