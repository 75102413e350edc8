"""A pack's progress file (``.imgpack-progress.json``): the parts finished so far, under the
fingerprint of what was asked, so ``resume=True`` redoes only the parts that did not finish and
refuses a re-run asked something else; and ``writing``, which turns a failed write of the output
into one line naming the fix."""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from packer.engine.parts import one_line, part_from_dict, part_to_dict
from packer.scan.source_items import rel_run
from packer.sources.source import SourceScan
from readers.errors import ImgpackError
from readers.formats.packed_sample import PreprocessSpec
from readers.formats.writer_base import PartResult, disk_hint
from readers.store.manifest import PROGRESS_NAME, write_atomic


def fingerprint(
    scan: SourceScan, fmt: str, spec: PreprocessSpec, options: dict[str, Any], order: dict[str, Any]
) -> str:
    """What a resumed pack must have been asked the same: format, preprocessing, options, order,
    the source's classes, files and fields."""
    digest = hashlib.sha256()
    asked: list[Any] = [fmt, spec.to_dict(), options, scan.classes, order]
    if scan.fields:  # a resumed pack must carry the same fields
        asked.append(scan.fields)
    digest.update(json.dumps(asked, sort_keys=True).encode())
    digest.update(rel_run(scan.items))  # every rel, UTF-8 (surrogateescape), NUL-terminated
    if scan.fields:
        for item in scan.items:
            digest.update(item.fields.encode() + b"\0")
    return digest.hexdigest()


def load_progress(out: Path, fingerprint: str) -> dict[int, PartResult]:
    path = out / PROGRESS_NAME
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    if data.get("fingerprint") != fingerprint:
        raise ImgpackError(
            f"{out}: the interrupted pack used other sources or options; "
            "re-run with the same ones, or use --force to start over"
        )
    return {int(p["part"]): part_from_dict(p) for p in data.get("parts", [])}


def save_progress(out: Path, fingerprint: str, done: dict[int, PartResult]) -> None:
    data = {"fingerprint": fingerprint, "parts": [part_to_dict(done[k]) for k in sorted(done)]}
    with writing(out, "progress file"):
        write_atomic(out / PROGRESS_NAME, json.dumps(data))


def writing(out: Path, what: str) -> contextlib.AbstractContextManager:
    """Turn an OSError (disk full, read-only) while writing ``what`` into one clear line."""

    @contextlib.contextmanager
    def guard():
        try:
            yield
        except OSError as exc:
            raise ImgpackError(
                f"{out}: cannot write the {what} ({one_line(exc)}); {disk_hint(out)}, "
                "then re-run with --resume"
            ) from None

    return guard()
