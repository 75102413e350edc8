"""Exceptions shared by the packer and the readers.

Every user-facing error is an ``ImgpackError`` whose message names the file and the fix; the CLI
prints it as one line and exits non-zero.
"""

import warnings


class ImgpackError(Exception):
    """A user-facing error: bad input, a missing or invalid dataset, a misconfiguration."""


class ManifestError(ImgpackError):
    """A directory is not a complete, readable imgpack dataset."""


class ChecksumError(ImgpackError):
    """Stored bytes do not match the checksum recorded at packing time."""


class DecodeError(ImgpackError):
    """Stored image bytes do not decode; the message names the dataset, part and sample."""


class OptionError(ImgpackError, ValueError):
    """An argument or command-line option with a value that cannot be used (still a ValueError)."""


class CallError(ImgpackError, TypeError):
    """An entry point called with arguments it does not take together (still a TypeError)."""


class DatasetReplacedError(ManifestError):
    """The dataset directory was replaced (``pack --force``) after a reader opened it."""


def warn(message: str) -> None:
    """A ``UserWarning`` shown as ``message`` alone (``imgpack:0: UserWarning: ...``): pointed at
    no file, so Python's format prints no line of imgpack's source under it."""
    warnings.warn_explicit(message, UserWarning, "imgpack", 0, module="imgpack")
