"""What several ``pack`` commands share: remote storage options, scratch folders, JSON output."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from readers.errors import OptionError


def parse_storage_options(text: str | None) -> dict[str, Any]:
    """``--storage-options``: a JSON object, or ``@FILE`` / a path to a file holding one.

    The value is passed to fsspec as is; credentials are better left to the usual chain
    (environment, ~/.aws, instance roles) than put on a command line. Messages never echo it.
    """
    if not text:
        return {}
    source = "--storage-options"
    raw = text
    candidate = text[1:] if text.startswith("@") else text
    if text.startswith("@") or (not text.lstrip().startswith("{") and Path(candidate).is_file()):
        try:
            raw = Path(candidate).read_text(encoding="utf-8")
        except OSError as exc:
            raise click.BadParameter(f"cannot read {candidate} ({exc.strerror})", param_hint=source) from None
        source = f"--storage-options file {candidate}"
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        # Position only: the text may hold a secret.
        raise click.BadParameter(
            f"not valid JSON (line {exc.lineno}, column {exc.colno}); pass an object like "
            '\'{"client_kwargs": {"endpoint_url": "http://host:9000"}}\' or @file.json',
            param_hint=source,
        ) from None
    if not isinstance(value, dict):
        raise click.BadParameter("not a JSON object like '{\"anon\": false}'", param_hint=source)
    return value


def storage_options_option(fn: Callable) -> Callable:
    """``--storage-options JSON|@FILE``, parsed into a dict (empty when absent)."""
    return click.option(
        "--storage-options",
        "storage_options",
        default=None,
        metavar="JSON|@FILE",
        callback=lambda ctx, param, value: parse_storage_options(value),
        help="fsspec options for s3://, gs://, ... URLs (endpoint, profile, ...) as a JSON object "
        "or @file.json; credentials come from the usual environment/credential chain.",
    )(fn)


@contextmanager
def scratch_folder(workdir: str | None, prefix: str, purpose: str) -> Iterator[Path]:
    """A temporary folder for ``purpose`` under ``--workdir`` (default: the system's), removed after."""
    if workdir is not None and not os.path.isdir(workdir):
        raise OptionError(
            f"{workdir}: --workdir is not an existing folder; create it, or leave --workdir out "
            f"to use the system's temporary folder for {purpose}"
        )
    with tempfile.TemporaryDirectory(prefix=prefix, dir=workdir) as scratch:
        yield Path(scratch)


def emit_json(data: Any) -> None:
    """A command's ``--json`` summary on stdout."""
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))
