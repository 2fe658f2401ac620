"""Commands in the docs are commands that exist: every `shadowtopic ...` line of a code block in
README.md and docs/*.md parses with the CLI's own parser (its subcommands and flags, as
`shadowtopic` itself parses them), and every `make X` written in backticks or a code block is
a target of the Makefile. A unit test: nothing runs, the parser only reads the words.

A line may chain commands (`&&`, `|`, `;`, redirections) and set variables before one
(`SHADOWTOPIC_URL=h:p shadowtopic ...`); each `shadowtopic` command is checked. The usage
notation `[--flag value]` (optional) and `...` (more) are left out before parsing.
"""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

from shadowtopic.cli.main import parse_args

ROOT = Path(__file__).resolve().parents[2]
SEPARATORS = {"&&", "||", "|", ";", ">", ">>", "<", "&", "(", ")"}
ASSIGNMENT = re.compile(r"[A-Z][A-Z0-9_]*=.*")
MAKE_RE = re.compile(r"`make ([a-z][\w-]*)|^make ([a-z][\w-]*)")


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line, text) of each line inside a fenced code block."""
    out, inside = [], False
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            inside = not inside
        elif inside:
            out.append((i, line.strip()))
    return out


def commands(line: str) -> list[list[str]]:
    """The commands of a shell line (comments cut), each as its words."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        words = list(lex)
    except ValueError:      # an unclosed quote: not shell
        return []
    out, cmd = [], []
    for word in [*words, ";"]:
        if word in SEPARATORS:
            if cmd:
                out.append(cmd)
            cmd = []
        else:
            cmd.append(word)
    return out


def cli_error(words: list[str]) -> str | None:
    """None when `words` (a `shadowtopic ...` command) parses; else the parser's complaint."""
    args, depth = [], 0
    for word in words[1:]:
        depth += word.startswith("[")
        if depth == 0 and word != "...":
            args.append(word)
        depth -= word.endswith("]")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse_args(args)
    except SystemExit as exc:
        if exc.code:
            return (err.getvalue().strip().splitlines() or [f"exit {exc.code}"])[-1]
    return None


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*)\s*:(?!=)", text, re.M))


def wrong_commands(text: str, origin: str) -> list[str]:
    """`origin:line: ...` for each command in `text` that the CLI or the Makefile lacks."""
    out = []
    for i, line in code_lines(text):
        for words in commands(line):
            while words and ASSIGNMENT.fullmatch(words[0]):
                words = words[1:]
            if words[:1] == ["shadowtopic"]:
                error = cli_error(words)
                if error:
                    out.append(f"{origin}:{i}: {' '.join(words)}: {error}")
    targets = make_targets()
    for i, line in enumerate(text.splitlines(), 1):
        for m in MAKE_RE.finditer(line.strip()):
            target = m.group(1) or m.group(2)
            if target not in targets:
                out.append(f"{origin}:{i}: make {target}: no such Makefile target")
    return out


def test_every_documented_command_exists():
    wrong = []
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        wrong += wrong_commands(md.read_text(), str(md.relative_to(ROOT)))
    assert not wrong, "commands that do not exist:\n" + "\n".join(wrong)


def test_the_check_finds_a_wrong_subcommand_flag_or_target():
    text = ("run `make run`, then `make nothing`:\n"
            "```\n"
            "shadowtopic topics create t --partitions 3     # fine\n"
            "shadowtopic topics create-shadow-topic s --source t [-p team=eu]\n"
            "SHADOWTOPIC_URL=h:1 shadowtopic topics no-such-command t\n"
            "shadowtopic read t --no-such-flag | wc -l && shadowtopic produce t -m x\n"
            "make docs\n"
            "```\n"
            "the make targets (prose, no command)\n")
    wrong = wrong_commands(text, "doc.md")
    assert [w.split(": ")[0] for w in wrong] == ["doc.md:5", "doc.md:6", "doc.md:1"], wrong
    assert "no-such-command" in wrong[0] and "--no-such-flag" in wrong[1]
    assert wrong[2] == "doc.md:1: make nothing: no such Makefile target"
