"""The ``pack`` command line: a thin layer over packer.engine.pack_run, packer.info.verify and the readers."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import asdict
from typing import Any

import click

from packer.commands.cli_options import emit_json, storage_options_option
from packer.commands.pack_cli import fail_on_a_bad_row, named_by, pack_params, spec_keywords
from packer.scan.source_kind import Source
from packer.scan.source_registry import registered_sources
from packer.spec import PackSpec
from readers.errors import ImgpackError
from readers.formats.pack_option import parse_size

__all__ = ["BUG_NOTICE", "emit_json", "human_bytes", "main", "parse_size"]


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


BUG_NOTICE = (
    "pack: unexpected error: this is a bug in imgpack, not a mistake in your command; "
    "please report it with the traceback below"
)


class ImgpackGroup(click.Group):
    """User errors (``ImgpackError``, click's usage errors) become one line on stderr and exit code 1
    (2 for usage); anything else is a bug and keeps its traceback. ``--debug``: tracebacks always.
    Every registered source (packer/scan/source_registry.py) is a command, made when it is asked for,
    so a source registered after this module was imported is one too."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *registered_sources()})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        source = registered_sources().get(name)
        return source_command(source) if source else super().get_command(ctx, name)

    def invoke(self, ctx: click.Context) -> Any:
        debug = bool(ctx.params.get("debug"))
        try:
            return super().invoke(ctx)
        except ImgpackError as exc:
            if debug:
                raise
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            source = registered_sources().get(ctx.invoked_subcommand or "")
            resumable = source is not None and source.resumable
            hint = "; re-run the same command with --resume to finish" if resumable else ""
            click.echo(f"interrupted{hint}", err=True)
            sys.exit(130)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception:
            click.echo(BUG_NOTICE, err=True)
            raise


def source_command(source: Source) -> click.Command:
    """The ``pack NAME`` command of ``source``: its own parameters, then every pack option
    (packer/commands/pack_cli.py), made into one ``PackSpec`` before the source is scanned."""
    own = [p.name for p in source.params]

    def run(**given: Any) -> None:
        import signal

        from packer.commands.append_cli import run_append
        from packer.engine import pack_run

        signal.signal(signal.SIGTERM, signal.default_int_handler)  # a clean stop, like Ctrl-C
        mine = {k: given.pop(k) for k in own}
        if given["append"]:
            return run_append(click.get_current_context(), source, mine, given)
        if given["fmt"] is None:
            raise click.UsageError("Missing option '--to' (the output format).")
        asked = PackSpec(source=named_by(mine), format=given["fmt"], **spec_keywords(given))
        with source.scan(**mine, storage_options=asked.storage_options) as scanned:
            fail_on_a_bad_row(scanned, asked.on_error)
            report_pack(pack_run.pack(dataclasses.replace(asked, source=scanned)), given)

    params = [*source.params, *pack_params(source.resumable)]
    return click.Command(source.name, callback=run, params=params, help=source.help)


@click.group(cls=ImgpackGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="imgpack", message="imgpack %(version)s")
@click.option("--debug", is_flag=True, help="Show the full traceback of every error.")
def main(debug: bool) -> None:
    """imgpack: preprocess an image folder once, read it fast in PyTorch.

    \b
    pack imagefolder ~/data/train --to lmdb -o train.lmdb --resize 256
    pack info train.lmdb
    pack verify train.lmdb
    """


def report_pack(report: Any, given: dict[str, Any]) -> None:
    """A pack's summary: one line and the first skipped files, or JSON with ``--json``."""
    if given["as_json"]:
        emit_json({**asdict(report), "images_per_second": report.images_per_second})
    elif not given["quiet"]:
        click.echo(
            f"packed {report.packed} images into {report.out} ({report.format}, {report.shards} "
            f"shard(s), {human_bytes(report.bytes)}) in {report.seconds:.1f} s "
            f"({report.images_per_second:.0f} img/s); skipped {report.skipped}"
            + (f", upscaled {report.upscaled}" if report.upscaled else "")
        )
        for entry in report.skipped_files[:10]:
            click.echo(f"  skipped {entry['path']}: {entry['reason']}")
        if report.skipped > 10:
            click.echo(f"  ... and {report.skipped - 10} more (see `pack info {given['out']} --json`)")


def describe_sizes(sizes: dict[str, int] | None) -> list[str]:
    """``pack info`` lines for the stored size range and the upscaled count."""
    if sizes is None:
        return ["stored    size range not recorded (packed by an older imgpack)"]
    if not sizes.get("count"):
        return []
    heights = f"{sizes['min_height']}-{sizes['max_height']}"
    widths = f"{sizes['min_width']}-{sizes['max_width']}"
    return [
        f"stored    height {heights} px, width {widths} px",
        f"upscaled  {sizes['upscaled']} image(s)",
    ]


def describe_skips(skipped: list[dict[str, str]], top: int = 10) -> list[str]:
    """``pack info`` lines: skip reasons by count, most frequent first (paths: --json)."""
    counts: dict[str, int] = {}
    for entry in skipped:
        counts[entry["reason"]] = counts.get(entry["reason"], 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    lines = [f"  {n:>6} x {reason}" for reason, n in ranked[:top]]
    if len(ranked) > top:
        lines.append(f"  ... and {len(ranked) - top} more reason(s) (every file: pack info --json)")
    return lines


@main.command()
@click.argument("dataset", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option(
    "--buckets",
    default=None,
    metavar="SIDE[,MULTIPLE[,MAX_RATIO]]",
    help="Also print the bucket plan of AspectBuckets(area=SIDE**2, multiple=..., max_ratio=...).",
)
@click.option("--batch-size", default=64, show_default=True, help="Batch size of the --buckets plan.")
@click.option("--world-size", default=1, show_default=True, help="Ranks of the --buckets plan.")
@click.option("--leftover", type=click.Choice(["pad", "drop", "carry"]), default="pad", show_default=True,
              help="The --buckets plan's rule for a bucket's short last group.")
@storage_options_option
def info(dataset: str, as_json: bool, buckets: str | None, batch_size: int, world_size: int, leftover: str,
         storage_options: dict[str, Any]) -> None:  # fmt: skip
    """Describe the packed DATASET (a directory or URL)."""
    from packer.info.bucket_info import bucket_plan, describe_plan
    from packer.info.order_info import read_quality
    from readers.remote.urls import is_url
    from readers.store.manifest import read_manifest

    manifest = read_manifest(dataset, storage_options or None)
    problem = None if is_url(dataset) else parts_problem(dataset)
    quality = None if problem else read_quality(dataset, storage_options=storage_options or None)
    plan = None
    if buckets and not problem:
        plan = bucket_plan(dataset, buckets, batch_size, world_size, leftover)
    if as_json:
        emit_json({**asdict(manifest), "read_quality": quality.to_dict() if quality else None,
                   **({"buckets": plan} if plan else {})})  # fmt: skip
    else:
        click.echo(describe_manifest(dataset, manifest, quality))
        if plan:
            click.echo("\n".join(describe_plan(plan)))
    if problem:
        click.echo(f"problem: {problem} (a full check: pack verify {dataset})", err=True)
        sys.exit(1)


def parts_problem(dataset: str) -> str | None:
    """What is wrong with the parts of the local ``dataset`` as its reader opens them (sizes,
    counts, headers: no checksums), or None."""
    from readers.formats import open_reader

    try:
        reader = open_reader(dataset)
        try:
            reader.check_every_part()
        finally:
            reader.close()
    except ImgpackError as exc:
        return str(exc)
    return None


def describe_manifest(dataset: str, manifest: Any, quality: Any = None) -> str:
    from packer.edit.append import describe_versions
    from packer.edit.views import describe_view
    from packer.info.order_info import describe_order

    total = sum(s.bytes for s in manifest.shards)
    pre = ", ".join(f"{k}={v}" for k, v in manifest.preprocess.items() if v not in (None, False))
    lines = [
        f"dataset   {dataset}",
        f"format    {manifest.format} (version {manifest.format_version}), encoding {manifest.encoding}",
        f"samples   {manifest.num_samples} in {len(manifest.classes)} classes, "
        f"{len(manifest.shards)} shard(s)",
        f"size      {human_bytes(total)} ({human_bytes(total / max(1, manifest.num_samples))} per image)",
        f"preprocess {pre}",
        f"classes   {', '.join(manifest.classes[:10])}{' ...' if len(manifest.classes) > 10 else ''}",
        *describe_sizes(manifest.stored_sizes),
        *describe_fields(manifest.fields, manifest.field_counts, manifest.num_samples),
        f"skipped   {len(manifest.skipped)}",
        *describe_skips(manifest.skipped),
        *describe_order(manifest, quality),
        *describe_view(manifest),
        *describe_versions(manifest),
        f"created   {manifest.created} by imgpack {manifest.imgpack_version}",
    ]
    return "\n".join(lines)


def describe_fields(schema: dict[str, str], counts: dict[str, int], total: int) -> list[str]:
    """``pack info``'s lines for the per-sample fields: name, kind and how many samples set it."""
    if not schema:
        return []
    width = max(len(name) for name in schema)
    rows = [
        f"  {name:<{width}}  {kind:<8}  {counts.get(name, 0)}/{total} set "
        f"({100 * counts.get(name, 0) / max(1, total):.0f}%)"
        for name, kind in schema.items()
    ]
    return [f"fields    {len(schema)} per sample", *rows]


@main.command()
@click.argument("dataset", type=click.Path(path_type=str))
@click.option("--no-decode", is_flag=True, help="Check checksums only, do not decode every image.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Processes (default: <= 4).")
@storage_options_option
@click.option("--cache-dir", type=click.Path(path_type=str), help="Keep a URL's parts here.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True)
def verify(dataset, no_decode, workers, storage_options, cache_dir, quiet, as_json) -> None:
    """Check shard checksums and that every image in DATASET (a directory or URL) decodes."""
    from packer.info.verify import default_workers, verify_dataset

    report = verify_dataset(
        dataset,
        decode=not no_decode,
        workers=workers or default_workers(),
        storage_options=storage_options,
        cache_dir=cache_dir,
        progress=not (quiet or as_json),
    )
    if as_json:
        emit_json({**asdict(report), "ok": report.ok})
    else:
        for problem in report.problems:
            click.echo(f"problem: {problem}", err=True)
        status = "OK" if report.ok else f"FAILED ({len(report.problems)} problem(s))"
        click.echo(f"{dataset}: {report.samples} samples in {report.shards} shard(s): {status}")
    if not report.ok:
        sys.exit(1)


@main.command()
@click.argument("dataset", type=click.Path(path_type=str))
def reindex(dataset: str) -> None:
    """Rebuild the shard index files (.idx) of DATASET from its shards (formats that keep one),
    and a lost or damaged label file (labels.i64)."""
    from packer.info.reindex import reindex as rebuild

    written = rebuild(dataset)
    click.echo(f"{dataset}: wrote {len(written)} index file(s)")


def _register_optional_commands() -> None:
    """Commands that live in their own modules (bench, show, ...) join the group when present.

    An entry is a click command or a function that builds one from the group."""
    import importlib

    for module_name, attr in (
        ("packer.bench.cli", "bench"),
        ("packer.info.show_cli", "show"),
        ("packer.info.doctor", "doctor"),
        ("packer.edit.views_cli", "view_command"),
        ("packer.edit.views_cli", "split_command"),
        ("packer.dedup.dups_cli", "dups"),
        ("packer.dedup.dups_cli", "overlap"),
    ):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        command = getattr(module, attr)
        main.add_command(command if isinstance(command, click.Command) else command(main))


_register_optional_commands()

if __name__ == "__main__":  # pragma: no cover
    main(prog_name="pack")
