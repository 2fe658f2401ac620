"""`shadowtopic config print [--effective] [--config FILE]`: the config file and the
environment as TOML (source/config_file.py owns the format and the precedence).

Without --effective: what the file and the `SHADOWTOPIC_CFG__*` variables set, section by
section (a variable over the file). With --effective: every key of every process with the
value it would run with (flag defaults, file, environment), each key checked: the brokers'
and the worker's sections come from those processes themselves (`python -m <role>
--print-config`, run side by side: the CLI imports no server code), the [standalone] section
from its flags here. Keys named like *password*, *token* or *secret* print as "<redacted>".
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

from shadowtopic import config_file
from shadowtopic.cli import standalone_cmd
from shadowtopic.cli.output import fail

#: the section of each process, and the module that runs it
ROLES = {"broker": "shadowtopic.broker", "shadow": "shadowtopic.shadow.broker",
         "worker": "shadowtopic.compaction.worker"}
TIMEOUT_S = 60


def add_parser(sub) -> None:
    """`config print` under the CLI's subcommands."""
    cfg = sub.add_parser("config", help="the config file: print it, or the effective config")
    actions = cfg.add_subparsers(dest="action", required=True)
    p = actions.add_parser("print", help="print the config (TOML) from the file and the "
                                         "environment; --effective: every key's value")
    p.add_argument("--config", default=None, metavar="FILE", help="the TOML config file")
    p.add_argument("--effective", action="store_true",
                   help="every key of every process with the value it runs with")
    p.set_defaults(func=print_config)


def print_config(args: argparse.Namespace) -> int:
    try:
        text = effective(args.config) if args.effective else explicit(args.config)
    except config_file.ConfigError as exc:
        fail(str(exc))
    sys.stdout.write(text)
    return 0


def explicit(path: str | None) -> str:
    """What the file and the environment set, the environment over the file."""
    sections: dict[str, dict] = {name: {} for name in config_file.SECTIONS}
    if path is not None:
        doc, _ = config_file.read_file(path)
        for name, values in doc.items():
            sections[name].update({k.replace("-", "_"): v for k, v in values.items()})
    for var, raw in sorted(os.environ.items()):
        if var.startswith(config_file.ENV_PREFIX):
            sec, _, key = var[len(config_file.ENV_PREFIX):].partition("__")
            if sec.lower() not in sections or not key:
                raise config_file.ConfigError(f"{var}: expected {config_file.ENV_PREFIX}"
                                              "<SECTION>__<KEY>")
            sections[sec.lower()][key.lower()] = raw
    if not any(sections.values()):
        return (f"# nothing set: no --config file, no {config_file.ENV_PREFIX}* variable "
                "(--effective shows every key)\n")
    return config_file.to_toml({k: v for k, v in sections.items() if v})


def effective(path: str | None) -> str:
    """Every key of every process's section, with the value it runs with."""
    extra = ["--config", path] if path is not None else []
    procs = {name: subprocess.Popen([sys.executable, "-m", module, "--print-config", *extra],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdin=subprocess.DEVNULL, text=True)
             for name, module in ROLES.items()}
    out = []
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
            if proc.returncode != 0:
                lines = stderr.strip().splitlines() or [f"{ROLES[name]} exited with code "
                                                        f"{proc.returncode}"]
                raise config_file.ConfigError(lines[-1].removeprefix("error: "))
            out.append(stdout)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    p = argparse.ArgumentParser(add_help=False)
    standalone_cmd.add_arguments(p)
    p.set_defaults(**config_file.layered(p, standalone_cmd.SECTION, path, os.environ))
    ns = p.parse_args([])
    out.append(config_file.to_toml({standalone_cmd.SECTION: config_file.effective(p, ns)}))
    return "".join(out)
