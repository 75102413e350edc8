"""The ``pack`` command line: a thin layer over packer.engine, packer.verify and the readers."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict
from typing import Any

import click

from packer.cli_options import storage_options_option
from packer.dedup import dedup_options
from readers.errors import ImgpackError
from readers.formats.packed_sample import (
    AUTO_RESAMPLE,
    DEFAULT_MAX_PIXELS,
    RESAMPLERS,
    RESIZE_MODES,
    PreprocessSpec,
)
from readers.formats.registry import format_names, formats_taking
from readers.manifest import ENCODINGS
from readers.order import PACK_ORDERS

SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_size(text: str | None) -> int | None:
    """'512MB' -> 512_000_000; '1GiB' -> 1_073_741_824; plain numbers are bytes."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*([\d.]+)\s*([A-Za-z]*)\s*", str(text))
    if not match or match.group(2).upper() not in SIZE_UNITS:
        raise click.BadParameter(f"{text!r} is not a size like 512MB or 1GiB")
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2).upper()])


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


BUG_NOTICE = (
    "pack: unexpected error: this is a bug in imgpack, not a mistake in your command; "
    "please report it with the traceback below"
)


RESUMABLE_COMMANDS = {"imagefolder", "imagelist", "coco"}  # the ones with --resume


class ImgpackGroup(click.Group):
    """User errors (``ImgpackError``, click's usage errors) become one line on stderr and exit code 1
    (2 for usage); anything else is a bug and keeps its traceback. ``--debug``: tracebacks always."""

    def invoke(self, ctx: click.Context) -> Any:
        debug = bool(ctx.params.get("debug"))
        try:
            return super().invoke(ctx)
        except ImgpackError as exc:
            if debug:
                raise
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            resumable = ctx.invoked_subcommand in RESUMABLE_COMMANDS
            hint = "; re-run the same command with --resume to finish" if resumable else ""
            click.echo(f"interrupted{hint}", err=True)
            sys.exit(130)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception:
            click.echo(BUG_NOTICE, err=True)
            raise


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


@main.command()
@click.argument("src", type=click.Path(path_type=str))
@click.option("--to", "fmt", type=click.Choice(format_names()), help="Output format (not with --append).")
@click.option("-o", "--out", required=True, type=click.Path(path_type=str), help="Output dataset directory.")
@click.option("--resize", type=click.IntRange(min=1), help="Target size in pixels (see --resize-mode).")
@click.option(
    "--resize-mode",
    type=click.Choice(RESIZE_MODES),
    default="shorter",
    show_default=True,
    help="shorter/longer: that side becomes --resize, aspect kept; exact: --resize x --resize.",
)
@click.option("--crop", type=click.IntRange(min=1), help="Centre crop to N x N after resizing.")
@click.option(
    "--encode",
    type=click.Choice(ENCODINGS),
    default="jpeg",
    show_default=True,
    help="How images are stored; 'original' keeps the source bytes untouched.",
)
@click.option("--quality", type=click.IntRange(1, 100), default=90, show_default=True, help="JPEG quality.")
@click.option(
    "--mode",
    type=click.Choice(["RGB", "L"]),
    default="RGB",
    show_default=True,
    help="Colour mode of the stored images (alpha is flattened on white).",
)
@click.option(
    "--upscale/--no-upscale",
    default=False,
    show_default=True,
    help="Allow --resize to enlarge images smaller than the target.",
)
@click.option(
    "--resample",
    type=click.Choice(RESAMPLERS),
    default=AUTO_RESAMPLE,
    show_default=True,
    help="auto: the readers' resampler (pack --resize N = read resize=N); or one of Pillow's filters.",
)
@click.option(
    "--max-pixels",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_PIXELS,
    show_default=True,
    help="Images with more pixels (before or after resizing) are skipped as possible decompression bombs.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Processes that preprocess images [default: number of CPUs].",
)
@click.option(
    "--engine",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="local: a process pool on this machine; ray: one Ray task per part (see --shards).",
)
@click.option("--ray-address", default=None, help="Ray cluster to join (default: start a local one).")
@click.option("--shards", type=click.IntRange(min=1), default=None,
              help="Split the source into N parts of ceil(files/N) source files each.")  # fmt: skip
@click.option("--samples-per-shard", type=click.IntRange(min=1), default=None,
              help="N kept samples a part (the last holds the rest), whatever is skipped.")  # fmt: skip
@click.option(
    "--shard-size",
    default=None,
    help=f"Roll over to a new shard at this size, e.g. 512MB ({', '.join(formats_taking('shard_size'))}).",
)
@click.option(
    "--compression",
    type=click.Choice(["none", "lzf", "gzip"]),
    default=None,
    help=f"Dataset compression ({', '.join(formats_taking('compression'))} only).",
)
@click.option(
    "--on-error",
    type=click.Choice(["skip", "fail"]),
    default="skip",
    show_default=True,
    help="skip: record bad files in the manifest and go on; fail: stop at the first one.",
)
@click.option(
    "--order",
    type=click.Choice(PACK_ORDERS),
    default="shuffled",
    show_default=True,
    help="shuffled: write the samples in a seeded permutation of the source, so block-wise "
    "reads of a class-sorted folder still give varied batches; source: keep the source order.",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the --order shuffled permutation."
)
@click.option("--force", is_flag=True, help="Replace an existing output dataset.")
@click.option("--resume", is_flag=True, help="Finish an interrupted pack into the same output.")
@click.option("--append", is_flag=True,
              help="Add the source to the dataset OUT as its next version, with its format and options.")
@storage_options_option
@dedup_options
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def imagefolder(
    src: str,
    fmt: str,
    out: str,
    resize,
    resize_mode,
    crop,
    encode,
    quality,
    mode,
    upscale,
    resample,
    max_pixels,
    workers,
    engine,
    ray_address,
    shards,
    samples_per_shard,
    shard_size,
    compression,
    on_error,
    order,
    seed,
    force,
    resume,
    append,
    storage_options,
    dedup,
    near_distance,
    quiet,
    as_json,
) -> None:
    """Pack the image folder SRC (SRC/<class>/<image>) into OUT; either may be a URL (s3://...)."""
    import signal

    from packer.engine import pack_folder

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a clean stop, like Ctrl-C
    if append:
        from packer.append_cli import run_append

        ctx = click.get_current_context()
        return run_append(ctx, src, out, storage_options or None, parse_size(shard_size), emit_json)
    if fmt is None:
        raise click.UsageError("Missing option '--to' (the output format).")

    spec = PreprocessSpec(
        resize=resize,
        resize_mode=resize_mode,
        crop=crop,
        encode=encode,
        quality=quality,
        mode=mode,
        upscale=upscale,
        resample=resample,
        max_pixels=max_pixels,
    )
    options = {
        "shards": shards,
        "samples_per_shard": samples_per_shard,
        "shard_size": parse_size(shard_size),
        "compression": compression,
    }
    report = pack_folder(
        src,
        out,
        fmt,
        spec,
        workers=workers,
        engine=engine,
        options=options,
        on_error=on_error,
        order=order,
        seed=seed,
        force=force,
        resume=resume,
        quiet=quiet or as_json,
        ray_address=ray_address,
        storage_options=storage_options or None,
        dedup=dedup,
        near_distance=near_distance,
    )
    if as_json:
        emit_json({**asdict(report), "images_per_second": report.images_per_second})
    elif not quiet:
        click.echo(
            f"packed {report.packed} images into {report.out} ({report.format}, {report.shards} "
            f"shard(s), {human_bytes(report.bytes)}) in {report.seconds:.1f} s "
            f"({report.images_per_second:.0f} img/s); skipped {report.skipped}"
            + (f", upscaled {report.upscaled}" if report.upscaled else "")
        )
        for entry in report.skipped_files[:10]:
            click.echo(f"  skipped {entry['path']}: {entry['reason']}")
        if report.skipped > 10:
            click.echo(f"  ... and {report.skipped - 10} more (see `pack info {out} --json`)")


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
@click.option("--buckets", default=None, metavar="SIDE[,MULTIPLE[,MAX_RATIO]]",
              help="Also print the bucket plan of AspectBuckets(area=SIDE**2, multiple=..., max_ratio=...).")
@click.option("--batch-size", default=64, show_default=True, help="Batch size of the --buckets plan.")
@click.option("--world-size", default=1, show_default=True, help="Ranks of the --buckets plan.")
@storage_options_option
def info(dataset: str, as_json: bool, buckets: str | None, batch_size: int, world_size: int,
         storage_options: dict[str, Any]) -> None:  # fmt: skip
    """Describe the packed DATASET (a directory or URL)."""
    from packer.bucket_info import bucket_plan, describe_plan
    from packer.order_info import read_quality
    from readers.manifest import read_manifest
    from readers.remote import is_url

    manifest = read_manifest(dataset, storage_options or None)
    problem = None if is_url(dataset) else parts_problem(dataset)
    quality = None if problem else read_quality(dataset, storage_options=storage_options or None)
    plan = bucket_plan(dataset, buckets, batch_size, world_size) if buckets and not problem else None
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
    from packer.append import describe_versions
    from packer.order_info import describe_order
    from packer.views import describe_view

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
    from packer.verify import default_workers, verify_dataset

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
    from packer.reindex import reindex as rebuild

    written = rebuild(dataset)
    click.echo(f"{dataset}: wrote {len(written)} index file(s)")


def _register_optional_commands() -> None:
    """Commands that live in their own modules (bench) join the group when present.

    An entry is a click command or a function that builds one from the group."""
    import importlib

    for module_name, attr in (
        ("packer.bench.cli", "bench"),
        ("packer.imagelist_cli", "imagelist_command"),
        ("packer.coco_cli", "coco_command"),
        ("packer.webdataset_cli", "webdataset_command"),
        ("packer.parquet_cli", "parquet_command"),
        ("packer.show_cli", "show"),
        ("packer.doctor", "doctor"),
        ("packer.views_cli", "view_command"),
        ("packer.views_cli", "split_command"),
        ("packer.dups_cli", "dups"),
        ("packer.dups_cli", "overlap"),
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
