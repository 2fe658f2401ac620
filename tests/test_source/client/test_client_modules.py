"""The modules of the client library depend on each other one way: no import cycle among
them (imports under TYPE_CHECKING and inside functions count), and none hides a dependency
on a higher module behind TYPE_CHECKING."""
from __future__ import annotations

import ast
import pathlib

import shadowtopic.client

CLIENT = pathlib.Path(shadowtopic.client.__file__).parent


def _imports() -> dict[str, set[str]]:
    """module -> the client modules it imports (anywhere in the file)."""
    names = {p.stem for p in CLIENT.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in names:
        tree = ast.parse((CLIENT / f"{name}.py").read_text(encoding="utf-8"))
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                if t.startswith("shadowtopic.client."):
                    mod = t.split(".")[2]
                    if mod in names and mod != name:
                        found.add(mod)
        graph[name] = found
    return graph


def test_client_modules_have_no_import_cycle():
    graph = _imports()
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = path[path.index(name):] + [name]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, path + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_client_modules_import_nothing_under_type_checking():
    """Only a third-party module's types (pyarrow's, which the client imports when an Arrow
    read runs) may be imported for type checking alone; never one of the package's."""
    for path in sorted(CLIENT.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                for imp in ast.walk(node):
                    names = [imp.module or ""] if isinstance(imp, ast.ImportFrom) else \
                        [a.name for a in imp.names] if isinstance(imp, ast.Import) else []
                    for name in names:
                        assert not name.startswith("shadowtopic"), \
                            f"{path.name}:{imp.lineno}: a TYPE_CHECKING import of {name}"
