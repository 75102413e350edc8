"""``pack webdataset``: re-pack WebDataset-style samples (files sharing a stem) from a folder tree
or from tar shards, through the rows entry point (``packer.scan.rows``).

A sample is the files whose names share a key: the path up to the first dot of the file name, as
``webdataset`` groups tar members (``a/x.jpg``, ``a/x.cls``, ``a/x.json`` are sample ``a/x``).
Members: one image (``jpg``/``jpeg``/``png``/``webp``/``bmp``/``ppm``/``tif``/``tiff``), ``cls`` (an
integer class, or -1 for none), ``txt`` (the ``caption`` field), ``json`` (an object: each key a
field; any other value: the ``json`` field). Classes are ``0..max`` of the ``cls`` values (the
label is -1 without one: a caption or tags set packs as it is; a ``cls`` far above the sample
count is an id, not a class: its sample is skipped, see ``packer.scan.rows.implied_classes``). A
sample without an image, with two, a ``cls`` that is not an integer, text that is not UTF-8 or
JSON that does not parse (or nests too deeply) is skipped with the reason, and so is a sample
with a member name repeated inside one shard (webdataset itself refuses such a shard). Tar shards
are unpacked into ``workdir`` (the packer reads image files), which the caller removes after the
pack, one folder per shard: shards of one file name in different folders keep their samples apart.
"""

from __future__ import annotations

import os
import re
import tarfile
from pathlib import Path
from typing import Any

from packer.scan.rows import Row, implied_classes, scan_rows
from packer.sources.source import SourceScan
from readers.errors import ImgpackError
from readers.fields.field_schema import parse_json

_CLASS = re.compile(r"-1|[0-9]{1,18}")
IMAGE_MEMBERS = ("jpg", "jpeg", "png", "webp", "bmp", "ppm", "tif", "tiff")
RESERVED_FIELDS = ("label", "geometry")


def split_key(rel: str) -> tuple[str, str]:
    """(sample key, member extension) of a posix path, as webdataset splits member names."""
    folder, _, name = rel.rpartition("/")
    stem, dot, ext = name.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower() if dot else ""


def _files(root: Path) -> list[str]:
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if not name.startswith("."):
                found.append(Path(folder, name).relative_to(root).as_posix())
    return found


def shard_folders(shards: list[Path]) -> list[str]:
    """A distinct folder per shard to unpack into: its name up to the first dot, under the parent
    folders that tell shards of one name apart (``x/data.tar``, ``y/data.tar``: ``x/data``,
    ``y/data``), so their samples never merge. A shard given twice is an error."""
    resolved = [shard.resolve() for shard in shards]
    twice = next((s for s, r in zip(shards, resolved) if resolved.count(r) > 1), None)
    if twice is not None:
        raise ImgpackError(f"{twice}: the same tar shard is given twice; give each shard once")
    stems = [shard.name.split(".")[0] for shard in shards]
    if len(set(stems)) == len(stems):
        return stems
    common = Path(os.path.commonpath([str(r.parent) for r in resolved]))
    for names in (stems, [r.name for r in resolved]):  # "a.tar" and "a.tar.gz" side by side
        folders = [(r.parent.relative_to(common) / name).as_posix() for r, name in zip(resolved, names)]
        if len(set(folders)) == len(folders):
            break
    return folders


def unpack_shards(shards: list[Path], workdir: Path) -> tuple[Path, dict[str, str]]:
    """Each tar shard's members under ``workdir/<shard_folders>/`` (tarfile's ``data`` filter: no
    path leaving the folder); the folder to scan, and the samples (keys below it) that cannot be
    packed with the reason: a member name repeated inside one shard, which webdataset refuses and
    extracting would resolve by silently keeping the last copy."""
    problems: dict[str, str] = {}
    for shard, folder in zip(shards, shard_folders(shards)):
        seen: set[str] = set()
        try:
            with tarfile.open(shard) as tar:
                for member in tar:
                    name = os.path.normpath(member.name)
                    if member.isdir():
                        continue
                    if name in seen:
                        key = split_key(f"{folder}/{Path(name).as_posix()}")[0]
                        problems[key] = f"{shard}: member {member.name} appears twice in the shard"
                        continue
                    seen.add(name)
                    tar.extract(member, workdir / folder, filter="data")
        except (OSError, tarfile.TarError) as exc:
            raise ImgpackError(f"{shard}: not a readable tar shard ({exc})") from None
    return workdir, problems


def _member(ext: str, data: bytes, fields: dict[str, Any]) -> str:
    """Fill ``fields`` from one member; the problem with it, or ""."""
    if ext == "cls":
        text = data.decode("utf-8", "replace").strip()
        if not _CLASS.fullmatch(text):  # ASCII digits: "²".isdigit() is true, int("²") fails
            return f".cls holds {text[:30]!r}, not an integer class (-1: no class)"
        fields["label"] = int(text)
    elif ext == "txt":
        try:
            fields["caption"] = data.decode("utf-8")
        except UnicodeDecodeError:
            return ".txt is not valid UTF-8 text"
    elif ext == "json":
        try:
            value = parse_json(data)
        except (UnicodeDecodeError, ValueError) as exc:
            return f".json does not parse ({exc})"
        if isinstance(value, dict) and not any(k in RESERVED_FIELDS for k in value):
            fields.update(value)
        else:
            fields["json"] = value
    return ""


def scan_webdataset(root: Path, where: str, problems: dict[str, str] | None = None) -> SourceScan:
    """The ``SourceScan`` of the samples in the tree ``root`` (see the module docstring); the
    samples in ``problems`` (key -> reason) are skipped with their reason."""
    problems = dict(problems or {})
    groups: dict[str, dict[str, str]] = {}
    for rel in _files(root):
        key, ext = split_key(rel)
        members = groups.setdefault(key, {})
        if ext in members:  # x.jpg beside x.JPG: one member kind twice
            problems.setdefault(key, f"members {members[ext]} and {rel} are both .{ext}")
        members[ext] = rel
    rows: list[Row] = []
    skipped: list[dict[str, str]] = []
    for key, members in groups.items():
        images = [members[e] for e in IMAGE_MEMBERS if e in members]
        problem = "" if len(images) == 1 else ("no image member" if not images else f"{len(images)} images")
        problem = problems.get(key, problem)
        fields: dict[str, Any] = {}
        for ext, rel in members.items():
            if problem:
                break
            if ext in ("cls", "txt", "json"):
                problem = _member(ext, (root / rel).read_bytes(), fields)
        if problem:
            skipped.append({"path": key, "reason": f"{where}: sample {key}: {problem}"})
            continue
        label = fields.pop("label", -1)
        rows.append(Row(images[0], label, fields, f"{where}: sample {key}"))
    if not rows:
        shards = any(root.glob("*.tar"))
        hint = f"; it holds tar shards: name them (pack webdataset {root}/*.tar ...)" if shards else ""
        raise ImgpackError(f"{where}: no WebDataset sample (files sharing a stem, one an image) found{hint}")
    classes = implied_classes([r.label for r in rows], len(rows))
    return scan_rows(rows, root, classes, None, skipped, {"webdataset": where}, where)


def webdataset_source(sources: list[str], workdir: Path) -> SourceScan:
    """A folder tree, or tar shards (unpacked into ``workdir``), as one ``SourceScan``."""
    paths = [Path(s).expanduser() for s in sources]
    if len(paths) == 1 and paths[0].is_dir():
        return scan_webdataset(paths[0], str(paths[0]))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ImgpackError(f"{missing[0]}: no such folder or tar shard; give one folder or tar shards")
    root, problems = unpack_shards(paths, workdir)
    return scan_webdataset(root, ", ".join(map(str, paths)), problems)
