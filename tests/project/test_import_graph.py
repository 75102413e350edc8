"""The modules of packer/ and readers/ form no import circle (imports inside functions included,
and the "module:attr" strings a format's ``Format`` names its reader, writer and indexer by, which
the registry imports on first use), ``readers`` never imports ``packer``, and every module imports
on its own in a fresh interpreter, in any order.

Rooms (the subpackages: readers/order/, packer/engine/, readers/formats/tar/...) show what they
offer: a module of a room that something outside the room uses (another room's module, a top-level
module such as packer/cli.py, scripts/, docs/_hooks/, a docs page's code or ``:::`` reference; tests
do not count) is public; every other module of the room is internal and named ``_name.py``. A
module loaded by name (a "module:attr" string, a string naming the module, an f-string
``"package.{name}"`` over its package: the format and suite registries, ``-m`` children, the lazy
tables of readers/__init__.py and packer/__init__.py) is public, being a name others rely on. Each
room's ``__init__.py`` docstring lists its public modules, a line "- ``name``: what it is for" each
(those its own registry names, a format's reader and writer, the suites, excepted), and no module
is named like its room (as ``readers.order.order`` was)."""

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
from tests.support.markdown import doc_pages, fences

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


def named(path: Path, known: set[str]) -> set[str]:
    """Project modules a string of ``path`` names: whole ("packer.bench.cold_epoch", run with ``-m``
    or imported by a lazy table), as "module:attr" (a format's reader), or as the package of an
    f-string (``f"packer.bench.suites.{name}"``: any module directly in that package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            string = STRING_IMPORT.fullmatch(node.value)
            found.update(m for m in (node.value, string and string.group(1)) if m in known)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            head = str(node.values[0].value)
            if head.endswith(".") and head[:-1] in known and len(node.values) == 2:
                found.update(m for m in known if m.rpartition(".")[0] == head[:-1])
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
    assert len(graph) > 50 and graph["packer.engine.pack_run"]  # the walk found the modules and their imports
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



DOTTED = re.compile(r"\b(?:packer|readers)(?:\.\w+)+")
LISTED = re.compile(r"^- ``([a-z]\w*)``", re.M)  # "- ``epoch_order``: the order of an epoch ..."


def room_of(name: str, packages: set[str]) -> str | None:
    """The subpackage (room) ``name`` belongs to: a package is its own room; readers/ and packer/
    themselves are no room (their top-level modules are everyone's)."""
    room = name if name in packages else name.rpartition(".")[0]
    return room if "." in room else None


def longest_module(dotted: str, known: set[str]) -> str | None:
    """``readers.formats.open_reader`` -> ``readers.formats``: the module a dotted name starts with."""
    parts = dotted.split(".")
    return next((m for k in range(len(parts), 0, -1) if (m := ".".join(parts[:k])) in known), None)


def outside_references(known: set[str]) -> dict[str, set[str]]:
    """{where: modules it uses} for what lies outside packer/ and readers/ and is no test: scripts/
    and docs/_hooks/ (imports and strings), and every docs page's ``:::`` lines and fenced code (a
    python block's imports, and any dotted module name in a block: ``python -m packer.bench.x``)."""
    found: dict[str, set[str]] = {}
    for path in [*sorted((REPO / "scripts").glob("*.py")), *sorted((REPO / "docs" / "_hooks").glob("*.py"))]:
        uses = imported(f"scripts.{path.stem}", path, known) | named(path, known)
        found[path.relative_to(REPO).as_posix()] = uses
    for page in doc_pages():
        lines = page.read_text(encoding="utf-8").splitlines()
        texts = [line for line in lines if line.startswith(":::")]
        for start, end, language in fences(lines, page.name):
            block = "\n".join(lines[start + 1 : end])
            texts.append(block)
            if language == "python":
                for node in ast.walk(ast.parse(block)):
                    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                        texts += [f"{node.module}.{alias.name}" for alias in node.names]
        used = {longest_module(dotted, known) for text in texts for dotted in DOTTED.findall(text)}
        found[page.relative_to(REPO).as_posix()] = {m for m in used if m}
    return found


def public_modules() -> dict[str, set[str]]:
    """{room: its public modules} for every room: those used from outside the room, and those a
    string names anywhere (loaded by name: their name is relied on)."""
    modules = project_modules()
    known, packages = set(modules), {n for n, p in modules.items() if p.name == "__init__.py"}
    users = outside_references(known)
    by_name = set()
    for name, path in modules.items():
        users[name] = imported(name, path, known)
        by_name |= named(path, known)
    public: dict[str, set[str]] = {room: set() for n in modules if (room := room_of(n, packages))}
    for user, used in users.items():
        for module in used:
            room = room_of(module, packages)
            if room and module != room and room != room_of(user, packages):
                public[room].add(module)
    for module in by_name:
        room = room_of(module, packages)
        if room and module != room:
            public[room].add(module)
    return public


def leaf(module: str) -> str:
    return module.rpartition(".")[2]


def room_modules(room: str) -> set[str]:
    folder = REPO.joinpath(*room.split("."))
    return {f"{room}.{p.stem}" for p in folder.glob("*.py") if p.name != "__init__.py"}


def test_a_private_module_is_used_only_inside_its_room():
    public = public_modules()
    assert "readers.formats.tar.writer" in public["readers.formats.tar"]  # a Format's string names it
    assert "packer.bench.suites.order" in public["packer.bench.suites"]  # the suite registry's f-string
    leaks = {m for modules in public.values() for m in modules if leaf(m).startswith("_")}
    assert leaks == set(), "used outside their room, so public: drop the leading _"


def test_a_module_none_uses_from_outside_its_room_is_private():
    public = public_modules()
    unmarked = {m for room, used in public.items() for m in room_modules(room) - used if leaf(m)[0] != "_"}
    assert unmarked == set(), "used only inside their room: name them _name.py"


def test_no_module_is_named_like_its_room():
    named_like = {m for room in public_modules() for m in room_modules(room) if leaf(m) == leaf(room)}
    assert named_like == set()  # readers.order.order read badly: name what it holds


def test_each_room_lists_its_public_modules_in_its_docstring():
    """A module the room's ``__init__`` itself names by string (a format's reader and writer in its
    ``Format``, the suites in ``SUITES``) is listed there already: the registry is its line."""
    known, wrong = set(project_modules()), {}
    for room, public in public_modules().items():
        init = REPO.joinpath(*room.split("."), "__init__.py")
        listed = set(LISTED.findall(ast.get_docstring(ast.parse(init.read_text())) or ""))
        expected = {leaf(m) for m in public - named(init, known)}
        if listed != expected:
            wrong[room] = {"listed": sorted(listed), "public": sorted(expected)}
    assert wrong == {}
