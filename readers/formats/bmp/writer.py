"""BMP cache writer: ``OUT/<class>/<stem>.bmp`` mirroring the source tree, plus index files.

Parts may be written in parallel (Ray), and two sources in different parts may want the same
output name (``a.jpg`` and ``a.png`` both become ``a.bmp``). So a part writes its files under a
private staging folder (``.staging/part-NNNNNN/``, named by position) with a staging index, and
``finish`` gives every file its final name in dataset order and moves it there (a rename on
the same filesystem). Names are claimed case-insensitively (so the tree also survives a copy to
macOS or Windows): the first source in order gets ``<stem>.bmp``, a later one
``<stem>.<ext>.bmp``, then ``<stem>.<ext>~2.bmp`` and so on; every renamed source is listed
in the manifest (``extra.bmp.renamed``). ``finish`` can be re-run after an interruption.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from readers.errors import ImgpackError
from readers.formats.bmp.reader import COLUMNS, index_header, index_name, read_index
from readers.formats.packed_sample import PackedSample
from readers.formats.writer_base import FormatWriter, PartResult, PartWriter
from readers.store.checksums import file_sha256
from readers.store.manifest import Shard
from readers.store.record import crc32, record_crc

STAGING = ".staging"
BUCKET = 1000  # staging files per folder
NAME_MAX = 255  # bytes in one file name (ext4, xfs, tmpfs...)


def _part_dir(out: Path, part: int) -> Path:
    return out / STAGING / f"part-{part:06d}"


def _rows(path: Path, header: bool) -> Iterator[list]:
    with open(path, encoding="ascii") as fh:
        if header:
            fh.readline()
        for line in fh:
            if line.strip():
                yield json.loads(line)


class BmpPartWriter(PartWriter):
    def __init__(self, folder: Path):
        self.folder = folder
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        self.index: TextIO = open(folder / "rows.jsonl", "w", encoding="ascii")
        self.count = 0
        self.nbytes = 0

    def add(self, sample: PackedSample) -> None:
        if sample.encoding != "bmp":
            raise ImgpackError(
                f"{sample.rel}: the BMP cache got a {sample.encoding} sample; pack with --encode bmp"
            )
        bucket = f"{self.count // BUCKET:06d}"
        if self.count % BUCKET == 0:
            (self.folder / bucket).mkdir(exist_ok=True)
        staged = f"{bucket}/{self.count:09d}.bmp"
        with open(self.folder / staged, "wb") as fh:
            fh.write(sample.data)
        fields = sample.fields.encode()
        row = [staged, sample.label, sample.height, sample.width, sample.channels, len(sample.data),
               record_crc(sample.data, sample.label, sample.height, sample.width, sample.channels, "bmp",
                          fields),
               sample.rel]  # fmt: skip
        if self.fields:
            row.append(sample.fields)  # a 9th column: the sample's fields as JSON text, under the crc32
        self.index.write(json.dumps(row) + "\n")
        self.count += 1
        self.nbytes += len(sample.data)

    def close(self) -> list[Shard]:
        self.index.close()
        (self.folder / "rows.jsonl").replace(self.folder / "index.jsonl")  # the part is complete
        staged = (self.folder / "index.jsonl").relative_to(self.folder.parent.parent).as_posix()
        # Named, placed and checksummed in finish().
        return [Shard(staged, 0, self.count, self.nbytes, "")]

    def abort(self) -> None:
        try:
            self.index.close()  # flushing may fail again (disk full): the folder goes anyway
        except OSError:
            pass
        shutil.rmtree(self.folder, ignore_errors=True)
        try:
            self.folder.parent.rmdir()  # .staging, when no other part is in it
        except OSError:
            pass


def _fit(name: str, source: str) -> str:
    """``name``, or when it is longer than a file name may be (255 bytes), its stem cut short
    and marked with a hash of the source path, so long names that collide still get a file."""
    if len(os.fsencode(name)) <= NAME_MAX:
        return name
    tag = f"~{crc32(os.fsencode(source)):08x}.bmp"
    stem = os.fsencode(name[: -len(".bmp")])[: NAME_MAX - len(tag)]
    return _cut(stem) + tag


def _cut(stem: bytes) -> str:
    """Bytes cut at an arbitrary point, back to str without a broken trailing UTF-8 sequence."""
    for drop in range(4):
        try:
            return stem[: len(stem) - drop].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return os.fsdecode(stem)


class Names:
    """Final file names, claimed in dataset order; collisions resolved as the module says."""

    def __init__(self) -> None:
        self.claimed: set[str] = set()  # every class's: a shuffled pack visits them in any order
        self.renamed: dict[str, str] = {}

    def claim(self, source: str, taken: str | None = None) -> str:
        if taken is None:
            folder, name = posixpath.split(source)
            stem, ext = posixpath.splitext(name)
            candidates = [f"{stem}.bmp", f"{stem}{ext}.bmp"] if ext else [f"{stem}.bmp"]
            candidates = [posixpath.join(folder, _fit(c, source)) for c in candidates]
            taken = next((c for c in candidates if c.casefold() not in self.claimed), None)
            n = 2
            while taken is None:
                candidate = posixpath.join(folder, _fit(f"{stem}{ext}~{n}.bmp", source))
                taken = None if candidate.casefold() in self.claimed else candidate
                n += 1
        self.claimed.add(taken.casefold())
        if taken != posixpath.splitext(source)[0] + ".bmp":
            self.renamed[source] = taken
        return taken


class BmpWriter(FormatWriter):

    def open_part(self, part: int) -> BmpPartWriter:
        return BmpPartWriter(_part_dir(self.out, part))

    def part_files(self, part: int) -> list[Path]:
        return [_part_dir(self.out, part)]

    def finish(self, results: list[PartResult], classes: list[str]) -> tuple[list[Shard], dict[str, Any]]:
        placed, extra = super().finish(results, classes)
        names = Names()
        base = self.base_root
        for position in range(self.part_base if base is not None else 0):  # appending: names taken
            for row in read_index(Path(str(base)) / index_name(position))[1]:
                names.claim(row[7], row[0])
        shards = []
        for position, shard in enumerate(placed, self.part_base):
            final = self.out / index_name(position)
            staged = self.out / shard.file
            if staged.exists():
                self._place(staged, final, shard, names)
            else:  # placed by an earlier, interrupted finish: replay its names
                header, rows = read_index(final)
                for row in rows:
                    names.claim(row[7], row[0])
            data_bytes = sum(row[5] for row in _rows(final, header=True))
            shards.append(Shard(final.name, shard.first, shard.count, data_bytes, file_sha256(final)))
        for name in classes:  # every class has a folder, so ImageFolder's labels equal ours
            (self.out / name).mkdir(exist_ok=True)
        shutil.rmtree(self.out / STAGING, ignore_errors=True)
        index = [s.file for s in shards]
        return shards, {**extra, "bmp": {"index": index, "columns": COLUMNS, "renamed": names.renamed}}

    def _place(self, staged: Path, final: Path, shard: Shard, names: Names) -> None:
        part_dir = staged.parent
        tmp = final.with_name(f".{final.name}.tmp")
        with open(tmp, "w", encoding="ascii") as fh:
            fh.write(index_header(shard.first, shard.count) + "\n")
            for row in _rows(staged, header=False):
                target = names.claim(row[7])
                source = part_dir / row[0]
                dest = self.out / target
                if source.exists():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(source, dest)
                elif not dest.exists():
                    raise ImgpackError(f"{source}: staged BMP file is missing; re-run the pack with --force")
                fh.write(json.dumps([target, *row[1:]]) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
