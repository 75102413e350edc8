"""``pack reindex``: rebuild a tar or tfrecord dataset's shard indexes (``.idx``) from the shards,
and a lost or damaged label file from the records, checked against what the manifest recorded."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from readers.errors import ImgpackError
from readers.formats import open_reader
from readers.formats.format import load
from readers.formats.label_file import LABELS_DTYPE, parse_entry
from readers.formats.registry import format_named, registered
from readers.formats.rolling_writer import index_path
from readers.store.checksums import file_sha256, sha256_of_bytes
from readers.store.manifest import Manifest, read_manifest, write_atomic


def reindex(dataset: str | os.PathLike) -> list[str]:
    """Rebuild every shard's ``.idx`` of a tar or tfrecord DATASET from the shards, and a lost or
    damaged label file; the files written."""
    root = Path(dataset)
    manifest = read_manifest(root)
    indexer = format_named(manifest.format).indexer
    if indexer is None:
        indexed = " and ".join(name for name, fmt in registered().items() if fmt.indexer)
        raise ImgpackError(f"{root}: is a {manifest.format} dataset; only {indexed} datasets have .idx files")
    shard_index = load(indexer)
    written = []
    for shard in manifest.shards:
        path = root / shard.file
        if not path.is_file():
            raise ImgpackError(f"{path}: shard listed in the manifest is missing; re-pack the dataset")
        with open(path, "rb") as fh:
            count, text = shard_index(fh, str(path))
        if count != shard.count:
            raise ImgpackError(
                f"{path}: holds {count} samples but the manifest says {shard.count} "
                "(truncated or replaced?); re-pack the dataset"
            )
        target = index_path(path)
        check_replaceable(target, "index file")
        write_atomic(target, text)
        os.chmod(target, 0o644)
        written.append(str(target))
    return written + restore_label_file(root, manifest)


def check_replaceable(path: Path, what: str) -> None:
    """``reindex`` writes ``path`` anew; something other than a file there (a directory) is
    refused: it is not the dataset's to delete."""
    if path.exists() and not path.is_file():
        raise ImgpackError(
            f"{path}: is a directory or special file where the {what} belongs; move it away "
            "and run `pack reindex` again"
        )


def restore_label_file(root: Path, manifest: Manifest) -> list[str]:
    """Write the label file back from the shards' records when it is missing or damaged (``[]``
    when it is whole); refused when the records' labels are not those the manifest's checksum of
    it records."""
    entry = manifest.extra.get("labels")
    if entry is None:
        return []
    name, _, sha = parse_entry(entry, manifest.num_samples, f"{root}: manifest field 'extra.labels'")
    path = root / name
    if path.is_file() and file_sha256(path) == sha:
        return []
    check_replaceable(path, "label file")
    reader = open_reader(root)
    try:  # shard by shard: a block holds its images too
        labels = [r.label for s in manifest.shards for r in reader.read_block(s.first, s.stop)]
    finally:
        reader.close()
    data = np.asarray(labels, dtype=LABELS_DTYPE).tobytes()
    if sha256_of_bytes(data) != sha:
        raise ImgpackError(
            f"{path}: the shards' labels are not those the manifest records for the label file "
            "(shards replaced or modified?); re-pack the dataset"
        )
    write_atomic(path, data)
    return [str(path)]
