"""Paths taken from a manifest or an index: they must stay inside the dataset directory.

A dataset is data, and data may be hostile: a shard entry ``../../etc/passwd``, an absolute
path, or a symlink pointing out of the dataset must never make a reader open a file that is not
part of the dataset. Names are checked as text when the manifest or index is read (cheap, also
for remote datasets), and local files are resolved (symlinks followed) when they are opened.
"""

from __future__ import annotations

import os
import re

from readers.errors import ManifestError

# A ".." component, a leading "/" or "\", a Windows drive ("C:"), a backslash or a NUL byte.
_UNSAFE = re.compile(r"(^|/)\.\.(/|$)|^[/\\]|^[A-Za-z]:|\\|\x00", re.MULTILINE)


def unsafe_name(name: object) -> bool:
    """True unless ``name`` is a non-empty relative POSIX path with no ``..`` component."""
    return not isinstance(name, str) or not name or name == "." or _UNSAFE.search(name) is not None


def check_names(names: list[str], where: str, what: str) -> None:
    """Raise ManifestError naming the first of ``names`` that could leave the dataset directory.

    One regular-expression pass over all names joined, so a million-row index checks quickly.
    """
    if all(isinstance(n, str) and n and "\n" not in n for n in names):
        if _UNSAFE.search("\n".join(names)) is None:
            return
    bad = next(n for n in names if unsafe_name(n) or "\n" in n)
    raise ManifestError(
        f"{where}: {what} {bad!r} is not a relative path inside the dataset directory; "
        "refusing to read it (the manifest or index is corrupt or hostile)"
    )


def inside(root: str | os.PathLike, path: str | os.PathLike, where: str) -> str:
    """``path`` with symlinks resolved, or ManifestError if that leaves ``root``."""
    base = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != base and not real.startswith(base.rstrip(os.sep) + os.sep):
        raise ManifestError(
            f"{where}: {path} resolves to {real}, outside the dataset directory {base}; "
            "refusing to read it (a symlink out of the dataset?)"
        )
    return real
