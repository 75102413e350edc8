"""The manifest: the one file that makes a directory a dataset.

It is written last and atomically (temp file, fsync, rename), so a directory with a valid
manifest is always a complete dataset and anything else is refused with a clear error.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from readers.errors import ChecksumError, ManifestError
from readers.remote.urls import is_url
from readers.store._manifest_schema import check_schema, load_manifest_json

MANIFEST_NAME = "manifest.json"
PROGRESS_NAME = ".imgpack-progress.json"  # present while a pack runs or after it was interrupted
# The manifest's own checksum: sha256 of its other fields as canonical JSON. Readers with
# ``verify=True`` (and ``pack verify``) refuse a manifest whose fields no longer match it, so a
# flipped byte in a count, a class name or a shard checksum is caught; plain reads accept
# hand-edited manifests (whose schema still passes).
SEAL_FIELD = "manifest_sha256"
# 2: the per-record checksums of LMDB and HDF5 also cover the label and the shape fields.
FORMAT_VERSION = 2
ENCODINGS = ("jpeg", "png", "raw", "bmp", "original")


def imgpack_version() -> str:
    try:
        from importlib.metadata import version

        return version("imgpack")
    except Exception:  # running from a source tree that is not installed
        return "0+unknown"


def json_text(data: Any, indent: int | None = None) -> str:
    """JSON with names kept readable, or \\u-escaped where a name is not UTF-8.

    A file or folder name that is not valid UTF-8 reaches Python as lone surrogates
    (surrogateescape); those cannot be written as UTF-8 but are valid JSON as \\u escapes, and
    read back into the same str (``os.fsencode`` gives the original bytes).
    """
    text = json.dumps(data, indent=indent, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(data, indent=indent, ensure_ascii=True)
    return text


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
    # count, upscaled and min/max height/width of the stored images (packer.transform.sizes); None in
    # manifests written before imgpack recorded it.
    stored_sizes: dict[str, int] | None = None
    # Per-sample fields beyond the label: {name: kind} (readers/fields/field_schema.py) and how many samples
    # set each (``pack info``'s fill rates); empty for datasets without fields.
    fields: dict[str, str] = field(default_factory=dict)
    field_counts: dict[str, int] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    imgpack_version: str = field(default_factory=imgpack_version)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def to_json(self) -> str:
        data = asdict(self)
        data[SEAL_FIELD] = seal_of(data)
        return json_text(data, indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "manifest") -> Manifest:
        check_schema(data, where, ENCODINGS, FORMAT_VERSION)
        shards = [Shard(**s) for s in data["shards"]]
        known = {f for f in cls.__dataclass_fields__}
        fields = {k: v for k, v in data.items() if k in known and k != "shards"}
        manifest = cls(shards=shards, **fields)
        # True / False: the seal matches or not; None: no seal (written by hand or by hand-edit).
        manifest.__dict__["_sealed"] = seal_of(data) == data[SEAL_FIELD] if SEAL_FIELD in data else None
        manifest.__dict__["_where"] = where
        manifest.__dict__["_seal"] = data.get(SEAL_FIELD)  # what a view records of its parent
        return manifest

    def check_seal(self) -> None:
        """Raise ChecksumError unless the manifest read from disk matches its own checksum."""
        sealed = self.__dict__.get("_sealed", True)
        if not sealed:
            where = self.__dict__.get("_where", "manifest")
            problem = "has no manifest_sha256" if sealed is None else "does not match its manifest_sha256"
            raise ChecksumError(
                f"{where}: {problem} (hand-edited or corrupt); re-pack the dataset, or read it "
                "without verify=True if the edit was deliberate"
            )

    def validate(self, where: str = "manifest") -> None:
        """Raise ManifestError unless this manifest passes the schema readers check."""
        check_schema(asdict(self), where, ENCODINGS, FORMAT_VERSION)

    def sample_identity(self) -> str:
        """Which samples sit at which indices, as a short id a resume state carries: the order
        the packer wrote (``--order``/``--seed``), the count and the classes, hashed. Two packs of
        one folder with different seeds get different ids; a re-pack at another size keeps it."""
        order = self.extra.get("order") if isinstance(self.extra, dict) else None
        kind: Any = "unrecorded"
        seed: Any = None
        if isinstance(order, dict):
            kind, seed = order.get("kind"), order.get("seed")
        text = json_text({"num_samples": self.num_samples, "classes": self.classes, "order": [kind, seed]})
        digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return f"{kind}:{'-' if seed is None else seed}:{digest}"

    def shard_of(self, index: int) -> int:
        """Position in ``shards`` of the shard holding global sample ``index``."""
        if len(self.shards) == 1:
            return 0
        firsts = self.__dict__.get("_firsts")
        if firsts is None or len(firsts) != len(self.shards):
            firsts = self.__dict__["_firsts"] = [s.first for s in self.shards]
        return bisect.bisect_right(firsts, index) - 1


def seal_of(data: dict[str, Any]) -> str:
    """sha256 of every field but the seal itself, as canonical JSON."""
    fields = {k: v for k, v in data.items() if k != SEAL_FIELD}
    text = json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def read_manifest(root: str | os.PathLike, storage_options: dict[str, Any] | None = None) -> Manifest:
    """The manifest of the dataset at ``root``: a directory, or an fsspec URL (``s3://bucket/ds``)."""
    if is_url(root):
        return _read_remote_manifest(root, storage_options)
    root = Path(root)
    path = root / MANIFEST_NAME
    if not root.exists():
        raise ManifestError(f"{root}: no such dataset directory")
    if root.is_file():
        hint = (
            f"open its directory {root.parent}"
            if root.name == MANIFEST_NAME
            else "pack the folder of images with `pack imagefolder FOLDER --to lmdb -o OUT`, then open OUT"
        )
        raise ManifestError(f"{root}: a file, not a packed dataset (a folder with {MANIFEST_NAME}); {hint}")
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
        data = load_manifest_json(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: unreadable or partial manifest ({exc}); re-pack the dataset") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: not a manifest object; re-pack the dataset")
    return Manifest.from_dict(data, where=str(path))


def _read_remote_manifest(root: str, storage_options: dict[str, Any] | None) -> Manifest:
    from readers.remote.urls import join_url, read_url

    url = join_url(root, MANIFEST_NAME)
    try:
        data = load_manifest_json(read_url(url, storage_options).decode("utf-8"), url)
    except FileNotFoundError:
        raise ManifestError(f"{url}: not found, so {root} is not a complete imgpack dataset") from None
    except OSError as exc:
        raise ManifestError(f"{url}: cannot read it ({exc}); check the URL and credentials") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{url}: unreadable or partial manifest ({exc}); re-upload the dataset") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{url}: not a manifest object; re-upload the dataset")
    return Manifest.from_dict(data, where=url)


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write text (or bytes) to path so that readers see either the old file or the complete new one."""
    path = Path(path)
    # A plain open (not mkstemp's 0600) so the file honours the umask like the data files.
    tmp = path.with_name(f".{path.name.lstrip('.')}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(text if isinstance(text, bytes) else text.encode("utf-8"))
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
