"""Formats chosen by a property, asked of the registry (or of a packed dataset): a new format
joins every test that needs the property, without anyone editing a list of names."""

from __future__ import annotations

from pathlib import Path

from readers.formats import format_named, format_names


def formats_storing(encoding: str) -> list[str]:
    """The formats that can store images encoded as ``encoding``."""
    return [name for name in format_names() if encoding in format_named(name).encodings]


def formats_with_index_files() -> list[str]:
    """The formats that keep a rebuildable index file beside each shard (``pack reindex``)."""
    return [name for name in format_names() if format_named(name).indexer]


def numbered_and_not() -> list[str]:
    """One format whose samples carry their dataset index (tar keys) and one whose do not."""
    stores = {name: format_named(name).writer_class().stores_indices for name in format_names()}
    return [next(n for n, s in stores.items() if s), next(n for n, s in stores.items() if not s)]


def parts_hold_the_images(root: Path) -> bool:
    """Whether the dataset's parts (the files the manifest checksums) hold the image bytes, as
    opposed to indexes of image files kept beside them (the BMP cache): found in the data."""
    from readers.formats import open_reader

    reader = open_reader(root)
    image = bytes(reader.read(0).data)
    part = Path(reader.checksum_path(reader.manifest.shards[0]))
    files = sorted(p for p in part.rglob("*") if p.is_file()) if part.is_dir() else [part]
    return any(image in f.read_bytes() for f in files)
