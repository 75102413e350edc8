"""The manifest: the one file that makes a directory a dataset.

It is written last and atomically (temp file, fsync, rename), so a directory with a valid
manifest is always a complete dataset and anything else is refused with a clear error.
"""

from __future__ import annotations

import bisect
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from readers.errors import ManifestError

MANIFEST_NAME = "manifest.json"
PROGRESS_NAME = ".imgpack-progress.json"  # present while a pack runs or after it was interrupted
FORMAT_VERSION = 1
ENCODINGS = ("jpeg", "png", "raw", "bmp", "original")


def imgpack_version() -> str:
    try:
        from importlib.metadata import version

        return version("imgpack")
    except Exception:  # running from a source tree that is not installed
        return "0+unknown"


@dataclass
class Shard:
    """One data file (or LMDB environment directory) holding samples [first, first + count)."""

    file: str
    first: int
    count: int
    bytes: int
    sha256: str

    @property
    def stop(self) -> int:
        return self.first + self.count


@dataclass
class Manifest:
    format: str
    num_samples: int
    classes: list[str]
    encoding: str
    preprocess: dict[str, Any]
    shards: list[Shard]
    skipped: list[dict[str, str]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    # count, upscaled and min/max height/width of the stored images (packer.sizes); None in
    # manifests written before imgpack recorded it.
    stored_sizes: dict[str, int] | None = None
    format_version: int = FORMAT_VERSION
    imgpack_version: str = field(default_factory=imgpack_version)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, ensure_ascii=False, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "manifest") -> Manifest:
        required = ("format", "format_version", "num_samples", "classes", "encoding", "shards")
        missing = [k for k in required if k not in data]
        if missing:
            raise ManifestError(f"{where}: missing field(s) {', '.join(missing)}; re-pack the dataset")
        version = data["format_version"]
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ManifestError(
                f"{where}: format_version {version!r} is newer than this imgpack supports "
                f"({FORMAT_VERSION}); upgrade imgpack (pip install -U imgpack)"
            )
        try:
            shards = [Shard(**s) for s in data["shards"]]
        except TypeError as exc:
            raise ManifestError(f"{where}: malformed shard entry ({exc}); re-pack the dataset") from None
        known = {f for f in cls.__dataclass_fields__}
        fields = {k: v for k, v in data.items() if k in known and k != "shards"}
        manifest = cls(shards=shards, **fields)
        manifest.validate(where)
        return manifest

    def validate(self, where: str = "manifest") -> None:
        if self.encoding not in ENCODINGS:
            raise ManifestError(f"{where}: unknown encoding {self.encoding!r}")
        total = 0
        for shard in self.shards:
            if shard.first != total:
                raise ManifestError(
                    f"{where}: shard {shard.file} starts at {shard.first}, expected {total}; "
                    "the manifest is corrupt, re-pack the dataset"
                )
            total += shard.count
        if total != self.num_samples:
            raise ManifestError(
                f"{where}: shards hold {total} samples but num_samples is {self.num_samples}; "
                "the manifest is corrupt, re-pack the dataset"
            )

    def shard_of(self, index: int) -> int:
        """Position in ``shards`` of the shard holding global sample ``index``."""
        if len(self.shards) == 1:
            return 0
        firsts = self.__dict__.get("_firsts")
        if firsts is None or len(firsts) != len(self.shards):
            firsts = self.__dict__["_firsts"] = [s.first for s in self.shards]
        return bisect.bisect_right(firsts, index) - 1


def read_manifest(root: str | os.PathLike, storage_options: dict[str, Any] | None = None) -> Manifest:
    """The manifest of the dataset at ``root``: a directory, or an fsspec URL (``s3://bucket/ds``)."""
    if isinstance(root, str) and "://" in root:
        return _read_remote_manifest(root, storage_options)
    root = Path(root)
    path = root / MANIFEST_NAME
    if not root.exists():
        raise ManifestError(f"{root}: no such dataset directory")
    if not path.is_file():
        if (root / PROGRESS_NAME).exists():
            raise ManifestError(
                f"{root}: no {MANIFEST_NAME}: an interrupted pack; re-run the same `pack imagefolder` "
                "command with --resume to finish it"
            )
        raise ManifestError(
            f"{root}: no {MANIFEST_NAME}: this is not a packed dataset "
            f"(pack it with `pack imagefolder {root} --to lmdb -o OUT`, then open OUT)"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: unreadable or partial manifest ({exc}); re-pack the dataset") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: not a manifest object; re-pack the dataset")
    return Manifest.from_dict(data, where=str(path))


def _read_remote_manifest(root: str, storage_options: dict[str, Any] | None) -> Manifest:
    from readers.remote import join_url, read_url

    url = join_url(root, MANIFEST_NAME)
    try:
        data = json.loads(read_url(url, storage_options).decode("utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"{url}: not found, so {root} is not a complete imgpack dataset") from None
    except OSError as exc:
        raise ManifestError(f"{url}: cannot read it ({exc}); check the URL and credentials") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{url}: unreadable or partial manifest ({exc}); re-upload the dataset") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{url}: not a manifest object; re-upload the dataset")
    return Manifest.from_dict(data, where=url)


def write_atomic(path: Path, text: str) -> None:
    """Write text to path so that readers see either the old file or the complete new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_manifest(root: str | os.PathLike, manifest: Manifest) -> Path:
    manifest.validate(str(root))
    path = Path(root) / MANIFEST_NAME
    write_atomic(path, manifest.to_json())
    return path
