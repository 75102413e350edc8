"""mkdocs hooks: one page per registered format, written from the format registry when the site is
built, so a new format gets its page without anyone editing the docs (the nav's "Formats" section
lists them after the layouts page); and GitHub's heading anchors, so a link written for GitHub
(``packing.md#from-and-to-object-storage-s3-gs-``) works on the site too."""

from __future__ import annotations

import importlib
import re
from typing import Any

from mkdocs.structure.files import File, Files
from mkdocs.structure.nav import Navigation, Section
from mkdocs.structure.pages import Page

from readers.formats import format_named, format_names
from readers.formats.format import COMMON_READER_OPTIONS, Format


def _module_doc(fmt: Format) -> str:
    package = fmt.reader.split(":", 1)[0].rsplit(".", 1)[0]
    return (importlib.import_module(package).__doc__ or "").strip()


def _codes(names: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names) or "none"


def format_page(fmt: Format) -> str:
    """The markdown of ``fmt``'s page: what it is, its files, options, encodings, where it goes."""
    remote = {None: "no (a local output only)", "local": "yes (written locally, then uploaded)"}
    rows = [
        ("what it is", _module_doc(fmt).replace("\n", " ")),
        ("files it owns (what `--force` may replace)", f"`{fmt.files.pattern}`"),
        ("encodings (`--encode`)", _codes(fmt.encodings)),
        ("pack options", _codes([o.flag for o in fmt.pack_options])),
        ("reader options (`reader_options=`)", _codes([*COMMON_READER_OPTIONS, *fmt.reader_options])),
        ("written to object storage", remote.get(fmt.remote_finish, f"yes (parts: {fmt.remote_finish})")),
        ("per-sample fields", "stored" if fmt.stores_fields else "not stored"),
        ("rebuildable index (`pack reindex`)", "yes" if fmt.indexer else "no"),
        ("reader / writer", f"`{fmt.reader}` / `{fmt.writer}`"),
    ]
    lines = [f"# {fmt.name}", "", "Made from the format registry when this site is built.", ""]
    lines += ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""]
    lines += [f"Pack into it: `pack imagefolder SRC --to {fmt.name} -o OUT`; the on-disk layout is in",
              "[Layouts and the registry](../formats.md)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def github_slug(value: str, separator: str = "-") -> str:
    """The anchor GitHub gives a heading (tests/support/markdown.py checks the links with it)."""
    return re.sub(r"[^\w\- ]", "", value.strip().lower()).replace(" ", separator)


def on_config(config: Any) -> Any:
    config.mdx_configs.setdefault("toc", {})["slugify"] = github_slug
    return config


def on_files(files: Files, config: Any) -> Files:
    for name in format_names():
        files.append(File.generated(config, f"formats/{name}.md", content=format_page(format_named(name))))
    return files


def on_nav(nav: Navigation, config: Any, files: Files) -> Navigation:
    section = next(item for item in nav.items if isinstance(item, Section) and item.title == "Formats")
    for name in format_names():
        page = Page(name, files.get_file_from_path(f"formats/{name}.md"), config)
        page.parent = section
        section.children.append(page)
    return nav
