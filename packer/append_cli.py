"""``--append`` on every source command (``pack imagefolder NEW -o DS --append``, ``pack
imagelist ... -o DS --append``...): the source scanned as the command scans it, then added to
the dataset DS as its next version (packer/append.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from readers.errors import OptionError

PREPROCESS = (
    "resize",
    "resize_mode",
    "crop",
    "encode",
    "quality",
    "mode",
    "upscale",
    "resample",
    "max_pixels",
)
FORMAT_OPTIONS = ("shards", "samples_per_shard", "shard_size", "compression")


def given(ctx: click.Context) -> dict[str, Any]:
    """The options the user set (not their defaults)."""
    typed = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    return {k: v for k, v in ctx.params.items() if ctx.get_parameter_source(k) in typed}


def run_append(
    ctx: click.Context,
    src: Any,
    out: str,
    storage_options: dict[str, Any] | None,
    shard_size: int | None,
    emit_json: Callable[[Any], None],
) -> None:
    """Append ``src`` (a path, URL or an already scanned source) to the dataset ``out``
    (``shard_size`` parsed, ``emit_json`` printing the summary: packer/cli.py's)."""
    from packer.append import append_to
    from packer.engine import _scan
    from packer.source import SourceScan
    from readers.manifest import read_manifest

    asked = given(ctx)
    if asked.get("force"):
        raise OptionError("--append adds to the dataset and --force replaces it; pass one of them")
    manifest = read_manifest(out, storage_options)
    if "fmt" in asked and asked["fmt"] != manifest.format:
        raise OptionError(f"{out}: is a {manifest.format} dataset, not --to {asked['fmt']}; drop --to")
    order = manifest.extra.get("order", {})
    for name in ("order", "seed"):
        recorded = order.get("kind" if name == "order" else name)
        if name in asked and recorded is not None and asked[name] != recorded:
            raise OptionError(f"{out}: was packed with --{name} {recorded}, not {asked[name]}; drop --{name}")
    params = ctx.params
    options = {k: params[k] for k in FORMAT_OPTIONS if params.get(k) is not None}
    if shard_size is not None:
        options["shard_size"] = shard_size
    scan = src if isinstance(src, SourceScan) else _scan(src, storage_options)
    report = append_to(
        out,
        scan,
        {k: v for k, v in asked.items() if k in PREPROCESS},
        options=options,
        workers=params["workers"],
        engine=params["engine"],
        resume=params["resume"],
        quiet=params["quiet"] or params["as_json"],
        ray_address=params["ray_address"],
        on_error=params["on_error"],
        storage_options=storage_options,
        dedup=params.get("dedup"),
        near_distance=params.get("near_distance"),
    )
    if params["as_json"]:
        emit_json({k: v for k, v in vars(report).items() if k != "pack"})
    elif not params["quiet"]:
        new = f"; new classes {', '.join(report.new_classes)}" if report.new_classes else ""
        click.echo(
            f"appended {report.added} images to {out} (now version {report.version}, {report.num_samples} "
            f"samples) in {report.seconds:.1f} s; skipped {report.skipped}{new}"
        )
