"""mkdocs hook: the table of benchmark suites on benchmarks.md, written from the suite registry
(``packer.bench.suites.SUITES``) when the site is built, so a new suite is listed without anyone
editing the docs. The page holds the marker ``<!-- suite-table -->`` where the table goes."""

from __future__ import annotations

from typing import Any

from packer.bench.suites import SUITES

MARKER = "<!-- suite-table -->"


def suite_table() -> str:
    """The markdown table of every registered suite and data maker: name, what, needs, command."""
    lines = ["| suite | what it measures | needs | run |", "|---|---|---|---|"]
    for kind in ("suite", "data"):
        for suite in (s for s in SUITES if s.kind == kind):
            what = suite.description if kind == "suite" else f"(data) {suite.description}"
            command = f"`pack bench run {suite.name} --help`"
            lines.append(f"| `{suite.name}` | {what} | {suite.needs or '-'} | {command} |")
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, suite_table())
