"""Every relative link of README.md and docs/*.md points to a file that exists, and to a heading of it.

Links are read from the prose (fenced blocks and inline code are not markdown); URLs with a scheme
(https:, mailto:) are left alone, as the tests have no network.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.markdown import DOCS, README, doc_pages, heading_anchors, page_name, prose_lines

INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def links(text: str, where: str) -> list[tuple[int, str]]:
    found = []
    for number, line in prose_lines(text, where):
        prose = re.sub(r"(`+).*?\1", "", line)  # inline code spans are not links
        found += [(number, m.group(1)) for m in INLINE_LINK.finditer(prose)]
        reference = REFERENCE_LINK.match(prose)
        if reference:
            found.append((number, reference.group(1)))
    return found


def broken_links(page: Path) -> list[str]:
    """'page:line: target (why)' for every relative link that leads nowhere."""
    where = page_name(page) if page.is_relative_to(README.parent) else str(page)
    text = page.read_text(encoding="utf-8")
    broken = []
    for number, target in links(text, where):
        if SCHEME.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{where}:{number}: {target} (no such file)")
        elif anchor:
            if dest.suffix != ".md":
                broken.append(f"{where}:{number}: {target} (an anchor into a file that is not markdown)")
            elif anchor not in heading_anchors(dest.read_text(encoding="utf-8"), str(dest)):
                broken.append(f"{where}:{number}: {target} (no heading with anchor #{anchor})")
    return broken


@pytest.mark.parametrize("page", doc_pages(), ids=page_name)
def test_relative_links_lead_to_an_existing_file_and_heading(page):
    assert broken_links(page) == []


def test_a_missing_file_a_missing_heading_and_a_link_in_code_are_told_apart(tmp_path):
    other = "# Other page\n\n## Shuffle quality (`pack info`)\n\n## Notes\n\n## Notes\n"
    (tmp_path / "other.md").write_text(other)
    (tmp_path / "data.json").write_text("{}")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](other.md#shuffle-quality-pack-info), [ok twice](other.md#notes-1), [here](#page),\n"
        "![plot](data.json), [web](https://example.com/x.md), `[code](nowhere.md)`\n"
        "[gone](missing.md) and [no heading](other.md#order)\n\n"
        "```\n[in a block](nowhere.md)\n```\n"
        "[ref]: other.md#nothing-here\n"
    )
    assert broken_links(page) == [
        f"{page}:5: missing.md (no such file)",
        f"{page}:5: other.md#order (no heading with anchor #order)",
        f"{page}:10: other.md#nothing-here (no heading with anchor #nothing-here)",
    ]


def test_every_docs_page_is_listed_in_the_index_and_the_readme_points_to_the_index():
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    listed = {target.partition("#")[0] for _, target in links(index, "docs/index.md")}
    pages = {page.name for page in DOCS.glob("*.md")} - {"index.md"}
    assert pages <= listed, f"docs/index.md does not list {sorted(pages - listed)}"
    readme = README.read_text(encoding="utf-8")
    assert "docs/index.md" in {target for _, target in links(readme, "README.md")}
    assert len(readme.splitlines()) < 300  # the ten-minute overview; the manual lives in docs/
    assert "make demo" in readme and "make test" in readme
