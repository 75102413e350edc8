"""One part of a pack, the same for every engine: preprocess its samples, write its files.

The local engine (packer/engine/pack_run.py) feeds ``write_part`` from its process pool; a Ray task
(packer/engine/_ray_engine.py) runs ``preprocess_chunk`` and ``write_part`` itself. A finished part is a
``PartResult``; ``part_to_dict`` / ``part_from_dict`` are its JSON form, used by the progress
file and by Ray tasks (which return plain dicts to the driver).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict
from typing import Any

from packer.dedup.part_hashes import PartHashes
from packer.sources.source import SourceItem
from packer.transform.box_geometry import refit_packed
from packer.transform.preprocess import SkipSample, preprocess_file
from packer.transform.sizes import KEY as SIZES_KEY
from packer.transform.sizes import SizeTally
from readers.errors import ImgpackError
from readers.formats.packed_sample import PackedSample, PreprocessSpec
from readers.formats.writer_base import FormatWriter, PartResult, PartWriter, disk_hint
from readers.remote.urls import is_url
from readers.store.manifest import Shard

Failure = tuple[int, str, str]  # (source index, relative path, reason)
FIRST_KEY = "first"  # PartResult.extra: the dataset index the part's first sample was given
SKIPPED_AT_KEY = "skipped_at"  # PartResult.extra: positions in the part of the files skipped
SOURCE_START_KEY = "source_start"  # PartResult.extra: pack-order position of its first source file
# PartResult.extra: how many source files it took (packer/engine/_part_plan.py)
SOURCE_COUNT_KEY = "source_count"
FIELD_COUNTS_KEY = "field_counts"  # in a part's extra: how many of its samples set each field
BLOCK = 32  # items preprocessed (and, from a URL, read) together inside one task


def preprocess_chunk(
    chunk: list[SourceItem],
    spec: PreprocessSpec,
    storage_options: dict[str, Any] | None = None,
    schema: Mapping[str, str] | None = None,
) -> list[PackedSample | Failure]:
    """Each item preprocessed, or the reason it is skipped, in order. Items whose path is a URL
    are read here, several at once (packer/sources/remote_source.py), with ``storage_options``. With a
    field ``schema`` the boxes move with the pixels here, in the worker that resized them
    (``packer.transform.box_geometry.refit_packed``), not in the process that writes the part."""
    raws: Iterable[bytes | str | None] = [None] * len(chunk)
    if chunk and is_url(chunk[0].path):
        from packer.sources.remote_source import read_objects

        raws = read_objects([item.path for item in chunk], storage_options)
    out: list[PackedSample | Failure] = []
    for item, raw in zip(chunk, raws):
        try:
            if isinstance(raw, str):
                raise SkipSample(raw)
            sample = preprocess_file(item.path, item.rel, item.label, item.index, spec, raw)
            sample.fields = item.fields
            out.append(refit_packed(sample, schema, spec) if schema else sample)
        except SkipSample as exc:
            out.append((item.index, item.rel, str(exc)))
    return out


def preprocess_items(
    items: list[SourceItem],
    spec: PreprocessSpec,
    storage_options: dict[str, Any] | None = None,
    schema: Mapping[str, str] | None = None,
) -> Iterator[PackedSample | Failure]:
    """``preprocess_chunk`` over a whole part, a block at a time, so memory stays bounded."""
    for start in range(0, len(items), BLOCK):
        yield from preprocess_chunk(items[start : start + BLOCK], spec, storage_options, schema)


def write_part(
    writer: FormatWriter,
    part: int,
    results: Iterable[PackedSample | Failure],
    on_error: str,
    tick: Callable[[int], None] = lambda n: None,
    first: int = 0,
    start: int = 0,
) -> PartResult:
    """Feed one part's results to a fresh part writer; failures become skips (or an error).

    The samples kept are numbered ``first``, ``first + 1``, ... (their dataset indices, with no
    gap where a file was skipped); ``extra`` records ``first``, the part positions skipped, and
    where the part's files start in the pack order (``start``) and how many it took."""
    part_writer = writer.open_part(part + writer.part_base)
    part_writer.fields = writer.fields  # the schema of the fields its samples carry
    part_writer.classes = writer.classes
    skipped: list[dict[str, str]] = []
    skipped_at: list[int] = []
    sizes = SizeTally()
    filled: dict[str, int] = {}
    hashes = PartHashes()
    taken = 0
    try:
        for position, result in enumerate(results):
            taken = position + 1
            if isinstance(result, tuple):
                _, rel, reason = result
                if on_error == "fail":
                    raise ImgpackError(f"{rel}: {reason} (--on-error fail stops at the first bad file)")
                skipped.append({"path": rel, "reason": reason})
                skipped_at.append(position)
            else:
                result.dataset_index = writer.index_base + first + position - len(skipped_at)
                part_writer.add(result)  # boxes already refitted (preprocess_chunk)
                sizes.add(result)
                hashes.add(result)
                if result.fields:
                    for name in json.loads(result.fields):
                        filled[name] = filled.get(name, 0) + 1
            tick(1)
        shards = part_writer.close()
    except OSError as exc:
        _abort(part_writer)
        raise ImgpackError(
            f"{writer.out}: cannot write the output ({one_line(exc)}); {disk_hint(writer.out)}"
        ) from None
    except BaseException:
        _abort(part_writer)
        raise
    numbering = {FIRST_KEY: first, SKIPPED_AT_KEY: skipped_at}
    numbering |= {SOURCE_START_KEY: start, SOURCE_COUNT_KEY: taken}
    extra = {**part_writer.summary(), SIZES_KEY: sizes.to_dict(), **numbering, **hashes.to_extra()}
    if filled:
        extra[FIELD_COUNTS_KEY] = filled
    return PartResult(part, shards, skipped, extra)


def field_counts(results: Any) -> dict[str, int]:
    """How many packed samples set each field, over every part's result."""
    total: dict[str, int] = {}
    for result in results:
        for name, count in result.extra.get(FIELD_COUNTS_KEY, {}).items():
            total[name] = total.get(name, 0) + count
    return total


def _abort(part_writer: PartWriter) -> None:
    """Drop a failed part; a cleanup that fails too (the disk still full) must not hide why."""
    try:
        part_writer.abort()
    except OSError:
        pass


def one_line(exc: OSError) -> str:
    return " ".join((exc.strerror or str(exc)).split())


def part_to_dict(result: PartResult) -> dict[str, Any]:
    return asdict(result)


def part_from_dict(data: dict[str, Any]) -> PartResult:
    return PartResult(
        int(data["part"]), [Shard(**s) for s in data["shards"]], data["skipped"], data.get("extra", {})
    )
