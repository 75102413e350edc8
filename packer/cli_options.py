"""Click options shared by several ``pack`` commands: remote storage, and the one shape of the
commands that pack another kind of source (list, COCO, WebDataset, Parquet) like ``imagefolder``."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
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


def fail_on_a_bad_row(scan: Any, on_error: str) -> None:
    """With ``--on-error fail``, a list or annotation row the scan skipped stops the pack."""
    from readers.errors import ImgpackError

    if scan.skipped and on_error == "fail":
        first = scan.skipped[0]
        raise ImgpackError(f"{first['path']}: {first['reason']} (--on-error fail stops at the first bad row)")


def source_command(
    group: click.Group,
    name: str,
    help: str,
    params: list[click.Parameter],
    scan: Callable[..., AbstractContextManager[Any]],
    resumable: bool = True,
) -> click.Command:
    """The ``pack NAME`` command that packs ``scan(**its own params)``'s source (a context: a
    scratch folder may live as long as the pack) with every other option of ``group``'s
    ``imagefolder``, copied from it so the commands never drift apart (``--resume`` only where
    ``resumable``); a row the scan skipped stops it under ``--on-error fail``."""
    imagefolder = group.commands["imagefolder"]
    pack = imagefolder.callback
    assert pack is not None
    dropped = {"src"} if resumable else {"src", "resume"}
    shared = [p for p in imagefolder.params if p.name not in dropped]
    own = [p.name for p in params]

    def run(**given: Any) -> Any:
        options = {k: v for k, v in given.items() if k not in own}
        with scan(**{k: given[k] for k in own}) as source:
            fail_on_a_bad_row(source, options["on_error"])
            return pack(src=source, **options, **({} if resumable else {"resume": False}))

    return click.Command(name, callback=run, params=[*params, *shared], help=help)
