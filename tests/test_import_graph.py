"""The modules of packer/ and readers/ form no import circle (imports inside functions included,
and the "module:attr" strings a format's ``Format`` names its reader, writer and indexer by, which
the registry imports on first use), ``readers`` never imports ``packer``, and every module imports
on its own in a fresh interpreter, in any order."""

from __future__ import annotations

import ast
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from readers.formats import registered
from tests.conftest import REPO, cli_env

PACKAGES = ("packer", "readers")
# "readers.formats.tar.writer:TarWriter": a module and an attribute, as readers.formats.format.load takes
STRING_IMPORT = re.compile(r"([A-Za-z_][\w.]*):[A-Za-z_]\w*")


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules ``name`` imports anywhere in its body (``from a import b`` counts as
    ``a.b`` where that is a module, else ``a``), or names in a "module:attr" string."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            string = STRING_IMPORT.fullmatch(node.value)
            targets = [string.group(1)] if string else []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    known = set(modules)
    return {name: imported(name, path, known) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_a_module_attr_string_is_an_import(tmp_path):
    path = tmp_path / "entry.py"
    path.write_text('X = load("pkg.writer:Writer")\nY = "pkg.reader: not a name"\nZ = "see pkg.other"\n')
    known = {"pkg.writer", "pkg.reader", "pkg.other", "pkg.entry"}
    assert imported("pkg.entry", path, known) == {"pkg.writer"}


def test_a_format_packages_writer_string_is_an_edge_of_the_graph():
    graph = import_graph()
    named = [fmt.writer.partition(":")[0] for fmt in registered().values() if isinstance(fmt.writer, str)]
    assert named  # the shipped formats name their writers
    for module in named:  # by the Format in the format package's __init__
        assert module in graph[module.rpartition(".")[0]]


def test_no_import_circle_between_project_modules():
    graph = import_graph()
    assert len(graph) > 50 and graph["packer.engine.engine"]  # the walk found the modules and their imports
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_readers_never_import_packer():
    offenders = {
        name: sorted(t for t in targets if t.split(".")[0] == "packer")
        for name, targets in import_graph().items()
        if name.startswith("readers")
    }
    assert {name: t for name, t in offenders.items() if t} == {}


IMPORT_ALL = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
"""


@pytest.mark.parametrize("order", ["reversed", "shuffled"])  # sorted starts with the packages
def test_every_module_imports_in_a_fresh_interpreter_in_any_order(order):
    names = sorted(project_modules(), reverse=order == "reversed")
    if order == "shuffled":
        random.Random(0).shuffle(names)
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, *names], capture_output=True, text=True, env=cli_env(), timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
