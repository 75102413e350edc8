"""The project's markdown pages as the docs tests read them: which pages, their fences, prose, anchors."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
FENCE = re.compile(r"^```(\w*)\s*$")


def doc_pages() -> list[Path]:
    """README.md and every page of docs/: the pages whose code runs and whose links are checked."""
    return [README, *sorted(DOCS.glob("*.md"))]


def page_name(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def fences(lines: list[str], where: str) -> list[tuple[int, int, str]]:
    """(index of the opening fence, index of the closing fence, language) of every fenced block."""
    found = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{where}:{i + 1}: a fenced block that is never closed"
        found.append((i, end, opening.group(1)))
        i = end + 1
    return found


def prose_lines(text: str, where: str) -> list[tuple[int, str]]:
    """(1-based line number, line) of every line outside fenced blocks."""
    lines = text.splitlines()
    inside = {k for start, end, _ in fences(lines, where) for k in range(start, end + 1)}
    return [(k + 1, line) for k, line in enumerate(lines) if k not in inside]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def heading_anchors(text: str, where: str) -> set[str]:
    anchors: set[str] = set()
    for _, line in prose_lines(text, where):
        heading = re.match(r"^#{1,6} (.+)$", line)
        if heading:
            base = slug(heading.group(1))
            anchor, n = base, 0
            while anchor in anchors:  # GitHub numbers repeated headings: x, x-1, x-2
                n += 1
                anchor = f"{base}-{n}"
            anchors.add(anchor)
    return anchors
