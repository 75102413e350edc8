"""The tests mirror the packages: a test of ``readers/order/`` lives in ``tests/readers/order/``, of a
format in ``tests/readers/formats/<format>/``, of a top-level module (``packer/cli.py``,
``readers/spec.py``) in ``tests/packer/`` or ``tests/readers/``. What spans the whole product sits
in ``tests/end_to_end/`` (a user's first hour, every entry point's errors) and
``tests/project/`` (the docs, the import graph, this layout). Code that tests share (fixture
builders, servers, the training script killed by the resume tests, the format contract suite) is in
``tests/support/``, and nothing else is; every folder is a package, so two rooms may hold test files
of the same name. Test files are named by behaviour, never by a work round or an issue."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

TESTS = REPO / "tests"
MIRRORED = ("readers", "packer")
WHOLE_PRODUCT = ("end_to_end", "project")
SHARED = "support"
# test_trust_round3_read.py, test_issue_14.py, test_first_hour.py: named after the work, not the behaviour
WORK_LOG_NAME = re.compile(r"(round|issue|wave|session|sprint|hour|stage)[_\d]|_r\d+(_|\.py$)|_\d+\.py$")


def layout_problems(tests: Path = TESTS, repo: Path = REPO) -> list[str]:
    """Every way the tree under ``tests`` breaks the layout above, one line each."""
    problems = []
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        if not (folder / "__init__.py").exists():
            problems.append(f"{folder.relative_to(repo)}: no __init__.py")
    for path in sorted(tests.rglob("*.py")):
        relative = path.relative_to(tests)
        top = relative.parts[0]
        if len(relative.parts) == 1:
            if path.name not in {"conftest.py", "__init__.py"}:
                problems.append(f"tests/{relative}: belongs in a room's folder or in tests/{SHARED}/")
            continue
        if path.name == "__init__.py" or top == SHARED:
            continue
        if not path.name.startswith("test_"):
            problems.append(f"tests/{relative}: shared code goes in tests/{SHARED}/")
        if WORK_LOG_NAME.search(path.name):
            problems.append(f"tests/{relative}: named after a work round or issue, not a behaviour")
        if top in MIRRORED:
            package = repo.joinpath(*relative.parts[:-1])
            if not (package / "__init__.py").exists():
                problems.append(f"tests/{relative}: {package.relative_to(repo)} is not a package")
        elif top not in WHOLE_PRODUCT:
            problems.append(f"tests/{relative}: tests/{top}/ mirrors no package")
    return problems


def test_the_tests_mirror_the_packages():
    assert layout_problems() == []


def test_every_room_with_code_has_a_test_folder():
    """A room of readers/ or packer/ (a subpackage with modules of its own) has its tests folder."""
    missing = []
    for package in MIRRORED:
        for init in sorted((REPO / package).rglob("__init__.py")):
            room = init.parent.relative_to(REPO)
            if room.parts == (package,) or "suites" in room.parts:
                continue
            if not (TESTS / room).is_dir():
                missing.append(str(room))
    assert missing == []


def test_each_broken_rule_is_named(tmp_path):
    """The check itself: a planted tree that breaks each rule gets one line per break."""
    repo = tmp_path
    (repo / "readers" / "order").mkdir(parents=True)
    (repo / "readers" / "__init__.py").touch()
    (repo / "readers" / "order" / "__init__.py").touch()
    tests = repo / "tests"
    for folder in ("readers/order", "readers/nosuchroom", "misc", "support"):
        (tests / folder).mkdir(parents=True)
    for init in ("", "readers", "readers/order", "readers/nosuchroom", "support"):
        (tests / init / "__init__.py").touch()
    for name in (
        "test_flat.py",
        "readers/order/test_resume.py",
        "readers/order/helpers_order.py",
        "readers/order/test_trust_round3_read.py",
        "readers/nosuchroom/test_x.py",
        "misc/test_y.py",
        "support/anything.py",
    ):
        (tests / name).touch()
    assert layout_problems(tests, repo) == [
        "tests/misc: no __init__.py",
        "tests/misc/test_y.py: tests/misc/ mirrors no package",
        "tests/readers/nosuchroom/test_x.py: readers/nosuchroom is not a package",
        "tests/readers/order/helpers_order.py: shared code goes in tests/support/",
        "tests/readers/order/test_trust_round3_read.py: named after a work round or issue, not a behaviour",
        "tests/test_flat.py: belongs in a room's folder or in tests/support/",
    ]
