"""Docs cannot point at what is gone: every repo path, `python -m` module and dotted
`shadowtopic.*` name written in the docs, the README, pyproject.toml's comments and the code's
comments and docstrings resolves in this tree.

What is checked, and how (a unit test: it reads files, starts nothing):

- Texts: README.md and docs/*.md whole; pyproject.toml's comments; the comments and
  docstrings of every .py file under source/, shadow/, compaction/, scripts/ and bench/.
- A repo path starts with a top-level folder (source/ shadow/ compaction/ proto/ tests/
  bench/ docs/ scripts/ .ci/) or is README.md, Makefile or pyproject.toml, and is not part of
  a longer path or URL (`s3://b/docs/x` is not one). A placeholder (`<topic>`, `*`, `{a,b}`)
  ends it: the part before it must exist.
- A module is what follows `python -m` (or `python3 -m`), and any dotted name starting
  `shadowtopic.` (`shadowtopic.core.errors`, `shadowtopic.client.Client`): `shadowtopic` is
  source/, `shadowtopic.shadow` is shadow/, `shadowtopic.compaction` is compaction/ (as in
  pyproject.toml); a name past the longest module must be defined at the top of that module.
  Other `-m` modules resolve in this tree (`scripts.chaos.run`) or in the environment
  (`pytest`, `venv`). A dotted name ending in a file suffix (`shadowtopic.toml`) is a file.
"""
from __future__ import annotations

import ast
import importlib.util
import io
import re
import tokenize
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP_FOLDERS = ("source", "shadow", "compaction", "proto", "tests", "bench", "docs", "scripts",
               ".ci")
TOP_FILES = ("README.md", "Makefile", "pyproject.toml")
CODE_FOLDERS = ("source", "shadow", "compaction", "scripts", "bench")
PACKAGE_DIRS = {"shadowtopic.shadow": "shadow", "shadowtopic.compaction": "compaction",
                "shadowtopic": "source"}
FILE_SUFFIXES = {"toml", "md", "py", "log", "json", "yml", "yaml", "txt", "lock", "wal", "parquet"}

_folders = "|".join(re.escape(f) for f in TOP_FOLDERS)
_files = "|".join(re.escape(f) for f in TOP_FILES)
# not preceded by a path or URL character, so `s3://bucket/docs/x` and `a/source/b` are no paths
PATH_RE = re.compile(rf"(?<![\w./:~$-])(?:(?:{_folders})/[\w./<>*{{}}$-]*|(?:{_files})(?![\w.-]))")
MODULE_RE = re.compile(r"\bpython3?\s+-m\s+([A-Za-z_][\w.]*)")
DOTTED_RE = re.compile(r"(?<![\w.-])shadowtopic(?:\.[A-Za-z_]\w*)+")
PLACEHOLDER = re.compile(r"[<*{$]")


@cache
def ignored_dirs() -> tuple[str, ...]:
    """Folders .gitignore names by path (`bench/out/`): what runs write there is no repo file."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return tuple(x for x in lines if x.endswith("/") and "/" in x[:-1] and not x.startswith("#"))


def check_path(raw: str) -> str | None:
    """None when `raw` (as written) exists, up to a placeholder; else what is missing."""
    cut = PLACEHOLDER.search(raw)
    path = raw[:cut.start()] if cut else raw.rstrip(".")
    if cut:
        path = path.rsplit("/", 1)[0] + "/"   # a placeholder inside a name: its folder must exist
    first, _, rest = path.partition("/")
    if rest in TOP_FOLDERS:      # "a source/shadow pair" is prose
        return None
    if path.startswith(ignored_dirs()) or (ROOT / path).exists():
        return None
    return path


@cache
def declared_names() -> frozenset[str]:
    """Dotted names that are no Python module: proto packages' services, messages and enums
    (`shadowtopic.v1.Admin`) and pyproject.toml's entry-point groups."""
    import tomllib

    names = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"])
    for proto in (ROOT / "proto").rglob("*.proto"):
        text = proto.read_text()
        package = re.search(r"^package\s+([\w.]+);", text, re.M)
        if package:
            names.update(f"{package.group(1)}.{n}" for n in
                         re.findall(r"^\s*(?:service|message|enum)\s+(\w+)", text, re.M))
    return frozenset(names)


def module_file(dotted: str) -> Path | None:
    """The file of a module named in this tree (a package's __init__.py), else None."""
    for package, folder in PACKAGE_DIRS.items():
        if dotted == package or dotted.startswith(package + "."):
            parts = dotted[len(package):].lstrip(".").split(".") if dotted != package else []
            base = ROOT / folder
            break
    else:
        parts, base = dotted.split("."), ROOT
        if parts[0] not in TOP_FOLDERS:
            return None
        base, parts = ROOT / parts[0], parts[1:]
    target = base.joinpath(*parts)
    for candidate in (target.with_suffix(".py") if parts else None, target / "__init__.py",
                      target / "__main__.py"):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


@cache
def top_level_names(path: Path) -> frozenset[str]:
    """The names a module defines at its top (defs, classes, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.If):   # `if TYPE_CHECKING:` imports
            for sub in node.body:
                if isinstance(sub, ast.ImportFrom):
                    names.update(a.asname or a.name for a in sub.names)
    return frozenset(names)


def check_dotted(dotted: str) -> str | None:
    """None when the longest module prefix of `dotted` exists and the rest is defined in it."""
    parts = dotted.split(".")
    if parts[-1] in FILE_SUFFIXES or any(dotted == n or dotted.startswith(n + ".")
                                         for n in declared_names()):
        return None
    for n in range(len(parts), 0, -1):
        found = module_file(".".join(parts[:n]))
        if found is not None:
            if n == len(parts) or parts[n] in top_level_names(found) \
                    or (found.name == "__init__.py" and module_file(".".join(parts[:n + 1]))):
                return None
            return dotted
    return dotted


def check_module(name: str) -> str | None:
    """None when `python -m name` would find it: in this tree, else installed."""
    if module_file(name) is not None:
        return None
    top = name.split(".")[0]
    if top in PACKAGE_DIRS or top in TOP_FOLDERS:
        return name
    return None if importlib.util.find_spec(top) is not None else name


def stale_in_text(text: str, origin: str, first_line: int = 1) -> list[str]:
    """`origin:line: what` for each reference in `text` that does not resolve."""
    out = []
    for i, line in enumerate(text.splitlines(), first_line):
        for m in PATH_RE.finditer(line):
            missing = check_path(m.group(0))
            if missing:
                out.append(f"{origin}:{i}: no such path: {m.group(0).rstrip('.')}")
        run = [m.span(1) for m in MODULE_RE.finditer(line)]
        for m in MODULE_RE.finditer(line):
            if check_module(m.group(1).rstrip(".")):
                out.append(f"{origin}:{i}: no such module: python -m {m.group(1)}")
        for m in DOTTED_RE.finditer(line):
            if m.span() not in run and check_dotted(m.group(0)):
                out.append(f"{origin}:{i}: no such module or name: {m.group(0)}")
    return out


def code_texts(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of each comment and docstring of a Python file."""
    source = path.read_text()
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                doc = body[0]
                out.append((doc.lineno, "\n".join(lines[doc.lineno - 1:doc.end_lineno])))
    return out


def toml_comments(text: str) -> list[tuple[int, str]]:
    """(line, comment) of each `#` comment of a TOML text (a `#` inside a string is none)."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        quote = None
        for j, ch in enumerate(line):
            if quote:
                quote = None if ch == quote else quote
            elif ch in "\"'":
                quote = ch
            elif ch == "#":
                out.append((i, line[j:]))
                break
    return out


def all_stale() -> list[str]:
    out = []
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        out += stale_in_text(md.read_text(), str(md.relative_to(ROOT)))
    pyproject = ROOT / "pyproject.toml"
    for line, text in toml_comments(pyproject.read_text()):
        out += stale_in_text(text, "pyproject.toml", line)
    for folder in CODE_FOLDERS:
        for py in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in py.parts or py.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            for line, text in code_texts(py):
                out += stale_in_text(text, str(py.relative_to(ROOT)), line)
    return out


def test_every_path_and_module_named_in_docs_and_comments_exists():
    stale = all_stale()
    assert not stale, "stale references:\n" + "\n".join(stale)


def test_the_check_names_file_and_line_of_what_is_missing():
    text = ("intro\n"
            "see source/ledger/wal.py and docs/ARCHITECTURE.md, "
            "run `python -m shadowtopic.broker`\n"
            "the errors: `shadowtopic.core.errors`, `shadowtopic.client.Client`, shadowtopic.toml\n"
            "gone: source/ledger/nowhere.py, then `python -m shadowtopic.nowhere`\n"
            "and `shadowtopic.core.no_module`, `shadowtopic.client.NoSuchName`, README.md\n"
            "placeholders: <data-dir>/wal/x, tests/test_*/x.py, source/pb/**, bench/nothere/*.py\n")
    assert stale_in_text(text, "doc.md") == [
        "doc.md:4: no such path: source/ledger/nowhere.py",
        "doc.md:4: no such module: python -m shadowtopic.nowhere",
        "doc.md:5: no such module or name: shadowtopic.core.no_module",
        "doc.md:5: no such module or name: shadowtopic.client.NoSuchName",
        "doc.md:6: no such path: bench/nothere/*.py",
    ]


def test_no_paths_are_seen_inside_urls_or_longer_paths():
    text = ("s3://bucket/docs/none.md, /home/me/source/none.py, <root>/tests/none, "
            "../docs/none.md\n"
            "one replicator per source/shadow pair, written to bench/out/<stamp>.json\n"
            "the `shadowtopic.v1.Admin` service, the `shadowtopic.broker_features` entry points\n")
    assert stale_in_text(text, "doc.md") == []


def test_shadowtopic_maps_to_its_three_folders():
    assert module_file("shadowtopic.broker") == ROOT / "source/broker/__init__.py"
    assert module_file("shadowtopic.shadow.broker") == ROOT / "shadow/broker.py"
    assert module_file("shadowtopic.compaction.worker") == ROOT / "compaction/worker.py"
    assert module_file("scripts.chaos.run") == ROOT / "scripts/chaos/run.py"
