"""``--append`` on every source command (``pack imagefolder NEW -o DS --append``, ``pack
imagelist ... -o DS --append``...): the source scanned as the command scans it, then added to
the dataset DS as its next version (packer/edit/append.py), with one ``PackSpec`` built from the
options before anything is scanned or written."""

from __future__ import annotations

import dataclasses
from typing import Any

import click
from click.core import ParameterSource

from packer.commands.cli_options import emit_json
from packer.commands.pack_cli import PREPROCESS, fail_on_a_bad_row, named_by, spec_keywords
from packer.scan.source_kind import Source
from packer.spec import PackSpec
from readers.errors import OptionError


def typed(ctx: click.Context) -> dict[str, Any]:
    """The options the user set (not their defaults)."""
    kinds = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    return {k: v for k, v in ctx.params.items() if ctx.get_parameter_source(k) in kinds}


def run_append(ctx: click.Context, source: Source, own: dict[str, Any], given: dict[str, Any]) -> None:
    """Append what ``source`` scans from its parameters ``own`` to the dataset ``given["out"]``
    with the pack options ``given`` (the ones typed must agree with the dataset's)."""
    from packer.edit.append import append_with
    from readers.store.manifest import read_manifest

    asked, out = typed(ctx), given["out"]
    if asked.get("force"):
        raise OptionError("--append adds to the dataset and --force replaces it; pass one of them")
    manifest = read_manifest(out, given["storage_options"] or None)
    if "fmt" in asked and asked["fmt"] != manifest.format:
        raise OptionError(f"{out}: is a {manifest.format} dataset, not --to {asked['fmt']}; drop --to")
    order = manifest.extra.get("order", {})
    for name in ("order", "seed"):
        recorded = order.get("kind" if name == "order" else name)
        if name in asked and recorded is not None and asked[name] != recorded:
            raise OptionError(f"{out}: was packed with --{name} {recorded}, not {asked[name]}; drop --{name}")
    spec = PackSpec(source=named_by(own), format=manifest.format, **spec_keywords(given))
    with source.scan(**own, storage_options=spec.storage_options) as scanned:
        fail_on_a_bad_row(scanned, spec.on_error)
        preprocess = {k: v for k, v in asked.items() if k in PREPROCESS}
        report = append_with(dataclasses.replace(spec, source=scanned), preprocess, manifest)
    if given["as_json"]:
        emit_json({k: v for k, v in vars(report).items() if k != "pack"})
    elif not given["quiet"]:
        new = f"; new classes {', '.join(report.new_classes)}" if report.new_classes else ""
        click.echo(
            f"appended {report.added} images to {out} (now version {report.version}, {report.num_samples} "
            f"samples) in {report.seconds:.1f} s; skipped {report.skipped}{new}"
        )
