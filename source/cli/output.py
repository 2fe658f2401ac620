"""CLI output: `-o table` (rich tables, human units) or `-o json` (one JSON document, or one
JSON object per line for message streams), and one-line errors.

Tables on a terminal fit its width; piped (`| grep`, `> file`) they are as wide as their
content ($COLUMNS, when set, still wins), so no cell is cut at 80 columns. rich is imported
only when a table or a progress bar is printed: `-o json` and plain lines never load it.
"""
from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from collections.abc import Iterable

    from rich.console import Console

    from shadowtopic.client import CompactionStatus, Message

#: the width of a table piped with no $COLUMNS: wide enough for any row, so rows never wrap
#: (a rich table is only as wide as its content)
PIPED_WIDTH = 1_000_000


def console() -> Console:
    """A rich console on the current stdout: the terminal's width on a terminal, otherwise
    $COLUMNS or `PIPED_WIDTH` (rich alone would cut piped output at 80 columns)."""
    from rich.console import Console
    width = None
    if not sys.stdout.isatty() and not os.environ.get("COLUMNS"):
        width = PIPED_WIDTH
    return Console(soft_wrap=True, width=width)


def emit(data, fmt: str, columns: list[str] | None = None) -> None:
    """Print a dict or a list of dicts."""
    if fmt == "json":
        print(json.dumps(data, indent=2, sort_keys=False, default=str))
        return
    from rich.table import Table
    table = Table(show_header=True, header_style="bold")
    if isinstance(data, dict):
        table.add_column("field")
        table.add_column("value")
        for k, v in data.items():
            table.add_row(str(k), _cell(v))
    else:
        rows = list(data)
        cols = columns or (list(rows[0].keys()) if rows else [])
        for c in cols:
            table.add_column(c)
        for r in rows:
            table.add_row(*[_cell(r.get(c)) for c in cols])
    console().print(table)


def _cell(v) -> str:
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str) if v else ""
    return "" if v is None else str(v)


def message_line(msg: Message, fmt: str) -> None:
    """One message: a JSON object per line, or `id<TAB>key<TAB>payload[<TAB>k=v ...]`."""
    sys.stdout.write((json.dumps(msg.to_dict()) if fmt == "json" else str(msg)) + "\n")


def fail(message: str) -> NoReturn:
    """Print `error: <message>` as one line on stderr (whitespace runs, newlines included,
    become one space) and exit 1."""
    sys.stderr.write(f"error: {' '.join(message.split())}\n")
    sys.exit(1)


def compaction_progress(statuses: Iterable[CompactionStatus]) -> CompactionStatus | None:
    """Follow compaction statuses with a progress bar (Spark's tasks of the running phase)
    and an ETA; returns the last status."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    out = console()
    last: CompactionStatus | None = None
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=out,
                  transient=False) as progress:
        bar, phase = None, None
        for last in statuses:
            if last.phase != phase:  # a new phase: the previous bar completes, a new one
                if bar is not None:
                    done = next(t for t in progress.tasks if t.id == bar)
                    progress.update(bar, completed=done.total or done.completed)
                phase = last.phase
                if last.done:
                    break
                bar = progress.add_task(f"{last.job_id} {phase}", total=last.tasks_total or None)
            if bar is not None:  # (set above: the first status is a new phase)
                progress.update(bar, completed=last.tasks_done,
                                total=last.tasks_total or None)
    if last is not None and last.phase == "done":
        out.print(f"done: {last.entries_written} messages, {last.keys} keys, "
                  f"horizon {last.horizon}", highlight=False)
    return last
